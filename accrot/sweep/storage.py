"""Optuna storages (SQLite by default, PostgreSQL, journal files, accrot's storage proxy at ``grpc://HOST:PORT``):
opening them with retries and heartbeats, a creation lock, transient-error handling and the storage-wide budget
lock.

Which storage when (Optuna's "distributed optimization" guide): SQLite on one machine; PostgreSQL (an RDB server)
for a cluster; its gRPC storage proxy (``accrot storage-proxy``, :mod:`accrot.sweep.proxy`) in front of it once
the workers are many, since every worker on the database directly holds its own connections; a journal file
only on a local disk (appends to one file from many nodes over NFS can be lost or interleaved, and the proxy
cannot serve a journal)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from accrot.errors import UsageError, one_line
from accrot.options import Kind
from accrot.sweep.recovery import RetryTrial
from accrot.sweep.spec import HeartbeatSpec, quiet_experimental

# ---------------------------------------------------------------------------------------------------
# storages
# ---------------------------------------------------------------------------------------------------


def redact(url: str) -> str:
    """A storage URL without its password (for messages and logs)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _pg_driver() -> str:
    """``psycopg`` (3) when installed, else ``psycopg2`` (the pinned dev extra), else psycopg for the error."""
    import importlib.util

    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return driver
    return "psycopg"


_GRPC = re.compile(r"^grpc://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})/?$")
PROXY_WAIT = 10.0  # seconds a worker waits for the storage proxy to answer before it is unreachable


def require_grpc(what: str) -> None:
    """A one-line UsageError when grpcio (Optuna's proxy and its client need it) is not installed."""
    import importlib.util

    if importlib.util.find_spec("grpc") is None:
        raise UsageError(f"{what} needs grpcio, which is not installed; pip install grpcio (accrot's install "
                         "pins it: make install)")


@dataclass
class StorageRef:
    url: str
    kind: str  # sqlite | postgresql | journal | grpc
    path: Path | None = None
    host: str | None = None  # grpc: the storage proxy
    port: int | None = None

    @property
    def attr_heartbeat(self) -> bool:
        """Workers record their own heartbeat as a trial attribute: Optuna's heartbeat lives in an RDB storage
        opened in the worker's process, which a journal file and the proxy's client are not."""
        return self.kind in ("journal", "grpc")

    @classmethod
    def parse(cls, url: str | None, name: str, root: str | Path) -> StorageRef:
        """``url``, or the default SQLite file ``<root>/<name>/study.db`` when it is empty."""
        if not url:
            path = (Path(root) / name / "study.db").resolve()
            return cls(f"sqlite:///{path}", "sqlite", path)
        if url.startswith("sqlite:///"):
            path = Path(url[len("sqlite:///"):])
            if url[len("sqlite:///"):].strip() in ("", ":memory:"):
                raise UsageError(f"storage {url!r} is not valid; workers need a file: sqlite:///PATH")
            return cls(f"sqlite:///{path.resolve()}", "sqlite", path.resolve())
        if re.match(r"^postgres(ql)?(\+\w+)?://", url):
            url = re.sub(r"^postgres(ql)?", "postgresql", url)
            if url.startswith("postgresql://"):  # no driver named: the installed one (SQLAlchemy 2.1 assumes psycopg 3)
                url = f"postgresql+{_pg_driver()}://" + url[len("postgresql://"):]
            return cls(url, "postgresql")
        if url.startswith("journal://"):
            if not url[len("journal://"):].startswith("/"):  # relative to whichever folder each worker starts in
                raise UsageError(f"storage {url!r} names a relative file; write journal:///ABS/PATH.log (three "
                                 "slashes: workers on other machines or folders must find the same file)")
            path = Path(url[len("journal://"):]).resolve()
            return cls(f"journal://{path}", "journal", path)
        if url.startswith("grpc://"):
            found = _GRPC.match(url)
            if found is None or not 0 < int(found["port"]) < 65536:
                raise UsageError(f"storage {url!r} is not valid; write grpc://HOST:PORT with a port from 1 to 65535 "
                                 "(the address `accrot storage-proxy` prints)")
            host, port = found["host"], int(found["port"])
            return cls(f"grpc://{host}:{port}", "grpc", host=host, port=port)
        raise UsageError(f"storage {redact(url)!r} is not supported; use sqlite:///PATH, "
                         "postgresql://USER@HOST[:PORT]/DB, grpc://HOST:PORT (accrot storage-proxy) or "
                         "journal:///ABS/PATH.log")

    @property
    def dashboard(self) -> str:
        """The storage argument optuna-dashboard takes (it cannot read through the proxy: its database then)."""
        return str(self.path) if self.kind == "journal" else self.url


def open_storage(ref: StorageRef, heartbeat: HeartbeatSpec | None = None, retries: int = 0,
                 create: bool = False):
    """The Optuna storage of ``ref``; UsageError if it cannot be reached (before any trial starts)."""

    try:
        if ref.kind == "journal":
            return _journal(ref, create)
        if ref.kind == "grpc":
            return _proxy(ref)
        engine = _rdb_engine(ref, create)
        kwargs: dict[str, Any] = {}
        if heartbeat is not None:
            kwargs = {"heartbeat_interval": heartbeat.interval, "grace_period": heartbeat.grace,
                      "heartbeat_stale_trial_callback": RetryTrial(retries, reason="stopped sending heartbeats")}
        storage = _rdb(ref.url, engine, create, kwargs)
        if ref.kind == "sqlite":
            import sqlite3

            with contextlib.closing(sqlite3.connect(ref.path, timeout=120)) as con:
                con.execute("PRAGMA journal_mode=WAL")  # readers (dashboard, parent) never block the writer
        return storage
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 - OSError, sqlalchemy errors, psycopg2 errors: all unreachable
        raise unreachable(ref, err) from None


def _rdb(url: str, engine: dict[str, Any], create: bool, kwargs: dict[str, Any]):
    """Only the parent creates the schema (under the creation lock); a reader (a worker, ``accrot report``, the
    dashboard) never does. A reader that opened the storage while the parent created it may have written the
    schema's version row first: the parent then finds the schema made and opens it again."""
    from sqlalchemy.exc import IntegrityError, OperationalError

    def open_it():
        with quiet_experimental():
            return _storage_class()(url, engine_kwargs=engine, skip_table_creation=not create, **kwargs)

    try:
        return open_it()
    except (IntegrityError, OperationalError) as err:
        if not create or not any(s in str(err) for s in ("alembic_version", "already exists")):
            raise
        time.sleep(0.5)
        return open_it()


@functools.cache
def _storage_class():
    """Optuna's RDBStorage whose heartbeat outlives a storage outage. Optuna records heartbeats in a thread
    that dies at the first error, so one database restart would silence every running trial for good and, a
    grace period later, another worker would fail and retry trials that are still training. Here a beat
    missed to a transient error is skipped; the next one is recorded once the server is back."""
    from optuna.storages import RDBStorage

    class OutageTolerantRDBStorage(RDBStorage):
        def record_heartbeat(self, trial_id: int) -> None:
            try:
                super().record_heartbeat(trial_id)
            except Exception as err:
                if not transient(err):
                    raise

    return OutageTolerantRDBStorage


def _journal(ref: StorageRef, create: bool):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if not ref.path.parent.is_dir():
        if not create:
            raise OSError(f"directory {ref.path.parent} does not exist")
        ref.path.parent.mkdir(parents=True, exist_ok=True)
    if not create and not ref.path.is_file():
        raise OSError(f"{ref.path} does not exist")
    return JournalStorage(JournalFileBackend(str(ref.path)))


def _proxy(ref: StorageRef):
    """Optuna's client of the storage proxy at ``ref``, once the proxy answers as accrot's (it serves the lock)."""
    require_grpc(f"storage {ref.url!r}")
    from optuna.storages import GrpcStorageProxy

    from accrot.sweep.lease import ProxyLock

    with quiet_experimental():
        storage = GrpcStorageProxy(host=ref.host, port=ref.port)
    try:
        storage.wait_server_ready(timeout=PROXY_WAIT)
    except ConnectionError:
        storage.close()
        raise OSError(f"no storage proxy answered at {ref.host}:{ref.port} within {PROXY_WAIT:.0f} s; start one "
                      "there with `accrot storage-proxy --storage postgresql://...`") from None
    lock = ProxyLock(ref.host, ref.port, "hello")
    try:
        lock.hello()  # a bare Optuna proxy answers UNIMPLEMENTED (see unreachable)
    except Exception:
        storage.close()
        raise
    finally:
        lock.close()
    return storage


def _rdb_engine(ref: StorageRef, create: bool) -> dict[str, Any]:
    """SQLAlchemy engine options: SQLite waits for the writer instead of "database is locked"; a server is pinged."""
    if ref.kind == "sqlite":
        if not ref.path.is_file() and not create:
            raise OSError(f"{ref.path} does not exist")
        ref.path.parent.mkdir(parents=True, exist_ok=True)
        return {"connect_args": {"timeout": 120}}
    return {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}


def unreachable(ref: StorageRef, err: BaseException) -> UsageError:
    reason = one_line(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
    grpc = sys.modules.get("grpc")
    if grpc is not None and isinstance(err, grpc.RpcError) and hasattr(err, "details"):  # the proxy's client
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:  # Optuna's own proxy: no accrot.BudgetLock service
            return UsageError(f"storage {ref.url!r} is an Optuna storage proxy without accrot's budget lock (its "
                              "workers would overshoot the budget); serve the database with `accrot storage-proxy`")
        reason = (f"no storage proxy answered at {ref.host}:{ref.port} ({one_line(err.details() or '')[:160]}); "
                  "start one there with `accrot storage-proxy --storage postgresql://...`")
    if "readonly database" in reason or "read-only" in reason.lower():  # SQLite on a read-only file or filesystem
        return UsageError(f"storage {redact(ref.url)!r} is read-only (Optuna writes to a storage when it opens one, "
                          "even to read it); copy the database to a writable folder and pass that as --storage")
    return UsageError(f"storage {redact(ref.url)!r} is unreachable: {reason}")


@contextlib.contextmanager
def creation_lock(ref: StorageRef, name: str) -> Iterator[None]:
    """One parent at a time creates the schema and the studies: two sweeps started at once on a fresh storage
    would race on ``CREATE TABLE`` (the same storage-wide lock as the budget's)."""
    lock = BudgetLock(ref, name)
    try:
        if ref.path is not None:
            ref.path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 - what stops the lock stops the storage: unreachable
        raise unreachable(ref, err) from None
    try:
        yield
    finally:
        lock.release()


TRANSIENT_GRACE = 180.0  # seconds the parent keeps retrying a storage that went away (a database restart)


_DATABASE_ERRORS = ("OperationalError", "InterfaceError", "DisconnectionError", "StorageInternalError")


def transient(err: BaseException) -> bool:
    """A storage error that a retry may cure: a dropped connection, a restarting server, a locked SQLite, a
    storage proxy that is restarting (or whose database is)."""
    import sqlalchemy.exc

    if isinstance(err, (optuna.exceptions.StorageInternalError, sqlalchemy.exc.OperationalError,
                        sqlalchemy.exc.InterfaceError, sqlalchemy.exc.DisconnectionError)):
        return True
    grpc = sys.modules.get("grpc")  # imported by the proxy's client, if this process has one
    if grpc is None or not isinstance(err, grpc.RpcError) or not hasattr(err, "code"):
        return False
    code = err.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return True
    # the proxy's storage raised (its database restarting): Optuna's servicer returns UNKNOWN with the error's name
    return code == grpc.StatusCode.UNKNOWN and any(name in (err.details() or "") for name in _DATABASE_ERRORS)


def retry_storage(fn, what: str, console=None, grace: float = TRANSIENT_GRACE):
    """``fn()``, retried with backoff while the storage is briefly unavailable (up to ``grace`` seconds)."""
    deadline, delay = None, 0.5
    while True:
        try:
            return fn()
        except Exception as err:
            if not transient(err):
                raise
            now = time.time()
            if deadline is None:
                deadline = now + grace
                if console is not None:
                    console.print(f"[yellow]storage unavailable ({what}: {type(err).__name__}); retrying for up to "
                                  f"{grace:.0f} s[/]")
            if now > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 5.0)


class BudgetLock:
    """A storage-wide lock held from the budget check until the new trial exists (so N workers never
    overshoot ``trials``): fcntl next to SQLite, Optuna's NFS-safe symlink lock next to a journal file
    (forcibly released after 30 s if its holder died), a PostgreSQL advisory lock (released with its
    connection), a lease from accrot's storage proxy (:mod:`accrot.sweep.lease`). ``release`` is idempotent."""

    def __init__(self, ref: StorageRef, name: str) -> None:
        self.ref, self.name = ref, name
        self._held = False
        self._handle: Any = None
        self._proxy = None
        if ref.kind == "grpc":
            from accrot.sweep.lease import ProxyLock

            require_grpc(f"storage {ref.url!r}")
            self._proxy = ProxyLock(ref.host, ref.port, name)

    def acquire(self) -> None:
        """Wait for the lock."""
        self._take(wait=True)

    def try_acquire(self) -> bool:
        """Take the lock if it is free, else False at once (SQLite and PostgreSQL: what the proxy's leases hold)."""
        if self.ref.kind not in ("sqlite", "postgresql"):
            raise ValueError(f"no non-blocking budget lock on a {self.ref.kind} storage")
        return self._take(wait=False)

    def _take(self, wait: bool) -> bool:
        if self.ref.kind == "grpc":
            self._proxy.acquire()
        elif self.ref.kind == "sqlite":
            if not self._flock(wait):
                return False
        elif self.ref.kind == "journal":
            from optuna.storages.journal import JournalFileSymlinkLock

            self._handle = JournalFileSymlinkLock(f"{self.ref.path}.budget")
            self._handle.acquire()
        elif not self._advisory(wait):
            return False
        self._held = True
        return True

    def _flock(self, wait: bool) -> bool:
        import fcntl

        handle = open(f"{self.ref.path}.budget-lock", "a")  # noqa: SIM115 - held across calls
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._handle = handle
        return True

    def _advisory(self, wait: bool) -> bool:
        import sqlalchemy
        from sqlalchemy.pool import NullPool

        key = int.from_bytes(hashlib.sha1(f"accrot-sweep:{self.name}".encode()).digest()[:8], "big", signed=True)
        engine = sqlalchemy.create_engine(self.ref.url, poolclass=NullPool, connect_args={"connect_timeout": 10})
        conn = engine.connect()
        if wait:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
        elif not conn.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
            conn.close()
            engine.dispose()
            return False
        self._handle = (engine, conn, key)
        return True

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        if self.ref.kind == "grpc":
            self._proxy.release()
        elif self.ref.kind == "sqlite":
            self._handle.close()  # closing the descriptor drops the flock
        elif self.ref.kind == "journal":
            self._handle.release()
        else:
            import sqlalchemy

            engine, conn, key = self._handle
            with contextlib.suppress(Exception):
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.close()
            engine.dispose()
        self._handle = None


def _check_storage(flag: str, value) -> None:
    if not str(value).strip():
        raise UsageError(f"{flag}={value!r} is empty; give a storage URL (sqlite:///PATH, postgresql://..., "
                         "grpc://HOST:PORT, journal:///ABS/PATH.log) or leave the option out")
    try:
        StorageRef.parse(str(value), "study", ".")
    except UsageError as err:
        raise UsageError(f"{flag}: {err}") from None


STORAGE = Kind("storage", _check_storage, ("bogus://x", "", "sqlite:///", "grpc://host:99999", "journal://rel.log"),
               "a storage URL")
