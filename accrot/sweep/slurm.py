"""``accrot slurm train|sweep``: render the sbatch templates of ``sweeps/slurm/`` and submit them.

``accrot slurm train [options] -- FIT ARGS`` runs ``accrot fit FIT ARGS`` on ``--nodes`` × ``--tasks_per_node``
DDP ranks (``srun``; Lightning's SLURMEnvironment); ``accrot slurm sweep SPEC --storage URL --workers K
[options]`` creates the study, then submits K array tasks, each a multi-node worker whose trials are DDP runs
(:mod:`accrot.sweep.ddp`). With ``--proxy`` it first submits a one-core job running ``accrot storage-proxy`` in
front of the database (``sweeps/slurm/proxy.sbatch``); the array starts once that job has, and its workers reach
the study through the proxy's address, which the proxy writes to a file under the run root. (A separate job, not
the array's first task: the proxy must outlive every worker, and a task holding its nodes' GPUs idle until the
last worker ends would waste them.) ``--dry-run`` prints the script(s) and submits nothing.

Everything is checked before submission, one line each (exit status 2): the fit arguments (parsed and built
by the real CLI, without training), ranks that do not match the config's ``trainer.devices`` /
``trainer.num_nodes``, a partition the cluster lacks or needs, a run root on a node-local filesystem for a
multi-node job, a storage a job array cannot share (SQLite). :func:`check_launch` catches at run time what
SLURM cannot: ``srun -n1`` with ``trainer.devices=2`` silently trains one rank.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from accrot.errors import UsageError, bad_input_message
from accrot.options import FLAG, count, option, parse, pattern, write_dir, write_file
from accrot.run.launch import device_count
from accrot.sweep.spec import SPEC
from accrot.sweep.storage import STORAGE

TEMPLATES = Path(__file__).resolve().parents[2] / "sweeps" / "slurm"
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$")  # sbatch --time: M, M:S, H:M:S, D-H, D-H:M[:S]
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
HOST = re.compile(r"[A-Za-z0-9_.:-]+")  # a host name or an IPv4/IPv6 address
# filesystems only the node that mounts them sees (a run directory on one cannot be shared across nodes)
LOCAL_FS = {"tmpfs", "ramfs", "overlay", "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "vfat", "zfs"}


# with --gpus_per_node: the ranks talk NCCL (Lightning's DDP on CUDA); a rank that dies or hangs in a collective
# then fails the step instead of blocking the others until the time limit (srun --kill-on-bad-exit ends the rest)
GPU_ENV = "\n".join([
    "# NCCL: the GPU ranks' backend (Lightning's DDP); each rank takes the GPU of its local rank",
    'export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"',
    'export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"',
])


class _Template(string.Template):
    delimiter = "@"  # the scripts are bash: `$` stays bash's


def render(name: str, values: dict[str, Any]) -> str:
    """The template ``sweeps/slurm/<name>.sbatch`` with ``@{key}`` replaced (a missing key is a bug)."""
    text = (TEMPLATES / f"{name}.sbatch").read_text()
    lines = _Template(text).substitute({k: str(v) for k, v in values.items()}).splitlines()
    return "\n".join(ln for ln in lines if ln.strip() or not ln) + "\n"


# ---------------------------------------------------------------------------------------------------
# submission time: the cluster
# ---------------------------------------------------------------------------------------------------
def _tool(name: str) -> str | None:
    return shutil.which(name)


def _query(cmd: list[str]) -> str | None:
    """The standard output of a SLURM query, or None without the tool or a reachable controller."""
    if _tool(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return None if out.returncode else out.stdout


def partitions() -> tuple[list[str], str | None] | None:
    """(partitions, the default one) from ``sinfo``; None without SLURM's tools or a reachable controller."""
    stdout = _query(["sinfo", "-h", "-o", "%P"])
    if stdout is None:
        return None
    names = [p.strip() for p in stdout.split() if p.strip()]
    default = next((p[:-1] for p in names if p.endswith("*")), None)
    return sorted({p.rstrip("*") for p in names}), default


def cluster_is_this_machine() -> bool:
    """Every node of the cluster is this machine (a test cluster, or slurmd daemons on one workstation)."""
    stdout = _query(["scontrol", "-o", "show", "nodes"])
    if stdout is None:
        return False
    addrs = re.findall(r"\bNodeAddr=(\S+)", stdout)
    local = {"127.0.0.1", "localhost", "::1", socket.gethostname(), socket.getfqdn()}
    return bool(addrs) and all(a in local for a in addrs)


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem ``path`` (or its nearest existing parent) lives on, from /proc/mounts."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    p = p.resolve()
    try:
        mounts = [ln.split() for ln in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    best = ("", None)
    for fields in mounts:
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (str(p) == point or str(p).startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
            best = (point, fields[2])
    return best[1]


def check_shared(root: Path, nodes: int) -> None:
    """A multi-node job's run root must be on a filesystem every node sees (rank 0 may change node on requeue)."""
    if nodes <= 1:
        return
    fs = filesystem_type(root)
    if fs in LOCAL_FS and not cluster_is_this_machine():
        raise UsageError(f"run root {str(root)!r} is on a node-local filesystem ({fs}), which the other {nodes - 1} "
                         "node(s) do not see; pass --root on a shared filesystem (NFS, Lustre, GPFS, ...)")


def check_partition(partition: str | None, dry_run: bool) -> None:
    found = partitions()
    if found is None:
        if not dry_run:
            raise UsageError("sbatch/sinfo not found or the SLURM controller is unreachable; run on a login node "
                             "of the cluster (or use --dry-run to print the script)")
        return
    names, default = found
    if partition is not None and partition not in names:
        raise UsageError(f"partition {partition!r} does not exist on this cluster; choose one of {', '.join(names)}")
    if partition is None and default is None:
        raise UsageError(f"this cluster has no default partition; pass --partition (one of {', '.join(names)})")


# ---------------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------------
def _parser(kind: str):
    from jsonargparse import ArgumentParser

    from accrot.display import plain_help

    parser = ArgumentParser(prog=f"accrot slurm {kind}", exit_on_error=False, description=plain_help(__doc__))
    if kind == "sweep":
        option(parser, "spec", kind=SPEC, type=str, help="a spec file (sweeps/lr.yaml) or a shipped spec's name (lr)")
        option(parser, "--storage", kind=STORAGE, type=str | None, default=None,
                            help="postgresql://USER@HOST/DB (every node must reach it; --proxy serves it through the "
                                 "storage proxy), grpc://HOST:PORT or journal:///SHARED/PATH.log; "
                                 "default: $ACCROT_SWEEP_STORAGE")
        option(parser, "--workers", kind=count(1, 100000), type=int, default=1, help="array tasks = workers running trials at once")
        option(parser, "--root", kind=write_dir("a run root"), type=str | None, default=None, help="run root (default: the spec's)")
        option(parser, "--proxy", kind=FLAG, action="store_true",
                            help="serve the database through accrot storage-proxy, its own one-core job: for many "
                                 "workers (each worker on the database holds ~3 connections)")
        option(parser, "--proxy_host", kind=pattern(HOST, "a host name or an IP address"), type=str | None, default=None,
                            help="--proxy: the address workers reach the proxy at (default: its node's host name)")
        option(parser, "--proxy_port", kind=count(0, 65535), type=int, default=0, help="--proxy: its port (0: any free port)")
        option(parser, "--proxy_time", kind=pattern(_TIME, "minutes, HH:MM:SS or D-HH:MM:SS (sbatch --time)"), type=str | None, default=None,
                            help="--proxy: the proxy job's time limit, as long as the whole sweep (default: --time)")
    option(parser, "--nodes", kind=count(1, 100000), type=int, default=1, help="nodes per run (a sweep: per trial)")
    option(parser, "--tasks_per_node", kind=count(1, 1024), type=int, default=1, help="ranks per node: one per GPU")
    option(parser, "--gpus_per_node", kind=count(0, 1024), type=int, default=0, help="GPUs per node (#SBATCH --gpus-per-node)")
    option(parser, "--cpus_per_task", kind=count(1, 4096), type=int | None, default=None, help="#SBATCH --cpus-per-task")
    option(parser, "--partition", kind=pattern(NAME, "letters, digits and _.+-"), type=str | None, default=None, help="partition (default: the cluster's)")
    option(parser, "--account", kind=pattern(NAME, "letters, digits and _.+-"), type=str | None, default=None, help="account to charge")
    option(parser, "--time", kind=pattern(_TIME, "minutes, HH:MM:SS or D-HH:MM:SS (sbatch --time)"), type=str, default="01:00:00", help="time limit (sbatch --time: HH:MM:SS, D-HH, M)")
    option(parser, "--signal_seconds", kind=count(1, 65535), type=int, default=90,
                        help="send USR1 this long before the time limit: checkpoint and requeue")
    option(parser, "--job_name", kind=pattern(NAME, "letters, digits and _.+-"), type=str | None, default=None, help="job name (default: accrot-train / the spec)")
    option(parser, "--master_addr", kind=pattern(HOST, "a host name or an IP address"), type=str | None, default=None,
                        help="export MASTER_ADDR (e.g. 127.0.0.1 where node names do not resolve); "
                             "default: Lightning's, the first node of the job")
    option(parser, "--assume_shared", kind=FLAG, type=bool, default=False,
                        help="trust that the run root is shared by every node although its filesystem looks local")
    option(parser, "--out", kind=write_file("a file for the script"), type=str | None, default=None,
                        help="where to write the script (default: <root>/slurm/<job>-<time>.sbatch)")
    option(parser, "--dry-run", "--dry_run", kind=FLAG, dest="dry_run", action="store_true",
                        help="print the script, submit nothing")
    return parser


def _check_common(args) -> None:
    for name in ("nodes", "tasks_per_node"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name}={getattr(args, name)} is not valid; use an integer >= 1")
    if args.gpus_per_node < 0 or (args.cpus_per_task is not None and args.cpus_per_task < 1):
        raise UsageError("--gpus_per_node must be >= 0 and --cpus_per_task >= 1")
    if args.gpus_per_node and args.tasks_per_node != args.gpus_per_node:
        raise UsageError(f"--tasks_per_node={args.tasks_per_node} with --gpus_per_node={args.gpus_per_node}: Lightning "
                         f"runs one rank per GPU; pass --tasks_per_node {args.gpus_per_node}")
    if not _TIME.match(args.time):
        raise UsageError(f"--time={args.time!r} is not valid; use minutes, HH:MM:SS or D-HH:MM:SS (sbatch --time)")
    if args.signal_seconds < 1 or args.signal_seconds > 65535:
        raise UsageError(f"--signal_seconds={args.signal_seconds} is not valid; use 1 to 65535 seconds")
    for name in ("partition", "account", "job_name"):
        value = getattr(args, name)
        if value is not None and not NAME.match(value):
            raise UsageError(f"--{name}={value!r} is not valid; use letters, digits and _.+-")
    if args.master_addr is not None and not re.fullmatch(r"[A-Za-z0-9_.:-]+", args.master_addr):
        raise UsageError(f"--master_addr={args.master_addr!r} is not valid; pass a host name or an IP address")


def _values(args, root: Path, job_name: str) -> dict[str, Any]:
    extra = []
    for flag, value in (("partition", args.partition), ("account", args.account)):
        if value:
            extra.append(f"#SBATCH --{flag}={value}")
    if args.gpus_per_node:
        extra.append(f"#SBATCH --gpus-per-node={args.gpus_per_node}")
    if args.cpus_per_task:
        extra.append(f"#SBATCH --cpus-per-task={args.cpus_per_task}")
    logs = root / "slurm"
    return {
        "job_name": job_name, "nodes": args.nodes, "tasks_per_node": args.tasks_per_node,
        "world": args.nodes * args.tasks_per_node, "time": args.time, "signal": f"USR1@{args.signal_seconds}",
        "log": str(logs / ("%x-%A_%a.out" if "sweep" in job_name else "%x-%j.out")), "sbatch_extra": "\n".join(extra),
        "workdir": shlex.quote(os.getcwd()), "python": shlex.quote(sys.executable),
        "master_addr": f"export MASTER_ADDR={args.master_addr}" if args.master_addr else
        "# MASTER_ADDR: Lightning's SLURMEnvironment takes the first node of the job (--master_addr sets it)",
        "threads": args.cpus_per_task or 1,
        "gpu_env": GPU_ENV if args.gpus_per_node else "# no --gpus_per_node: this job asks for no GPUs",
    }


def _flat_fit(fit_args: list[str]) -> dict[str, Any]:
    from accrot.run.probe import probe

    try:
        return probe(["fit", *fit_args])
    except Exception as err:  # noqa: BLE001 - the fit arguments' own bad input, one line
        message = bad_input_message(err)
        if message is None:
            raise
        raise UsageError(message) from None


def _check_layout(flat: dict, nodes: int, tasks: int) -> None:
    devices, num_nodes = device_count(flat.get("trainer.devices")), device_count(flat.get("trainer.num_nodes") or 1)
    if devices not in (None, 1, tasks) or num_nodes not in (None, 1, nodes):
        raise UsageError(
            f"the config asks for trainer.devices={flat.get('trainer.devices')} x trainer.num_nodes="
            f"{flat.get('trainer.num_nodes')}, but the job has --nodes={nodes} x --tasks_per_node={tasks}; "
            "make them match (one task per device), or drop trainer.devices/num_nodes from the config")


def _submit(script: str, out: Path, env: dict | None = None, extra: list[str] | None = None) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(script)
    try:
        result = subprocess.run(["sbatch", "--parsable", *(extra or []), str(out)], capture_output=True, text=True,
                                timeout=60, env=env)
    except (OSError, subprocess.SubprocessError) as err:
        raise UsageError(f"sbatch failed: {err}") from None
    if result.returncode:
        raise UsageError(f"sbatch refused {out}: {' '.join(result.stderr.split())[:300]}")
    return result.stdout.strip().split(";")[0]


def train_main(argv: list[str]) -> int:
    """``accrot slurm train [options] -- FIT ARGS``: one DDP training run on nodes × tasks per node."""
    head, fit_args = _split(argv)
    args = parse(_parser("train"), head)
    _check_common(args)
    if not fit_args:
        raise UsageError("give the accrot fit arguments after --: accrot slurm train --nodes 2 -- --config tiny")
    clash = [a for a in fit_args if a.split("=")[0] in ("--resume", "--ckpt_path", "--trainer.num_nodes",
                                                       "--trainer.devices", "--trainer.strategy")]
    if clash:
        raise UsageError(f"{clash[0].split('=')[0]} is set by accrot slurm train (--ckpt_path last resumes a requeued "
                         "job; the ranks come from --nodes and --tasks_per_node); drop it")
    flat = _flat_fit(fit_args)
    _check_layout(flat, args.nodes, args.tasks_per_node)
    root = Path(_root_arg(fit_args) or "runs").absolute()  # (probe builds in a temporary root)
    if not args.assume_shared:
        check_shared(root, args.nodes)
    check_partition(args.partition, args.dry_run)
    world = args.nodes * args.tasks_per_node
    launch = [f"--trainer.num_nodes={args.nodes}", f"--trainer.devices={args.tasks_per_node}",
              f"--trainer.strategy={'ddp' if world > 1 else 'auto'}", "--ckpt_path=last"]
    if args.gpus_per_node and not any(a.split("=")[0] == "--trainer.accelerator" for a in fit_args):
        launch.insert(0, "--trainer.accelerator=gpu")  # fails at once on a node whose GPUs are not visible
    job_name = args.job_name or "accrot-train"
    values = _values(args, root, job_name)
    values["fit_args"] = shlex.join([*fit_args, *launch])
    script = render("train", values)
    return _emit(script, args, root, job_name)


def sweep_main(argv: list[str]) -> int:
    """``accrot slurm sweep SPEC --storage URL --workers K [options]``: K workers as a job array."""
    from accrot.sweep.parent import run_sweep
    from accrot.sweep.spec import load_spec
    from accrot.sweep.storage import StorageRef

    head, rest = _split(argv)
    if rest:
        raise UsageError("accrot slurm sweep takes no arguments after --; put overrides in the spec")
    args = parse(_parser("sweep"), head)
    _check_common(args)
    if args.workers < 1:
        raise UsageError(f"--workers={args.workers} is not valid; use an integer >= 1 (array tasks)")
    spec = load_spec(args.spec)
    root = Path(args.root or spec.root).absolute()
    url = args.storage or os.environ.get("ACCROT_SWEEP_STORAGE") or spec.storage
    if not url or url.startswith("sqlite"):
        raise UsageError(f"storage {url or '(none: SQLite under the run root)'!r} cannot serve a job array; pass "
                         "--storage postgresql://USER@HOST/DB or journal:///SHARED/PATH.log")
    ref = StorageRef.parse(url, spec.name, root)
    if not args.assume_shared:  # trials of different workers run on different nodes too
        check_shared(root, args.nodes if args.workers == 1 else max(args.nodes, 2))
    check_partition(args.partition, args.dry_run)
    job_name = args.job_name or f"accrot-sweep-{spec.name}"
    values = _values(args, root, job_name)
    values.update(spec=shlex.quote(str(spec.path)), workers=args.workers, last_worker=args.workers - 1,
                  root=shlex.quote(str(root)))
    address = root / spec.name / "proxy.address"
    values["proxy_env"] = _proxy_env(address) if args.proxy else "# no --proxy: the workers reach the storage directly"
    script = render("sweep", values)
    proxy = _proxy_script(args, ref, root, job_name, spec.name, address) if args.proxy else None
    if not args.dry_run:  # validate the spec and create the study (and schema) once, before any worker starts
        run_sweep(spec, ref, root, 0)
    # the workers (and the proxy) read the storage from the job's environment (sbatch exports this one's)
    env = {**os.environ, "ACCROT_SWEEP_STORAGE": ref.url}
    if proxy is None:
        return _emit(script, args, root, job_name, env=env)
    return _emit_with_proxy(proxy, script, args, root, job_name, env, address)


# the workers' wait for the proxy's address (it starts a moment after the array may)
PROXY_WAIT_S = 600


def _proxy_env(address: Path) -> str:
    return "\n".join([
        "# the storage proxy's job writes its HOST:PORT here once it listens (accrot slurm sweep --proxy)",
        f"address={shlex.quote(str(address))}",
        f'for _ in $(seq {PROXY_WAIT_S}); do [ -s "$address" ] && break; sleep 1; done',
        f'[ -s "$address" ] || {{ echo "accrot: error: no storage proxy address in $address after {PROXY_WAIT_S} s; see '
        'the proxy job\'s log" >&2; exit 2; }',
        'export ACCROT_SWEEP_STORAGE="grpc://$(cat "$address")"',
        'echo "accrot: storage proxy at ${ACCROT_SWEEP_STORAGE}"',
    ])


def _proxy_script(args, ref, root: Path, job_name: str, spec_name: str, address: Path) -> str:
    """The proxy job's script; a one-line UsageError for a storage the proxy cannot serve or a bad option."""
    from accrot.sweep.proxy import check_servable

    check_servable(ref)
    if not 0 <= args.proxy_port <= 65535:
        raise UsageError(f"--proxy_port={args.proxy_port} is not valid; use 1 to 65535 (0: any free port)")
    if args.proxy_host is not None and not re.fullmatch(r"[A-Za-z0-9_.:-]+", args.proxy_host):
        raise UsageError(f"--proxy_host={args.proxy_host!r} is not valid; pass a host name or an IP address")
    time_limit = args.proxy_time or args.time
    if not _TIME.match(time_limit):
        raise UsageError(f"--proxy_time={time_limit!r} is not valid; use minutes, HH:MM:SS or D-HH:MM:SS (sbatch --time)")
    extra = [f"#SBATCH --{flag}={value}" for flag, value in (("partition", args.partition), ("account", args.account))
             if value]
    return render("proxy", {
        "job_name": f"{job_name}-proxy", "time": time_limit, "log": str(root / "slurm" / "%x-%j.out"),
        "sbatch_extra": "\n".join(extra), "workdir": shlex.quote(os.getcwd()), "python": shlex.quote(sys.executable),
        "port": args.proxy_port, "advertise": f"--advertise {args.proxy_host} " if args.proxy_host else "",
        "address_file": shlex.quote(str(address)), "spec_name": shlex.quote(spec_name)})


def _emit_with_proxy(proxy: str, script: str, args, root: Path, job_name: str, env: dict, address: Path) -> int:
    """The proxy's job first, then the array, which starts once the proxy's job has (``--dependency=after``)."""
    if args.dry_run:
        sys.stdout.write(proxy + "\n# --- then the workers' array: sbatch --dependency=after:<the proxy's job> ---\n\n"
                         + script)
        return 0
    stamp = time.strftime('%Y%m%d-%H%M%S')
    out = Path(args.out) if args.out else root / "slurm" / f"{job_name}-{stamp}.sbatch"
    address.parent.mkdir(parents=True, exist_ok=True)
    address.unlink(missing_ok=True)  # a finished proxy's address must not send the new workers to it
    proxy_job = _submit(proxy, out.with_name(f"{out.stem}-proxy.sbatch"), env)
    job = _submit(script, out, env, [f"--dependency=after:{proxy_job}"])
    print(f"submitted proxy job {proxy_job} and job {job} ({out}); logs: {root / 'slurm'}")
    return 0


def _emit(script: str, args, root: Path, job_name: str, env: dict | None = None) -> int:
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    out = Path(args.out) if args.out else root / "slurm" / f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    job = _submit(script, out, env)
    print(f"submitted job {job} ({out}); logs: {root / 'slurm'}")
    return 0


def _root_arg(fit_args: list[str]) -> str | None:
    root = None
    for i, a in enumerate(fit_args):
        if a == "--root" and i + 1 < len(fit_args):
            root = fit_args[i + 1]
        elif a.startswith("--root="):
            root = a.split("=", 1)[1]
    return root


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def main(argv: list[str]) -> int:
    """``accrot slurm train|sweep ...``"""
    if argv and argv[0] in ("-h", "--help"):
        print("usage: accrot slurm {train,sweep} [options]\n\n"
              "  train   submit `accrot fit` as one multi-node DDP job (accrot slurm train --nodes 2 "
              "--tasks_per_node 4 -- --config small)\n"
              "  sweep   create the study, then submit K array tasks of workers (accrot slurm sweep SPEC --workers K --storage URL"
              " [--proxy])\n\n"
              "accrot slurm train --help, accrot slurm sweep --help: the options of each")
        return 0
    if not argv or argv[0] not in ("train", "sweep"):
        got = f" (got {argv[0]!r})" if argv and not argv[0].startswith("-") else ""
        raise UsageError(f"accrot slurm needs a command: train or sweep{got}; e.g. accrot slurm train --nodes 2 "
                         "--tasks_per_node 4 -- --config small")
    return train_main(argv[1:]) if argv[0] == "train" else sweep_main(argv[1:])
