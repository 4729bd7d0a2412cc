"""``accrot bench storage``: how many sweep workers a storage holds, on PostgreSQL directly and through accrot's
storage proxy, side by side in one run.

Each row is one study of ``--trials`` trials run by ``W`` workers (``--workers 8 32 64``) on a throwaway
PostgreSQL server started here from the installed binaries (:mod:`accrot.bench.postgres`, 127.0.0.1 only): the
workers are accrot's own sweep worker (:class:`accrot.sweep.worker.Worker`: budget lock, heartbeat, recovery,
retries, the trial attributes) whose training run is replaced by a trivial objective, so the storage is all that
is measured. Mid-run, at a third of the budget one worker is killed (SIGKILL); its running trial is failed and
retried as the sweep's parent does, and a new worker takes its place; on the proxy rows, at two thirds, the proxy
itself is killed and started again on the same port a second later (the workers ride out the outage).

Reported per row: trials per second (complete trials over the row's wall time, outages included), the database
connections the workers held (``pg_stat_activity``, sampled every half second: peak and mean), the retried trials,
and the trials lost (budget pairs never completed, trials left unfinished or failed without a reason; must be 0)
and any over the budget. Workers are forked from one preloaded process (``multiprocessing``'s forkserver), so 64
of them start in seconds, not in 64 interpreter start-ups. Every row has a deadline; the bench stops by itself.

The numbers are this machine's: on a 2-core machine 64 workers share two cores (with the database and the proxy),
so trials per second measure contention; the connection counts and the losses do not depend on the cores.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from accrot.bench.postgres import PostgresServer
from accrot.sweep.worker import Worker

STORAGES = ("postgresql", "proxy")
HEARTBEAT = {"interval": 1, "grace": 5}  # a trial nobody claimed after a proxy restart is retried 5 s later


def spec_doc(name: str, trials: int) -> dict[str, Any]:
    """The load study: one float, a random sampler (TPE's cost grows with the trials), no pruner, nothing stored."""
    return {"name": name, "description": "accrot bench storage: a trivial objective, the storage under load",
            "base": "tiny", "space": {"model.lr": {"type": "float", "low": 1.0e-4, "high": 1.0e-1, "log": True}},
            "objectives": [{"metric": "nll@1x", "direction": "minimize"}], "sampler": {"type": "random", "seed": 0},
            "pruner": {"type": "none"}, "trials": trials, "seeds": [0], "retries": 3, "heartbeat": HEARTBEAT,
            "wandb": "disabled", "artifacts": {"type": "none"}}


class TrivialWorker(Worker):
    """accrot's worker with the training run replaced by a quadratic in log10(lr): no model, no data (and no
    garbage collection after each trial, which a training run needs and which would cost more than the trial)."""

    gc_after_trial = False

    def preload(self) -> None:
        return None

    def run(self, study_name: str, trial, args: list[str]):
        return None

    def record(self, entry, stratum, trial, cli) -> float:
        return (math.log10(trial.params["model.lr"]) + 2.5) ** 2


def _redirect(log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _worker_main(spec_path: str, url: str, root: str, index: int, log: str) -> None:
    """A forked worker: trials until the budget is spent."""
    from accrot.sweep.spec import load_spec
    from accrot.sweep.storage import StorageRef

    _redirect(log)
    spec = load_spec(spec_path)
    sys.exit(TrivialWorker(spec, StorageRef.parse(url, spec.name, root), Path(root), index).loop(None))


def _proxy_main(url: str, port: int, address_file: str, log: str) -> None:
    """A forked ``accrot storage-proxy`` on 127.0.0.1:port."""
    from accrot.sweep.proxy import main

    _redirect(log)
    sys.exit(main(["--storage", url, "--host", "127.0.0.1", "--port", str(port), "--address_file", address_file]))


@dataclass
class Row:
    storage: str
    workers: int
    trials: int
    seconds: float = 0.0
    trials_per_s: float = 0.0
    connections_peak: int = 0
    connections_mean: float = 0.0
    retried: int = 0
    proxy_restarts: int = 0
    lost: int = 0
    over_budget: int = 0
    timed_out: bool = False
    events: list[str] = field(default_factory=list)


class Load:
    """One row: the study, its workers and (proxy rows) the proxy; the kills; the samples; the accounting."""

    def __init__(self, bench: StorageBench, storage: str, workers: int) -> None:
        self.bench, self.kind, self.n = bench, storage, workers
        self.name = f"load-{storage}-{workers}"
        self.row = Row(storage, workers, bench.trials)
        self.folder = bench.work / self.name
        self.folder.mkdir(parents=True)
        self.spec_path = self.folder / f"{self.name}.yaml"
        self.spec_path.write_text(yaml.safe_dump(spec_doc(self.name, bench.trials), sort_keys=False))
        self.procs: list[Any] = []
        self.proxy: Any = None
        self.port = 0
        self.samples: list[int] = []

    # -- processes --------------------------------------------------------------------------------------------
    def start_proxy(self) -> None:
        from accrot.sweep.proxy import _bind_check

        self.port = self.port or _bind_check("127.0.0.1", 0)
        address = self.folder / "proxy.address"
        address.unlink(missing_ok=True)
        self.proxy = self.bench.ctx.Process(target=_proxy_main, args=(
            self.bench.pg.url, self.port, str(address), str(self.folder / "proxy.log")), daemon=True)
        self.proxy.start()
        deadline = time.monotonic() + 120
        while not address.exists():
            if not self.proxy.is_alive() or time.monotonic() > deadline:
                tail = (self.folder / "proxy.log").read_text(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"the storage proxy did not start: {' / '.join(tail)}")
            time.sleep(0.05)

    def start_worker(self) -> None:
        url = f"grpc://127.0.0.1:{self.port}" if self.kind == "proxy" else self.bench.pg.url
        i = len(self.procs)
        proc = self.bench.ctx.Process(target=_worker_main, args=(
            str(self.spec_path), url, str(self.folder), i, str(self.folder / f"worker-{i}.log")), daemon=True)
        proc.start()
        self.procs.append(proc)

    # -- the row ----------------------------------------------------------------------------------------------
    def run(self, deadline_s: float) -> Row:
        self.create()
        if self.kind == "proxy":
            self.start_proxy()
        started = time.monotonic()
        for _ in range(self.n):
            self.start_worker()
        killed_worker = restarted_proxy = False
        next_sample, tries = 0.0, 0
        while any(p.is_alive() for p in self.procs):
            if time.monotonic() - started > deadline_s:
                self.row.timed_out = True
                break
            if time.monotonic() >= next_sample:
                # every 0.1 s until a worker is killed (trivial trials: a fast row is over in 2 s), then every 0.5 s
                next_sample = time.monotonic() + (0.5 if killed_worker else 0.1)
                conns, done = self.sample()
                if not killed_worker and done >= self.bench.trials / 3:
                    tries += 1
                    killed_worker = self.kill_worker(tries)
                elif self.kind == "proxy" and not restarted_proxy and done >= 2 * self.bench.trials / 3:
                    restarted_proxy = self.restart_proxy()
            time.sleep(0.1)
        self.row.seconds = time.monotonic() - started
        self.stop()
        return self.account()

    def create(self) -> None:
        from accrot.sweep.parent import create_studies
        from accrot.sweep.spec import load_spec
        from accrot.sweep.storage import StorageRef, creation_lock, open_storage

        spec = load_spec(self.spec_path)
        ref = StorageRef.parse(self.bench.pg.url, spec.name, self.folder)
        with creation_lock(ref, spec.name):
            storage = open_storage(ref, create=True)
            create_studies(spec, storage, self.bench.infos(spec))
        storage.engine.dispose()

    def sample(self) -> tuple[int, int]:
        """(connections held now, complete trials) in one query; the bench itself holds no connection."""
        line = self.bench.pg.query(
            f"SELECT ({PostgresServer.CONNECTIONS}), (SELECT count(*) FROM trials t JOIN studies s USING (study_id) "
            f"WHERE s.study_name = '{self.name}' AND t.state = 'COMPLETE')")[0]
        conns, done = (int(v) for v in line.split("|"))
        self.samples.append(conns)
        return conns, done

    def running_pids(self) -> set[int]:
        """The PIDs of the workers running a trial now (their ``worker`` attribute, ``host:pid``)."""
        rows = self.bench.pg.query(
            "SELECT a.value_json FROM trial_user_attributes a JOIN trials t USING (trial_id) JOIN studies s "
            f"USING (study_id) WHERE s.study_name = '{self.name}' AND t.state = 'RUNNING' AND a.key = 'worker'")
        return {int(r.strip('"').rsplit(":", 1)[1]) for r in rows if ":" in r}

    def kill_worker(self, tries: int) -> bool:
        """SIGKILL a worker in the middle of a trial (any live one after ``tries`` samples found none); fail and
        retry its running trial as the sweep's parent does; start another worker in its place."""
        from accrot.sweep.recovery import RetryTrial, fail_worker_trials

        running = self.running_pids()
        victim = next((p for p in self.procs if p.is_alive() and p.pid in running), None)
        if victim is None and tries >= 2:  # trivial trials are rarely caught running: then any live worker
            victim = next((p for p in self.procs if p.is_alive()), None)
        if victim is None:
            return False
        victim.kill()
        victim.join()
        worker = f"{socket.gethostname()}:{victim.pid}"
        with self.bench.study(self.name) as (study, storage):
            n = fail_worker_trials([study], storage, worker, f"worker {worker} killed by the bench (SIGKILL)",
                                   RetryTrial(3))
        self.row.events.append(f"killed worker {worker}: {n} running trial(s) failed and retried")
        self.bench.log(f"{self.name}: killed a worker ({n} running trial(s) failed and re-queued); started another")
        self.start_worker()
        return True

    def restart_proxy(self) -> bool:
        self.proxy.kill()
        self.proxy.join()
        time.sleep(1.0)  # an outage the workers must ride out
        self.start_proxy()
        self.row.proxy_restarts += 1
        self.row.events.append("proxy killed (SIGKILL) and restarted on its port after 1 s")
        self.bench.log(f"{self.name}: killed the storage proxy and started it again")
        return True

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join()
        if self.proxy is not None and self.proxy.is_alive():
            self.proxy.terminate()
            self.proxy.join(30)

    def account(self) -> Row:
        from accrot.sweep.recovery import account, budget_state

        with self.bench.study(self.name) as (study, _):
            figures = account(study, self.bench.trials)
            counted, _, _ = budget_state(study)
        done = figures["complete"]
        self.row.trials_per_s = done / self.row.seconds if self.row.seconds else 0.0
        self.row.connections_peak = max(self.samples, default=0)
        self.row.connections_mean = statistics.fmean(self.samples) if self.samples else 0.0
        self.row.retried = len(figures["retried"])
        self.row.lost = max(0, figures["lost"])
        self.row.over_budget = max(0, counted - self.bench.trials)
        return self.row


class StorageBench:
    def __init__(self, pg: PostgresServer, trials: int, work: Path, log: Callable[[str], None]) -> None:
        self.pg, self.trials, self.work, self.log = pg, trials, work, log
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload([__name__])  # the workers fork from a process that imported accrot once
        self._infos = None

    def infos(self, spec):
        """Each stratum's checked config (the real CLI parser, once for every row: they differ only in name)."""
        from accrot.sweep.trials import check_stratum

        if self._infos is None:
            self._infos = {s.variant: check_stratum(spec, s) for s in spec.strata()}
        return self._infos

    @contextlib.contextmanager
    def study(self, name: str):
        """The study ``name`` on the database directly, its connections closed after."""
        import optuna

        from accrot.sweep.storage import StorageRef, open_storage

        storage = open_storage(StorageRef.parse(self.pg.url, name, self.work))
        try:
            yield optuna.load_study(study_name=name, storage=storage), storage
        finally:
            storage.engine.dispose()


def run_storage(workers: Sequence[int], trials: int, storages: Sequence[str], work: Path,
                log: Callable[[str], None], deadline_s: float) -> dict[str, Any]:
    """Every (storage, workers) row, in one run on one throwaway PostgreSQL server."""
    import grpc
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    max_conn = 3 * max(workers) + 50  # a direct worker holds up to 3 (its pool, its heartbeat, the budget lock)
    with PostgresServer(max_connections=max_conn) as pg:
        bench = StorageBench(pg, trials, work, log)
        info = {"postgresql": pg.version(), "max_connections": max_conn, "optuna": optuna.__version__,
                "grpcio": grpc.__version__, "cores": os.cpu_count(), "load_average": os.getloadavg()}
        log(f"PostgreSQL {info['postgresql']} on 127.0.0.1 (max_connections {max_conn}); optuna {optuna.__version__}, "
            f"grpcio {grpc.__version__}; load average at start {info['load_average'][0]:.1f} on {os.cpu_count()} cores")
        rows = []
        for n in workers:
            for kind in storages:
                log(f"{kind}: {n} workers × {trials} trials")
                row = Load(bench, kind, n).run(deadline_s)
                log(f"{kind}, {n} workers: {row.trials_per_s:.1f} trials/s, {row.connections_peak} connections at "
                    f"peak, {row.lost} lost{' (timed out)' if row.timed_out else ''}")
                rows.append(asdict(row))
        info["load_average_end"] = os.getloadavg()
    return {"bench": "storage", "settings": {"workers": list(workers), "trials": trials, "storages": list(storages),
                                             "heartbeat": HEARTBEAT, "deadline_s": deadline_s},
            "environment": info, "rows": rows}


COLUMNS = {"storage": "storage", "workers": "workers", "trials": "trials", "seconds": "s", "trials_per_s": "trials/s",
           "connections_peak": "DB conns peak", "connections_mean": "DB conns mean", "retried": "retried",
           "proxy_restarts": "proxy restarts", "lost": "lost", "over_budget": "over budget"}


def storage_table(doc: dict[str, Any]):
    """The rows side by side: one line per (workers, storage)."""
    from rich.table import Table

    env = doc["environment"]
    table = Table(title=f"sweep storage under load: PostgreSQL {env['postgresql']} directly vs through accrot's storage "
                        f"proxy ({doc['settings']['trials']} trivial trials per row; one worker killed per row, the proxy "
                        "killed once per proxy row)")
    for title in COLUMNS.values():
        table.add_column(title, justify="right")
    for row in doc["rows"]:
        cells = []
        for key in COLUMNS:
            value = row[key]
            cells.append(f"{value:.1f}" if isinstance(value, float) else str(value))
        if row["timed_out"]:
            cells[3] += " (timed out)"
        table.add_row(*cells)
    return table
