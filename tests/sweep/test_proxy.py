"""The storage proxy: its budget-lock leases (a fake clock over a real storage lock), ``grpc://`` URLs, and sweep
workers through a real ``accrot storage-proxy`` in front of a real PostgreSQL server spending a budget exactly.

The load under kills (a worker, the proxy itself) is ``accrot bench storage``'s (tests/bench/test_bench.py runs it)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import optuna
import pytest
import yaml

from accrot.bench.storage import spec_doc
from accrot.sweep.lease import LEASE, LeaseTable, ProxyLock
from accrot.sweep.storage import BudgetLock, StorageRef, open_storage, transient


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def table(tmp_path):
    """Leases over SQLite's budget lock (a real flock beside a real file), on a clock the test moves."""
    ref = StorageRef.parse(f"sqlite:///{tmp_path / 'study.db'}", "s", tmp_path)
    clock = Clock()
    table = LeaseTable(lambda name: BudgetLock(ref, name), clock=clock)
    clock.now += LEASE  # past the quiet period of a fresh proxy
    yield table, clock, ref
    table.release_all()


def test_a_lease_is_exclusive_until_released_or_expired(table):
    table, clock, _ = table
    assert table.acquire("s", "a") and not table.acquire("s", "b")
    table.release("s", "b")  # not b's: nothing happens
    assert not table.acquire("s", "b")
    clock.now += LEASE / 2
    assert table.acquire("s", "a", renew=True)  # a renews ...
    clock.now += LEASE / 2 + 0.1
    assert not table.acquire("s", "b")  # ... so it still holds it past the first lease
    table.release("s", "a")
    assert table.acquire("s", "b")
    clock.now += LEASE + 0.1  # b died holding it: its lease expires
    assert table.acquire("s", "c")


def test_a_granted_lease_holds_the_storage_lock_and_reap_frees_it(table):
    table, clock, ref = table
    outside = BudgetLock(ref, "s")  # a worker on the database directly
    assert table.acquire("s", "a")
    assert not outside.try_acquire()
    clock.now += LEASE + 0.1
    assert table.reap() == 1  # the holder died: the database's lock goes too
    assert outside.try_acquire()
    assert not table.acquire("s", "b")  # now the direct worker holds it: the proxy cannot grant it
    outside.release()
    assert table.acquire("s", "b")


def test_a_fresh_proxy_grants_only_renewals_for_one_lease(tmp_path):
    """After a restart, the worker that held the lock before may still be inside its budget check."""
    ref = StorageRef.parse(f"sqlite:///{tmp_path / 'study.db'}", "s", tmp_path)
    clock = Clock()
    table = LeaseTable(lambda name: BudgetLock(ref, name), clock=clock)
    try:
        assert not table.acquire("s", "new")
        assert table.acquire("s", "old", renew=True) and not table.acquire("s", "new")
        table.release("s", "old")
        clock.now += LEASE
        assert table.acquire("s", "new")
    finally:
        table.release_all()


def test_grpc_urls():
    ref = StorageRef.parse("grpc://node7:13000", "s", "/r")
    assert (ref.kind, ref.host, ref.port, ref.url, ref.attr_heartbeat) == ("grpc", "node7", 13000, "grpc://node7:13000",
                                                                        True)
    assert StorageRef.parse("grpc://[::1]:5/", "s", "/r").host == "[::1]"
    assert not StorageRef.parse("postgresql://u@h/db", "s", "/r").attr_heartbeat


def test_a_proxy_that_is_down_is_a_transient_error():
    from tests.test_bad_inputs import free_port

    lock = ProxyLock("127.0.0.1", free_port(), "s")
    with pytest.raises(grpc.RpcError) as err:
        lock.hello()
    lock.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and transient(err.value)
    assert not transient(ValueError("no"))


@pytest.mark.integration
def test_workers_through_the_proxy_spend_the_budget_exactly(postgres, tmp_path):
    """Three workers (accrot's worker, a trivial objective) on a real proxy in front of a real PostgreSQL: every
    trial of the budget completes once, none over it, each beat through the proxy, and the proxy's --until_done
    sees the sweep done."""
    from accrot.sweep.parent import create_studies
    from accrot.sweep.proxy import sweep_done
    from accrot.sweep.recovery import account, budget_state
    from accrot.sweep.spec import load_spec
    from accrot.sweep.trials import check_stratum
    from tests.test_bad_inputs import free_port

    name, budget = "proxied", 15
    spec_path = tmp_path / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump(spec_doc(name, budget), sort_keys=False))
    spec = load_spec(spec_path)
    ref = StorageRef.parse(postgres, name, tmp_path)
    storage = open_storage(ref, create=True)
    create_studies(spec, storage, {s.variant: check_stratum(spec, s) for s in spec.strata()})
    port, address = free_port(), tmp_path / "proxy.address"
    proxy = subprocess.Popen([sys.executable, "-m", "accrot.cli", "storage-proxy", f"--storage={postgres}",
                              "--host=127.0.0.1", f"--port={port}", f"--address_file={address}"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not address.exists():
            assert proxy.poll() is None and time.monotonic() < deadline, proxy.stdout.read()
            time.sleep(0.1)
        assert address.read_text().strip() == f"127.0.0.1:{port}"
        # each worker waits at a start line until all three have imported (a loaded machine starts them seconds
        # apart, and the first would otherwise spend the whole budget alone); a trial then takes 0.1 s
        start = ("import sys, time, pathlib; from accrot.bench.storage import TrivialWorker, _worker_main; "
                 "d = pathlib.Path(sys.argv[3]); (d / f'ready{sys.argv[4]}').touch(); "
                 "[time.sleep(0.05) for _ in range(4000) if len(list(d.glob('ready*'))) < 3]; "
                 "TrivialWorker.run = lambda self, *a: time.sleep(0.1); "
                 "_worker_main(*sys.argv[1:4], int(sys.argv[4]), sys.argv[5])")
        workers = [subprocess.Popen([sys.executable, "-c", start, str(spec_path),
                                     f"grpc://127.0.0.1:{port}", str(tmp_path), str(i), str(tmp_path / f"w{i}.log")])
                   for i in range(3)]
        codes = [w.wait(240) for w in workers]
        logs = {i: Path(tmp_path / f"w{i}.log").read_text()[-1500:] for i in range(3)}
        assert codes == [0, 0, 0], logs
    finally:
        proxy.terminate()
        out = proxy.communicate(timeout=60)[0]
    assert "storage proxy stopped" in out and not address.exists(), out  # SIGTERM: clean stop, address withdrawn
    study = optuna.load_study(study_name=name, storage=storage)
    figures = account(study, budget)
    assert figures["lost"] == 0 and figures["complete"] == budget and not figures["unfinished"], figures
    assert budget_state(study)[0] == budget  # no worker overshot the budget
    trials = study.get_trials(deepcopy=False)
    assert all("heartbeat" in t.user_attrs for t in trials)  # the worker's own heartbeat, through the proxy
    assert len({t.user_attrs["worker"] for t in trials}) == 3  # all three took trials
    assert sweep_done(storage, name) and not sweep_done(storage, "another")
