"""Nothing lost: atomic checkpoints, resumable metric logs, and finding and checking the run to resume.

A run killed at any moment (``SIGKILL``, OOM, preemption) resumes with ``accrot fit --resume RUN_DIR`` (or the
same command line plus ``--ckpt_path last``) into the *same* run directory and ends with exactly the metrics of
an uninterrupted run (on CPU, deterministic mode). What makes that so, piece by piece:

* weights, optimiser, LR schedule, loop counters, callbacks (the extrapolation history): Lightning's
  checkpoint, taken between steps (:class:`callbacks.checkpoint.ResumableCheckpoint`);
* the data order: a pure function of (seed, epoch) and a loader whose position is checkpointed
  (:class:`data_modules.streams.ResumableLoader`);
* the random increments of ``random_position`` schemes: their own counter-based stream whose count is in
  the weights (:class:`accrot.position.accum.RandomPositionIncrements`); training draws nothing else from
  torch's global RNG;
* ``metrics.csv``: the checkpoint records how many rows were logged when it was taken (they are flushed to
  disk first); a resumed run keeps exactly those rows and appends (:class:`ResumableCSVLogger`);
* the checkpoint file itself: written to a temporary sibling, fsynced and renamed over the old one
  (:class:`AtomicCheckpointIO`), so a kill during a save leaves the previous ``last.ckpt`` intact.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from accrot.position import SchemeConfig, facts
from accrot.position.config import saved_scheme

RECORD_KEY = "accrot"  # the checkpoint's section of accrot's own resume facts
PARTIAL = ".partial-"  # infix of a checkpoint being written: `last.ckpt.partial-<pid>` (never matches *.ckpt)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` to ``<path>.partial-<pid>``, fsync, ``os.replace`` over ``path``, fsync the directory.

    A reader (or a resumed run) sees the old checkpoint or the new one, never half of one. Remote paths
    (``s3://``, ...) go through Lightning's own writer. :meth:`preload` hands a checkpoint the CLI already read
    (to check it) to the next :meth:`load_checkpoint` of the same path, so it is read from disk once.
    """

    def __init__(self) -> None:
        super().__init__()
        self._preloaded: dict[str, dict] = {}

    def preload(self, path: str | Path, checkpoint: dict) -> None:
        self._preloaded[os.path.abspath(path)] = checkpoint

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        from accrot import phases

        with phases.timed("checkpoint"):
            self._save(checkpoint, path, storage_options)

    def _save(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        buf = io.BytesIO()  # serialise first: a failure to pickle never touches the disk
        torch.save(checkpoint, buf)
        tmp = path.with_name(f"{path.name}{PARTIAL}{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(buf.getbuffer())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as err:  # e.g. a full disk: name the file (the CLI turns it into one line)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise OSError(err.errno, err.strerror, str(path)) from err
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        fsync_dir(path.parent)

    def load_checkpoint(self, path, map_location: Any = lambda storage, loc: storage, weights_only: bool | None = None):
        checkpoint = self._preloaded.pop(os.path.abspath(path), None) if "://" not in str(path) else None
        if checkpoint is not None:
            return checkpoint
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_partials(folder: Path) -> None:
    """Delete checkpoints a killed process left half-written."""
    for p in Path(folder).glob(f"*{PARTIAL}*"):
        with contextlib.suppress(OSError):
            p.unlink()


# ---------------------------------------------------------------------------------------------------
# metrics.csv
# ---------------------------------------------------------------------------------------------------
class _Writer(ExperimentWriter):
    """Lightning's CSV writer, counting rows; resumed, it keeps the first ``keep`` rows of the file."""

    def __init__(self, log_dir: str, keep: int | None) -> None:
        self.keep = keep
        self.rows = 0
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        if self.keep is None:  # a new run: Lightning's behaviour (a fresh version directory is empty anyway)
            return super()._check_log_dir_exists()
        path = Path(self.metrics_file_path)
        rows: list[dict] = []
        if path.is_file():
            with open(path, newline="") as fh:
                rows = list(csv.DictReader(fh))[: self.keep]
        # the header of the kept rows: keys with a value in any of them, sorted as Lightning sorts them
        self.metrics_keys = sorted({k for row in rows for k, v in row.items() if v not in ("", None)})
        self.rows = len(rows)
        if rows:
            _write_csv(path, self.metrics_keys, rows)
        elif path.exists():
            path.unlink()

    def log_metrics(self, metrics_dict: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics_dict, step)
        self.rows += 1

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with open(self.metrics_file_path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        _write_csv(Path(self.metrics_file_path), fieldnames, rows)  # a kill mid-rewrite keeps the old file


def _write_csv(path: Path, fieldnames: list[str], rows: list[dict]) -> None:
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows({k: v for k, v in row.items() if k in fieldnames} for row in rows)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", newline="") as fh:
        fh.write(buf.getvalue())
    os.replace(tmp, path)


class ResumableCSVLogger(CSVLogger):
    """``CSVLogger`` that counts the rows it logged (:attr:`rows`), and that a resumed run reopens with
    ``keep_rows`` = the count its checkpoint recorded: later rows (logged after the checkpoint by the killed
    process) are dropped, so the resumed run's rows follow on exactly."""

    def __init__(self, *args, keep_rows: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._keep_rows = keep_rows

    @property
    @rank_zero_experiment
    def experiment(self) -> _Writer:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _Writer(self.log_dir, self._keep_rows)
        return self._experiment

    @property
    def rows(self) -> int:
        """Rows logged so far (global rank 0), the kept rows of a resumed run included."""
        return int(self.experiment.rows)


# ---------------------------------------------------------------------------------------------------
# the run to resume, and whether a checkpoint fits the model
# ---------------------------------------------------------------------------------------------------
def last_checkpoint(run_dir: Path) -> Path:
    """``checkpoints/last.ckpt``, or a checkpoint written after it (``last-v1.ckpt``, which Lightning wrote for a
    copied run directory before :class:`callbacks.checkpoint.ResumableCheckpoint` kept the name): the newest."""
    folder = Path(run_dir) / "checkpoints"
    last = folder / "last.ckpt"
    try:
        found = [(p.stat().st_mtime_ns, p == last, p) for p in folder.glob("*.ckpt") if p.is_file()]
    except OSError:
        return last
    return max(found)[2] if found else last  # the newest; a tie goes to last.ckpt


def latest_resumable_run(save_dir: str | Path, name: str) -> Path | None:
    """The highest ``<save_dir>/<name>/version_N`` that holds ``checkpoints/last.ckpt``."""
    found = []
    for d in Path(save_dir, name).glob("version_*"):
        suffix = d.name.removeprefix("version_")
        if suffix.isdigit() and last_checkpoint(d).is_file():
            found.append((int(suffix), d))
    return max(found)[1] if found else None


def _label(scheme: dict | None) -> str:
    config = SchemeConfig.of(scheme)
    return config.label() if config is not None else "an unknown scheme"


SHAPE_KEYS = ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_hidden", "tie_embeddings")


# scheme keys added after checkpoints were already being written, with the value such a checkpoint means
ADDED_SCHEME_KEYS = {"ssmax_init": 0.43, "output_gate": "none", "layer_pattern": None}


def _identity(scheme: dict | None) -> dict:
    """The scheme keys that decide what a checkpoint means. ``vocab_size`` follows the model's vocabulary
    (compared with the shapes); ``seed`` matters only where something is drawn at random (random increments, a
    learned mixing floor), and there as the value it resolves to (None, from a model built outside the CLI,
    is 0)."""
    if not scheme:
        return {}
    config = SchemeConfig.of(scheme)  # every field, as this version reads it (an earlier version's dict too)
    d = dataclasses.asdict(config) if config is not None else saved_scheme(scheme)
    d.pop("vocab_size", None)
    for key, default in ADDED_SCHEME_KEYS.items():  # a checkpoint older than a key means its default
        if d.get(key, default) == default:
            d.pop(key, None)
    random = facts(config).random if config is not None else True  # an unreadable scheme: keep what it says
    seed = d.pop("seed", None)
    if random:
        d["seed"] = 0 if seed is None else seed
    return d


RESUME_ADVICE = "resume a run with `accrot fit --resume RUN_DIR`, which uses its own config"


def check_fits(checkpoint: dict, model: torch.nn.Module, path: str | Path, advice: str = RESUME_ADVICE) -> str | None:
    """None if ``checkpoint``'s weights load into ``model`` (a LitLM); else a one-line reason naming what differs,
    ending with ``advice`` (what to do instead)."""
    hp = checkpoint.get("hyper_parameters") or {}
    mine = dict(getattr(model, "hparams", {}))
    theirs_scheme, my_scheme = _identity(hp.get("scheme")), _identity(mine.get("scheme"))
    if theirs_scheme and my_scheme and theirs_scheme != my_scheme:
        differ = sorted(k for k in set(theirs_scheme) | set(my_scheme) if theirs_scheme.get(k) != my_scheme.get(k))
        detail = ", ".join(f"{k}={theirs_scheme.get(k)!r} (config: {my_scheme.get(k)!r})" for k in differ[:3])
        return (f"checkpoint {str(path)!r} is of another scheme ({_label(theirs_scheme)}) than the config "
                f"({_label(my_scheme)}): {detail}; {advice}")
    for key in SHAPE_KEYS:
        if key in hp and key in mine and hp[key] != mine[key]:
            return (f"checkpoint {str(path)!r} has model.{key}={hp[key]!r} but the config builds model.{key}="
                    f"{mine[key]!r}; {advice}")
    weights = checkpoint.get("state_dict") or {}
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    wrong = [k for k in own if k in weights and hasattr(weights[k], "shape") and hasattr(own[k], "shape")
             and tuple(weights[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        what = (f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}" if unexpected else
                f"{wrong[0]} has shape {tuple(weights[wrong[0]].shape)}, the model {tuple(own[wrong[0]].shape)}")
        return f"checkpoint {str(path)!r} does not fit the model of the config ({what})"
    return None


# data settings a resumed run may change: how the batches are loaded, not which batches they are
RESUMABLE_DATA_KEYS = frozenset({"num_workers"})


def _settings(hparams: dict | None, prefix: str) -> dict[str, Any]:
    """Flat ``{prefix.key: value}`` of saved hyperparameters, bookkeeping keys dropped; ``_class_path`` becomes
    ``prefix.class_path`` (the data module's class)."""
    out: dict[str, Any] = {}
    for key, value in (hparams or {}).items():
        if key == "_class_path":
            out[f"{prefix}.class_path"] = value
        elif not key.startswith("_"):
            out[f"{prefix}.{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def settings_differences(checkpoint: dict, model_hparams: dict, data_hparams: dict | None = None,
                         data_keys: frozenset[str] | None = None) -> list[str]:
    """``key=saved (config: new)`` for every model, scheme and data setting where the config differs from the
    run the checkpoint was trained by. Data keys: every one but :data:`RESUMABLE_DATA_KEYS`, or only
    ``data_keys`` when given. A key one side does not record (an older checkpoint) is not compared."""
    saved_model, mine = dict(checkpoint.get("hyper_parameters") or {}), dict(model_hparams or {})
    saved = {**_settings({k: v for k, v in saved_model.items() if k != "scheme"}, "model"),
             **_settings(_identity(saved_model.get("scheme")), "model.scheme")}
    new = {**_settings({k: v for k, v in mine.items() if k != "scheme"}, "model"),
           **_settings(_identity(mine.get("scheme")), "model.scheme")}
    theirs_data = _settings(checkpoint.get("datamodule_hyper_parameters"), "data")
    if data_hparams is not None and theirs_data:
        mine_data = _settings(data_hparams, "data")
        for key in set(theirs_data) | set(mine_data):
            name = key.removeprefix("data.")
            if name in RESUMABLE_DATA_KEYS or (data_keys is not None and name not in data_keys):
                continue
            saved[key], new[key] = theirs_data.get(key), mine_data.get(key)
    return [f"{k}={saved[k]!r} (config: {new[k]!r})" for k in sorted(set(saved) & set(new)) if saved[k] != new[k]]


def read_checkpoint(path: str | Path) -> dict:
    """The checkpoint dict, or ValueError with a one-line reason (missing, unreadable, not accrot's)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist; pass the path of a .ckpt file")
    try:
        state = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any failure to read is the same bad input
        raise ValueError(f"checkpoint {str(path)!r} is not a readable accrot checkpoint ({type(err).__name__})") from err
    if not isinstance(state, dict) or "state_dict" not in state or "hyper_parameters" not in state:
        raise ValueError(f"checkpoint {str(path)!r} is not a readable accrot checkpoint (no weights or hyperparameters)")
    return state
