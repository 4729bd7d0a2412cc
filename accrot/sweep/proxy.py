"""``accrot storage-proxy --storage postgresql://... [--host 0.0.0.0] [--port 13000]``: Optuna's gRPC storage proxy
in front of a sweep's database, with accrot's budget lock beside it (:mod:`accrot.sweep.lease`).

Every worker on the database directly holds its own connections (about 3: its pool, Optuna's heartbeat, the
budget lock; PostgreSQL allows 100 by default); Optuna's distributed-optimization guide puts its gRPC proxy in
front of the database once workers are many. Behind the proxy, workers (``--storage grpc://HOST:PORT``) hold no
database connection: the proxy holds a few and serves reads from Optuna's trial cache
(``optuna.storages.get_storage``). ``accrot bench storage`` measures both. It serves
RDB storages only (Optuna's proxy cannot serve a journal file).

``--address_file FILE`` writes ``HOST:PORT`` once the proxy listens (``accrot slurm sweep --proxy`` hands it to
the workers that way); ``--until_done NAME`` stops the proxy once every study of sweep NAME has spent its budget
with no trial running or queued (after :data:`LINGER` seconds, so that the last workers finish their last reads).
SIGTERM or Ctrl-C stop it; the address file goes with it.

References: Optuna, "Distributed optimization" and ``optuna.storages.run_grpc_proxy_server`` (Optuna ≥ 4.2).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

from accrot.errors import UsageError
from accrot.options import count, option, parse, text, write_file
from accrot.sweep.lease import LeaseTable, lock_handler
from accrot.sweep.recovery import budget_state
from accrot.sweep.storage import (
    STORAGE,
    BudgetLock,
    StorageRef,
    creation_lock,
    open_storage,
    redact,
    require_grpc,
)

DEFAULT_PORT = 13000  # Optuna's
LINGER = 30.0  # seconds --until_done waits after the sweep is done before stopping
_HOST = re.compile(r"^[A-Za-z0-9_.:-]+$")


def _parser():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="accrot storage-proxy", exit_on_error=False, description=__doc__)
    option(parser, "--storage", kind=STORAGE, type=str | None, default=None,
                        help="the database: postgresql://USER@HOST/DB (or sqlite:///PATH); default: "
                             "$ACCROT_SWEEP_STORAGE")
    option(parser, "--host", kind=text("an address to listen on"), type=str, default="0.0.0.0", help="address to listen on (127.0.0.1: this machine only)")
    option(parser, "--port", kind=count(0, 65535), type=int, default=DEFAULT_PORT, help="port to listen on (0: any free port)")
    option(parser, "--advertise", kind=text("an address workers reach"), type=str | None, default=None,
                        help="the host name workers reach the proxy by (default: --host, or this machine's name)")
    option(parser, "--threads", kind=count(1, 4096), type=int, default=32, help="server threads (requests served at once)")
    option(parser, "--address_file", kind=write_file("a file for the address"), type=str | None, default=None,
                        help="write HOST:PORT here once listening (removed when the proxy stops)")
    option(parser, "--until_done", kind=text("a study name"), type=str | None, default=None,
                        help="stop once every study of this sweep has spent its budget and nothing runs")
    return parser


def check_servable(ref: StorageRef) -> None:
    """A one-line UsageError for a storage the proxy cannot serve: a journal file, another proxy."""
    if ref.kind == "journal":
        raise UsageError(f"storage {ref.url!r} is a journal file, which Optuna's storage proxy cannot serve; put the "
                         "study in PostgreSQL (postgresql://USER@HOST/DB) to serve it through the proxy")
    if ref.kind == "grpc":
        raise UsageError(f"storage {ref.url!r} is a storage proxy already; give the proxy its database "
                         "(postgresql://USER@HOST/DB)")


def _check(args, ref: StorageRef) -> None:
    check_servable(ref)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port={args.port} is not valid; use 1 to 65535 (0: any free port)")
    if args.threads < 1:
        raise UsageError(f"--threads={args.threads} is not valid; use an integer >= 1")
    for name in ("host", "advertise"):
        value = getattr(args, name)
        if value is not None and not _HOST.match(value):
            raise UsageError(f"--{name}={value!r} is not valid; pass a host name or an IP address")
    if args.address_file is not None and not Path(args.address_file).absolute().parent.is_dir():
        raise UsageError(f"--address_file={args.address_file!r}: folder "
                         f"{str(Path(args.address_file).absolute().parent)!r} does not exist")


def _bind_check(host: str, port: int) -> int:
    """``port`` (a free one for 0) if nothing listens on ``host:port``; gRPC itself binds with SO_REUSEPORT, so a
    second proxy on a taken port would silently share it with the first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # the connections of a proxy that just died linger in TIME_WAIT: they must not keep its successor off the port
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise UsageError(f"cannot listen on {host}:{port} ({err.strerror}); pass another --port (0: any free "
                             "port) or --host") from None
        return probe.getsockname()[1]


def start_proxy(ref: StorageRef, host: str, port: int, threads: int = 32):
    """Open the database (creating Optuna's schema), start the proxy and the lock service on ``host:port``.
    Returns ``(server, lease table, backend storage)``; ``server.stop(grace)`` stops it."""
    from concurrent.futures import ThreadPoolExecutor

    import optuna
    from optuna.storages._grpc.server import make_server  # run_grpc_proxy_server's server, before it blocks

    with creation_lock(ref, "storage-proxy"):
        rdb = open_storage(ref, create=True)
    backend = optuna.storages.get_storage(rdb)  # Optuna's trial cache in front of the database
    table = LeaseTable(lambda name: BudgetLock(ref, name))
    server = make_server(backend, host, port, ThreadPoolExecutor(max_workers=threads, thread_name_prefix="proxy"))
    server.add_generic_rpc_handlers((lock_handler(table, {"storage": redact(ref.url)}),))
    server.start()
    return server, table, backend


def sweep_done(storage, name: str) -> bool:
    """Every study of sweep ``name`` (there is one) has spent its budget, and no trial runs or waits."""
    studies = [s for s in storage.get_all_studies() if s.user_attrs.get("accrot", {}).get("spec") == name]
    for s in studies:
        counted, waiting, running = budget_state(None, storage.get_all_trials(s._study_id, deepcopy=False))
        if counted < s.user_attrs["accrot"].get("budget", 0) or waiting or running:
            return False
    return bool(studies)


def main(argv: list[str]) -> int:
    """``accrot storage-proxy --storage URL [--host H] [--port P] [--address_file F] [--until_done NAME]``"""
    args = parse(_parser(), argv)
    url = args.storage or os.environ.get("ACCROT_SWEEP_STORAGE")
    if not url:
        raise UsageError("accrot storage-proxy needs the database it serves: --storage postgresql://USER@HOST/DB "
                         "(or ACCROT_SWEEP_STORAGE)")
    ref = StorageRef.parse(url, "storage-proxy", ".")
    _check(args, ref)
    require_grpc("accrot storage-proxy")
    port = _bind_check(args.host, args.port)
    server, table, backend = start_proxy(ref, args.host, port, args.threads)
    advertise = args.advertise or (socket.gethostname() if args.host in ("0.0.0.0", "::") else args.host)
    address = f"{advertise}:{port}"
    if args.address_file:
        from accrot.io import atomic_write_text

        atomic_write_text(args.address_file, address + "\n")
    print(f"storage proxy for {redact(ref.url)} listening on {args.host}:{port}; workers: --storage grpc://{address}",
          flush=True)
    try:
        _serve(table, backend, args.until_done)
    finally:
        server.stop(grace=2).wait()
        table.release_all()
        if args.address_file:
            with contextlib.suppress(OSError):
                if Path(args.address_file).read_text().strip() == address:  # not a successor's
                    Path(args.address_file).unlink()
    print("storage proxy stopped", flush=True)
    return 0


def _serve(table: LeaseTable, backend, until_done: str | None) -> None:
    """Until SIGTERM / Ctrl-C, or ``until_done``'s sweep is done: release the leases of dead holders every second."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    done_since, next_check = None, 0.0
    while not stop.wait(1.0):
        table.reap()
        if until_done is None or time.monotonic() < next_check:
            continue
        next_check = time.monotonic() + 5.0
        try:
            done = sweep_done(backend, until_done)
        except Exception:  # noqa: BLE001 - the database is restarting: ask again later
            continue
        done_since = (done_since or time.monotonic()) if done else None
        if done_since is not None and time.monotonic() - done_since >= LINGER:
            print(f"sweep {until_done} is done", flush=True)
            return
