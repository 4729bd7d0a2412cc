"""The budget lock of workers that reach their storage through accrot's storage proxy (``grpc://HOST:PORT``).

Workers behind the proxy have no file and no database connection to lock, so the proxy serves the lock beside
Optuna's storage service, on the same port: a second gRPC service, ``accrot.BudgetLock``, whose three unary
methods take and return JSON (no generated code):

* ``Acquire {name, token, renew}`` -> ``{granted}``: a *lease* on the lock ``name`` for :data:`LEASE` seconds. It
  never blocks a server thread: a refused client backs off and asks again. The holder renews every LEASE/3 s
  (``renew: true``), so a worker that dies while holding the lock frees it within one lease;
* ``Release {name, token}``;
* ``Hello {}`` -> the proxy's storage (redacted): workers check that they talk to accrot's proxy, which has the
  lock, and not to a bare ``optuna.storages.run_grpc_proxy_server`` (which would let N workers overshoot the
  budget).

The proxy backs each granted name with its storage's own lock (``pg_try_advisory_lock`` on PostgreSQL, a file
lock next to SQLite; :class:`accrot.sweep.storage.BudgetLock`), so workers that reach the database directly, and
workers of a second proxy, are excluded too; the database drops the lock when the proxy dies.

A restarted proxy has forgotten its grants, while the worker that held the lock may still be inside its budget
check (its storage calls ride out the outage). For its first :data:`LEASE` seconds a fresh proxy grants only
renewals (a holder reclaiming its lock), so no second worker enters while the first is still inside.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SERVICE = "accrot.BudgetLock"
LEASE = 6.0  # seconds a grant lasts unless renewed; holders renew every LEASE / 3
RPC_TIMEOUT = 10.0  # seconds a lock call waits for the proxy before it counts as unavailable


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# ---------------------------------------------------------------------------------------------------
# the proxy's side
# ---------------------------------------------------------------------------------------------------
@dataclass
class _Grant:
    token: str
    expires: float
    lock: Any  # the storage's own lock, held while the name is granted


class LeaseTable:
    """The leases one proxy has granted. ``backend(name)`` makes the storage's lock for ``name`` (an object
    with ``try_acquire() -> bool`` and ``release()``)."""

    def __init__(self, backend: Callable[[str], Any], lease: float = LEASE, clock: Callable[[], float] = time.monotonic):
        self.backend, self.lease, self.clock = backend, lease, clock
        self._held: dict[str, _Grant] = {}
        self._mutex = threading.Lock()
        self._quiet_until = clock() + lease  # renewals only: a holder from before a restart may still be inside

    def acquire(self, name: str, token: str, renew: bool = False) -> bool:
        now = self.clock()
        with self._mutex:
            grant = self._held.get(name)
            if grant is not None and grant.token != token and grant.expires > now:
                return False
            if grant is None:
                if now < self._quiet_until and not renew:
                    return False
                lock = self.backend(name)
                if not lock.try_acquire():  # a worker on the database directly, or another proxy, holds it
                    return False
                grant = self._held[name] = _Grant(token, now, lock)
            grant.token, grant.expires = token, now + self.lease  # (an expired grant passes to the new holder)
            return True

    def release(self, name: str, token: str) -> None:
        with self._mutex:
            grant = self._held.get(name)
            if grant is None or grant.token != token:
                return
            del self._held[name]
        grant.lock.release()

    def reap(self) -> int:
        """Release the storage lock of every expired grant (a holder that died); how many."""
        now = self.clock()
        with self._mutex:
            expired = [name for name, g in self._held.items() if g.expires <= now]
            grants = [self._held.pop(name) for name in expired]
        for grant in grants:
            with contextlib.suppress(Exception):
                grant.lock.release()
        return len(grants)

    def release_all(self) -> None:
        with self._mutex:
            grants, self._held = list(self._held.values()), {}
        for grant in grants:
            with contextlib.suppress(Exception):
                grant.lock.release()


def lock_handler(table: LeaseTable, hello: dict[str, Any]):
    """The ``accrot.BudgetLock`` service, for ``grpc.Server.add_generic_rpc_handlers``."""
    import grpc

    def unary(fn):
        return grpc.unary_unary_rpc_method_handler(lambda request, context: fn(request),
                                                   request_deserializer=json.loads, response_serializer=_dumps)

    return grpc.method_handlers_generic_handler(SERVICE, {
        "Acquire": unary(lambda r: {"granted": table.acquire(str(r["name"]), str(r["token"]), bool(r.get("renew")))}),
        "Release": unary(lambda r: table.release(str(r["name"]), str(r["token"])) or {}),
        "Hello": unary(lambda r: hello),
    })


# ---------------------------------------------------------------------------------------------------
# the worker's side
# ---------------------------------------------------------------------------------------------------
class ProxyLock:
    """The budget lock ``name`` as a lease from the proxy at ``host:port``: ``acquire()`` waits for the grant,
    a thread renews it while held, ``release()`` hands it back (idempotent, never raises)."""

    def __init__(self, host: str, port: int, name: str) -> None:
        self.address, self.name = f"{host}:{port}", name
        self._channel: Any = None
        self._calls: dict[str, Any] = {}
        self._token: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = 0  # renewals the proxy refused (it restarted and another worker got in first)

    def _call(self, method: str, request: dict[str, Any]) -> dict[str, Any]:
        if self._channel is None:
            import grpc

            self._channel = grpc.insecure_channel(self.address)
            self._calls = {m: self._channel.unary_unary(f"/{SERVICE}/{m}", request_serializer=_dumps,
                                                        response_deserializer=json.loads)
                           for m in ("Acquire", "Release", "Hello")}
        return self._calls[method](request, timeout=RPC_TIMEOUT)

    def hello(self) -> dict[str, Any]:
        return self._call("Hello", {})

    def acquire(self) -> None:
        token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        delay = 0.005
        while not self._call("Acquire", {"name": self.name, "token": token})["granted"]:
            time.sleep(delay)
            delay = min(1.5 * delay, 0.1)  # refused: another worker is inside; ask again soon, never in a burst
        self._token = token
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, args=(token,), daemon=True)
        self._renewer.start()

    def _renew(self, token: str) -> None:
        while not self._stop.wait(LEASE / 3):
            try:
                granted = self._call("Acquire", {"name": self.name, "token": token, "renew": True})["granted"]
            except Exception:  # noqa: BLE001 - the proxy is restarting: renew at the next beat
                continue
            if not granted:
                self.lost += 1
                print(f"budget lock {self.name!r}: the proxy at {self.address} gave it to another worker "
                      "(it restarted while this worker held it)", flush=True)
                return

    def release(self) -> None:
        token, self._token = self._token, None
        if token is None:
            return
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        with contextlib.suppress(Exception):  # an unreachable proxy lets the lease expire instead
            self._call("Release", {"name": self.name, "token": token})

    def close(self) -> None:
        self.release()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
