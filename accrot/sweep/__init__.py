"""``accrot sweep SPEC``: Optuna studies over accrot runs.

A study spec (``sweeps/*.yaml``, schema in accrot/sweep/README.md) names a base config, fixed overrides, a search
space over the CLI's dotted keys (categorical / int / float, log scale, conditional on other keys), the
objective(s) read from the extrapolation evaluation (``nll@16x``, ...), sampler, pruner, budget, seeds and
storage. Each trial is one ordinary ``accrot fit`` run, in-process in a worker, with its own run directory.

Processes. The parent validates the spec (every stratum's config is built by the real CLI parser, without
training), creates the studies and the storage schema (so workers never race on creating it), then starts
``--workers`` worker processes on the same storage and watches them. A worker that dies (signal, OOM)
leaves its running trial failed with the reason, retried (same params and seed) up to ``retries`` times,
and is replaced. Workers on other nodes run ``accrot sweep SPEC --worker --storage URL`` against the same
storage. A trial runs on one device of its worker (with several GPUs the parent gives each worker one, round
robin); Lightning cannot re-launch an in-process run per rank, so multi-device trials are rejected here and
belong to an srun launcher (the pruning callback already reports from rank 0 and broadcasts its decision).

Budget. ``trials`` counts configurations per study; each configuration runs once per seed in ``seeds``
(the copies are enqueued with the same params when the configuration is first sampled, so the sampler
never mistakes a seed for a hyperparameter). Each worker takes a storage-wide budget lock (file lock next
to SQLite/journal files, ``pg_advisory_lock`` on PostgreSQL) from the budget check until its trial exists,
so N workers never overshoot the budget. With ``variants`` every variant is its own study
(``<name>/<variant>``) with its own sampler and the same budget, so no variant can be starved.

Storages. SQLite under the run root by default (``<root>/<name>/study.db``, WAL mode, long busy timeout),
``postgresql://`` for many nodes, ``grpc://HOST:PORT`` for many workers (``accrot storage-proxy``: Optuna's gRPC
proxy in front of the database, with the budget lock as leases, :mod:`accrot.sweep.proxy`), and
``journal:///abs/path.log`` (Optuna's JournalStorage on a JournalFileBackend) on one machine's disk. RDB storages
use Optuna's heartbeat (``heartbeat_interval``, ``grace_period``) with a retrying stale-trial callback; Optuna 5's
JournalStorage and the proxy's client have no heartbeat, so their workers write a ``heartbeat`` user attribute
every interval and fail (and retry) running trials whose heartbeat is older than the grace period.

References: Akiba et al., "Optuna: A Next-generation Hyperparameter Optimization Framework", KDD 2019.
"""
