"""The run directory a command creates: named after the scheme cell it trains, kept inside ``--root``, made and
proven writable before any work (an unwritable or full folder is one line), and removed again when the command fails
before its first checkpoint (nothing half-written). The output folders of ``accrot eval`` and ``accrot diagnose``
are made and proven writable the same way, before their computing starts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from accrot.errors import UsageError

# accum's increment options that make another kind of cell (the ablation's drift control, the frequency ladder, ...):
# the name carries them when they differ from the default, so two different cells never share a folder
NAME_MAX = 255  # bytes in one folder name on Linux's and macOS's filesystems
_NAMED_INCREMENT_OPTIONS = {"increment_mean": "zero", "increment_spread": "constant", "increment_family": "gaussian"}


def default_run_name(scheme) -> str:
    """The folder name of a run of ``scheme`` (a SchemeConfig) under ``--root``: its cell,
    ``rotation[-increments]-far_mass[-values]`` (``rope-none``, ``accum-learned-forget-values``), plus every setting
    that makes it another scheme than the cell's reference: the accum options that change what the increments are
    (``-mean_rope``, ``-spread_ladder``, ``-family_uniform``), a learned or PaTH projection other than the reference
    implementation's (``-plain``, ``-rank0``, ``-conv0``, ``-noladder``, ``-ladder10000``, ``-torchinit``), the
    ALiBi-initialised forget gate (``-alibi_init``), a RoPE base other than 10000 (``rope-none-base500000``), an
    output gate (``-gate``, ``-headgate``) and a per-layer pattern (``-layers_cell_none``). Two different cells
    never share a folder."""
    from accrot.position.config import REFERENCE

    parts = [scheme.rotation, scheme.increments, scheme.far_mass, "values" if scheme.rotate_values else None]
    if scheme.rotation == "accum":
        parts += [f"{k.removeprefix('increment_')}_{getattr(scheme, k)}" for k, off in _NAMED_INCREMENT_OPTIONS.items()
                  if getattr(scheme, k) != off]
    part = scheme.increments if scheme.rotation == "accum" else scheme.rotation
    if part == "learned" and scheme.learned_form != "selective":
        parts.append(scheme.learned_form)
    for name, ref in REFERENCE.get(part, {}).items():
        value = getattr(scheme, name)
        if value != ref:
            short = {"increment_rank": "rank", "path_rank": "rank", "conv_size": "conv", "ladder_base": "ladder"}
            parts.append(("ladder" if value else "noladder") if name == "learned_ladder" else f"{short[name]}{value:g}")
    if part in ("learned", "path") and scheme.learned_init_std != 0.02:
        parts.append("torchinit" if scheme.learned_init_std is None else f"init{scheme.learned_init_std:g}")
    if scheme.far_mass == "forget" and scheme.forget_init != "fox":
        parts.append(f"{scheme.forget_init}_init")
    if scheme.rotation == "rope" and scheme.rope_base != 10000.0:
        parts.append(f"base{scheme.rope_base:g}")
    parts.append({"none": None, "elementwise": "gate", "headwise": "headgate"}[scheme.output_gate])
    parts.append("layers_" + "_".join(scheme.layer_pattern) if scheme.layer_pattern else None)
    return "-".join(p for p in parts if p)


def check_run_name(root: str, name: str) -> None:
    """``--name`` is a folder inside ``--root`` (it may nest: ``--name=long/rope``); one that leaves it
    (``../x``, an absolute path) or names the root itself is a one-line UsageError."""
    base = Path(root).expanduser().absolute()
    target = Path(os.path.normpath(base / Path(name).expanduser()))
    if not str(name).strip() or target == base or base not in target.parents:
        raise UsageError(f"--name={name!r} is not valid; a run name is a folder inside --root ({str(root)!r}), "
                         "without '..' or an absolute path (e.g. --name=rope-long)")
    longest = max(Path(name).parts, key=lambda part: len(os.fsencode(part)))
    if len(os.fsencode(longest)) > NAME_MAX:  # the filesystem's limit on one folder name
        raise UsageError(f"--name={str(name)[:40]!r}... is not valid; a folder name is at most {NAME_MAX} bytes (this "
                         f"one is {len(os.fsencode(longest))}); give a shorter --name")


class RunDirs:
    """The directories one command created (outermost first) and the run directory it writes."""

    def __init__(self) -> None:
        self.created: list[Path] = []
        self.run_dir: Path | None = None

    def make(self, run_dir: Path, option: str = "--root", what: str = "the run directory") -> None:
        """Create the run directory now (recording what this command created) and prove it writable; ``option``
        and ``what``: how the one-line error names the command's own option and the folder."""
        self.run_dir = Path(run_dir)
        missing, p = [], Path(run_dir).absolute()
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        self.created.extend(reversed(missing))
        try:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            write_probe(Path(run_dir) / f".accrot-write-probe-{os.getpid()}")
        except OSError as err:
            raise UsageError(f"cannot write {what} {str(run_dir)!r} ({err.strerror or err}); pass a writable "
                             f"{option} with free space") from None

    def remove_incomplete(self) -> None:
        """Remove the run directory unless it holds a checkpoint; a parent folder this command created only if
        that is empty (another process may be writing a run of its own beside)."""
        for path in reversed(self.created):
            if not path.exists():
                continue
            if self.run_dir is not None and path.resolve() == self.run_dir.resolve():
                if not any(path.glob("checkpoints/*.ckpt")):
                    shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                path.rmdir()
            except OSError:
                pass


def write_probe(path: Path) -> None:
    """Write and fsync 4 KiB (an unwritable or full folder fails here), then remove it."""
    try:
        with open(path, "wb") as fh:
            fh.write(b"\0" * 4096)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        if path.exists():
            path.unlink()
