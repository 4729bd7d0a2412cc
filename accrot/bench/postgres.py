"""A throwaway PostgreSQL server from the installed server binaries (Debian's ``/usr/lib/postgresql/N/bin``).

Its data folder lives in a temporary directory, it listens on 127.0.0.1 only (and a socket in that folder), it
trusts local connections, and it is stopped by its postmaster's PID. PostgreSQL refuses to run as root: started
by root, it runs as the ``postgres`` user (``runuser``). ``accrot bench storage`` measures on one; the tests'
PostgreSQL servers are these.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from accrot.errors import UsageError

DATABASE = "accrot"


def find_bindir() -> Path | None:
    """The newest installed PostgreSQL's server binaries, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def missing() -> str | None:
    """Why no server can be started here (one line), or None."""
    if find_bindir() is None:
        return "PostgreSQL's server binaries were not found under /usr/lib/postgresql/*/bin (apt-get install postgresql)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses root and cannot be started as the postgres user"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """``with PostgresServer() as pg: pg.url`` — a fresh server and an empty database ``accrot``.

    ``max_connections``: PostgreSQL's limit (its default is 100); ``restart()`` is ``pg_ctl restart -m fast``."""

    def __init__(self, max_connections: int = 100) -> None:
        self.max_connections = max_connections
        self.bindir = find_bindir()
        self.port = _free_port()
        self.base: Path | None = None
        self._server: subprocess.Popen | None = None
        self._as_user: list[str] = []

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def data(self) -> Path:
        return self.base / "data"

    def _run(self, *cmd: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([*self._as_user, *cmd], check=True, capture_output=True, **kwargs)

    def start(self, timeout: float = 60.0) -> PostgresServer:
        why = missing()
        if why is not None:
            raise UsageError(why)
        if os.geteuid() == 0:
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self.base = Path(tempfile.mkdtemp(prefix="accrot-pg-"))
        if self._as_user:
            shutil.chown(self.base, "postgres", "postgres")
        sock = self.base / "sock"
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._run("mkdir", str(sock))
        self._server = subprocess.Popen(
            [*self._as_user, str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(sock),
             "-c", "listen_addresses=127.0.0.1", "-c", f"max_connections={self.max_connections}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._wait_ready(timeout)
            self._run(str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", DATABASE)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while subprocess.run([str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                             capture_output=True).returncode != 0:
            if self._server is not None and self._server.poll() is not None:
                raise RuntimeError(f"postgres exited at start (status {self._server.returncode}); data in {self.data}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not accept connections within {timeout:.0f} s")
            time.sleep(0.2)

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is dropped, the server is back when this returns. The new
        postmaster inherits no pipe of ours (a caller waiting for its output would wait forever)."""
        subprocess.run([*self._as_user, str(self.bindir / "pg_ctl"), "restart", "-D", str(self.data), "-m", "fast",
                        "-w", "-t", "60"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)

    def query(self, sql: str) -> list[str]:
        """The rows of one ``psql`` query on the database (fields separated by ``|``); no connection stays open."""
        out = subprocess.run([str(self.bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                              "-d", DATABASE, "-At", "-c", sql], capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.splitlines()

    # client connections to the database, this query's own left out
    CONNECTIONS = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                   "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")

    def connections(self) -> int:
        """Client connections to the database right now (``pg_stat_activity``)."""
        return int(self.query(self.CONNECTIONS)[0])

    def version(self) -> str:
        return self.query("SHOW server_version")[0].split()[0]

    def stop(self) -> None:
        """Fast shutdown by the postmaster's PID (SIGINT), SIGKILL after 60 s; the data folder is removed."""
        if self.base is None:
            return
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError, ProcessLookupError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)  # a restarted postmaster is not our child
        if self._server is not None:
            try:
                self._server.wait(60)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
        deadline = time.monotonic() + 60
        while pid_file.exists() and time.monotonic() < deadline:  # a restarted postmaster removes it on exit
            time.sleep(0.1)
        shutil.rmtree(self.base, ignore_errors=True)
        self.base = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
