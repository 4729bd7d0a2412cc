"""Loading what a run left: its checkpoint (checked to be accrot's and to fit the model it names), its config and
data module, for the commands that read a finished run (``accrot eval``, ``accrot diagnose``)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from accrot.errors import BadInput, UsageError, one_line
from accrot.lit import LitLM
from accrot.resume import last_checkpoint, read_checkpoint, settings_differences
from accrot.run.args import check_config_file, data_module_class
from accrot.run.rundir import RunDirs

if TYPE_CHECKING:
    from data_modules.task import Task


def load_data_module(config_file: Path, overrides: dict | None = None) -> Task:
    """Instantiate the ``data`` section of a run's resolved ``config.yaml`` (or of ``eval --config``, which may name
    another data module); a class that does not exist, an option it does not take or a value it refuses is one
    line naming the config."""
    cfg = yaml.safe_load(config_file.read_text()) or {}
    data = cfg.get("data") or {}
    where = f"config {str(config_file)!r}: data"
    if isinstance(data, str):  # `data: data_modules.PasskeyDataModule`, the class alone with its defaults
        data = {"class_path": data}
    if not isinstance(data, dict) or "class_path" not in data:
        raise UsageError(f"{where} has no class_path; pass --config with the run's config.yaml, or a config whose "
                         "data: names a class_path (and its init_args)")
    cls = data_module_class(data["class_path"], f"{where}.class_path")
    kwargs = dict(data.get("init_args") or {})
    kwargs.update(overrides or {})
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        options = [n for n in params if n != "self"]
        unknown = [k for k in kwargs if k not in options]
        if unknown:
            raise UsageError(f"{where}.init_args.{unknown[0]} is not an option of {data['class_path']}; its options: "
                             f"{', '.join(options)}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        if isinstance(err, BadInput):
            raise
        raise UsageError(f"{where}: {data['class_path']} refuses its init_args: {one_line(str(err))}") from err


def find_checkpoint(ckpt: str) -> Path:
    """``--ckpt``: a .ckpt file, or a run directory (its newest checkpoint, ``checkpoints/last.ckpt``); a one-line
    UsageError otherwise."""
    path = Path(ckpt)
    if path.is_dir():
        found = last_checkpoint(path)
        if found.is_file():
            return found
        raise UsageError(f"--ckpt {str(path)!r} is a directory without checkpoints/last.ckpt; pass a run directory "
                         "that holds one, or the path of a .ckpt file")
    if not path.is_file():
        raise UsageError(f"checkpoint {str(path)!r} does not exist; pass the path of a .ckpt file or a run directory")
    return path


def run_config(ckpt: Path, config: str | None) -> tuple[Path, Path]:
    """``(run directory, config.yaml)`` of an accrot checkpoint, ``<run>/checkpoints/x.ckpt`` beside
    ``<run>/config.yaml``; ``--config`` names another. A one-line UsageError if there is none."""
    run_dir = ckpt.resolve().parent.parent
    if config:
        cfg = Path(config)
        if not cfg.is_file():
            raise UsageError(f"--config {str(cfg)!r} does not exist; pass the run's config.yaml (or a config that "
                             "changes only its data)")
        return run_dir, check_config_file(cfg)
    cfg = run_dir / "config.yaml"
    if ckpt.resolve().parent.name != "checkpoints" or not cfg.is_file():
        raise UsageError(f"checkpoint {str(ckpt)!r} is not inside a run directory (RUN/checkpoints/x.ckpt beside "
                         "RUN/config.yaml); pass --config with its run's config.yaml")
    return run_dir, check_config_file(cfg)


def open_checkpoint(ckpt: str, config: str | None) -> tuple[Path, LitLM, dict, Path, Path]:
    """``--ckpt`` and ``--config`` of ``accrot eval`` / ``diagnose``: ``(checkpoint, model, its state, run directory,
    config.yaml)``. The checkpoint is read before its config is looked for, so a corrupt one is named as such."""
    path = find_checkpoint(ckpt)
    model, state = load_checkpoint(path)
    run_dir, cfg = run_config(path, config)
    return path, model, state, run_dir, cfg


@contextlib.contextmanager
def output_folder(out: Path) -> Iterator[Path]:
    """``--out`` made and proven writable now, before any computing; if the body fails, a folder this command made
    is removed (nothing half-written) and a write that failed mid-way names its file and ``--out``. One-line
    UsageErrors naming ``--out``."""
    if (Path(out) / "run.json").is_file():  # a run's own folder: its training wrote extrapolation.json and figures
        raise UsageError(f"--out {str(out)!r} is a run directory (it holds run.json): what the training wrote there "
                         "would be overwritten; pass another --out, or leave it out (the default is a folder of its "
                         "own inside the run)")
    dirs = RunDirs()
    dirs.make(out, option="--out", what="the output folder")  # and held: one writer per folder
    try:
        yield out
    except BaseException as err:
        dirs.remove_incomplete()
        if isinstance(err, OSError) and err.filename:  # a disk that filled: bad input, not a bug
            raise UsageError(f"cannot write {str(err.filename)!r} ({err.strerror}); pass a writable --out with free "
                             "space") from None
        raise
    finally:
        dirs.release()


def provenance(command: str, argv: list[str], ckpt: Path) -> dict:
    """What a result file of ``accrot eval`` / ``diagnose`` records of what produced it, as a run's own run.json
    does: the command as typed, the code's revision and the checkpoint it read."""
    from accrot.io import git_revision

    return {"command": ["accrot", command, *argv], "revision": git_revision(), "checkpoint": str(ckpt)}


def load_checkpoint(path: str | Path):
    """``(LitLM, checkpoint dict)`` from an accrot checkpoint, or a one-line UsageError (corrupt, not accrot's,
    or weights that do not fit the scheme it names)."""
    try:
        state = read_checkpoint(path)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        # LightningCLI adds bookkeeping keys (``_instantiator``, ``_class_path``) beside the init arguments
        hparams = {k: v for k, v in state["hyper_parameters"].items() if not k.startswith("_")}
        model = LitLM(**hparams)
        model.load_state_dict(state["state_dict"], strict=True)
    except (TypeError, RuntimeError, ValueError) as err:
        raise UsageError(f"checkpoint {str(path)!r} does not match the model it describes: {one_line(str(err))[:200]}") from err
    return model, state


def check_eval_config(ckpt: Path, state: dict, config: Path, dm) -> None:
    """``eval --config``: the model is the checkpoint's own, so a config whose model section (or training length,
    or vocabulary) says otherwise is refused, naming the keys, rather than ignored. Other data is fine."""
    given = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
    saved = dict(state.get("hyper_parameters") or {})
    wanted = {k: v for k, v in given.items() if k != "scheme" and k in saved}
    scheme = {**(saved.get("scheme") or {}), **(given.get("scheme") or {})}
    if (given.get("scheme") or {}).get("seed", 0) is None:  # "follow the run's seed": the saved value stands
        scheme["seed"] = (saved.get("scheme") or {}).get("seed")
    differ = settings_differences(state, {**saved, **wanted, "scheme": scheme}, dict(dm.hparams),
                                  data_keys=frozenset({"seq_len"}))
    vocab = getattr(dm, "vocab_size", None)
    if vocab is not None and saved.get("vocab_size") is not None and int(vocab) != int(saved["vocab_size"]):
        # another vocabulary is another tokenisation (bytes vs a task's symbols): the model cannot read it
        differ.append(f"data vocabulary {vocab} tokens (the model reads {saved['vocab_size']})")
    if differ:
        raise UsageError(f"--config {str(config)!r} describes another model than checkpoint {str(ckpt)!r}: "
                         f"{', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}; evaluate with the run's own "
                         "config.yaml (the default), or a config that changes only the data")
