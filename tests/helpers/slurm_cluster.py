"""A real two-node SLURM cluster on localhost, in a temporary folder, for the integration tests.

Debian's ``slurm-wlm`` (22.05) and ``munge``, run as root: one ``munged``, one ``slurmctld`` and two ``slurmd``
(``slurmd -N n1``, ``slurmd -N n2``, each on its own port), no accounting, ``proctrack/linuxproc`` and
``task/none`` (no cgroups in a container). The node names do not resolve, so jobs export
``MASTER_ADDR=127.0.0.1`` (the templates' ``--master_addr``). Every daemon is stopped by its PID.

``python tests/helpers/slurm_cluster.py`` starts one and waits (Ctrl-C stops it): ``export SLURM_CONF=...`` as printed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue")
SBIN = ("/usr/sbin", "/sbin")


def which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN:
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return None


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if which(b) is None]


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class SlurmCluster:
    """``nodes`` slurmd daemons (n1, n2, ...) with ``cpus`` CPUs each, all on 127.0.0.1."""

    def __init__(self, root: Path, nodes: int = 2, cpus: int = 2) -> None:
        self.root = Path(root)
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.pids: dict[str, int] = {}
        self.pid_files: dict[str, Path] = {}  # a daemon whose PID was not read yet is still stopped by its file
        self.conf = self.root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # -- start ------------------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> SlurmCluster:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o755)  # munge's socket folder must be world-executable
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        socket_path = r / "munge" / "munge.socket"
        subprocess.run([which("munged"), "--force", f"--key-file={key}", f"--socket={socket_path}",
                        f"--pid-file={r / 'munge' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}",
                        f"--seed-file={r / 'munge' / 'munged.seed'}"], check=True, capture_output=True, timeout=20)
        self.pid_files["munged"] = r / "munge" / "munged.pid"
        self.pids["munged"] = self._read_pid(r / "munge" / "munged.pid", timeout)
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        nodes = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname={n} Port={p} CPUs={self.cpus} State=UNKNOWN"
                          for n, p in zip(self.nodes, node_ports))
        self.conf.write_text(f"""\
ClusterName=accrot-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket_path},cred_expire=5
CredType=cred/munge
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}/%n
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'spool'}/slurmd-%n.pid
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log'}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
{nodes}
PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")
        self.pid_files["slurmctld"] = r / "slurmctld.pid"
        subprocess.run([which("slurmctld"), "-i"], env=self.env, check=True, capture_output=True, timeout=20)
        self.pids["slurmctld"] = self._read_pid(r / "slurmctld.pid", timeout)
        for n in self.nodes:
            (r / "spool" / n).mkdir(parents=True, exist_ok=True)
            self.pid_files[f"slurmd-{n}"] = r / "spool" / f"slurmd-{n}.pid"
            subprocess.run([which("slurmd"), "-N", n], env=self.env, check=True, capture_output=True, timeout=20)
            self.pids[f"slurmd-{n}"] = self._read_pid(r / "spool" / f"slurmd-{n}.pid", timeout)
        self._wait_idle(timeout)
        return self

    def _read_pid(self, path: Path, timeout: float) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with contextlib.suppress(OSError, ValueError, IndexError):  # absent, or not written yet
                return int(path.read_text().split()[0])
            time.sleep(0.05)
        raise RuntimeError(f"{path} did not appear; see {self.root / 'log'}")

    def _wait_idle(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        out = ""
        while time.monotonic() < end:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if len(states) == len(self.nodes) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the nodes did not come up idle: {out!r}; see {self.root / 'log'}")

    # -- use --------------------------------------------------------------------------------------------
    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run([which(cmd[0]) or cmd[0], *cmd[1:]], env=self.env, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...)."""
        out = self.run("scontrol", "-o", "show", "job", job_id).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait(self, job_id: str, states: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                           "NODE_FAIL", "OUT_OF_MEMORY"), timeout: float = 120) -> dict:
        end = time.monotonic() + timeout
        info: dict = {}
        while time.monotonic() < end:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.3)
        raise TimeoutError(f"job {job_id} is still {info.get('JobState')} after {timeout:.0f} s")

    # -- stop -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job (slurmd ends its processes with SIGKILL after KillWait), then stop each daemon by PID."""
        if "slurmctld" in self.pids:
            with contextlib.suppress(Exception):
                jobs = self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
                if jobs:
                    self.run("scancel", "--full", *jobs, check=False)
                    end = time.monotonic() + 30
                    while time.monotonic() < end and self.run("squeue", "-h", "-o", "%A", check=False).stdout.split():
                        time.sleep(0.2)
        for name, path in self.pid_files.items():
            if name not in self.pids:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    self.pids[name] = int(path.read_text().split()[0])
        for name in [n for n in self.pids if n.startswith("slurmd")] + ["slurmctld", "munged"]:
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            end = time.monotonic() + 10
            while time.monotonic() < end and _alive(pid):
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie of ours counts as gone
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


if __name__ == "__main__":
    import tempfile

    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="accrot-slurm-"))).start()
    print(f"export SLURM_CONF={cluster.conf}")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
