"""Loading what a run left: its checkpoint (checked to be accrot's and to fit the model it names), its config and
data module, for the commands that read a finished run (``accrot eval``, ``accrot diagnose``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

from accrot.errors import UsageError, one_line
from accrot.lit import LitLM
from accrot.resume import read_checkpoint, settings_differences
from accrot.run.args import check_config_file


def load_data_module(config_file: Path, overrides: dict | None = None):
    """Instantiate the ``data`` section of a run's resolved ``config.yaml``."""
    cfg = yaml.safe_load(config_file.read_text()) or {}
    data = cfg.get("data") or {}
    if "class_path" not in data:
        raise UsageError(f"{config_file} has no data.class_path; pass --config with the run's config.yaml")
    module, _, cls = data["class_path"].rpartition(".")
    kwargs = dict(data.get("init_args") or {})
    kwargs.update(overrides or {})
    return getattr(importlib.import_module(module), cls)(**kwargs)


def resolve_run(ckpt: str, config: str | None) -> tuple[Path, Path, Path]:
    """``(checkpoint, run directory, config.yaml)`` of a run's checkpoint; a one-line UsageError if one is missing."""
    path = Path(ckpt)
    if not path.is_file():
        raise UsageError(f"checkpoint {str(path)!r} does not exist; pass the path of a .ckpt file")
    run_dir = path.resolve().parent.parent  # <run>/checkpoints/x.ckpt
    cfg = Path(config) if config else run_dir / "config.yaml"
    if not cfg.is_file():
        raise UsageError(f"config {str(cfg)!r} does not exist; pass --config with the run's config.yaml")
    return path, run_dir, check_config_file(cfg)


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
    if vocab is not None and saved.get("vocab_size") is not None and int(vocab) > int(saved["vocab_size"]):
        differ.append(f"data vocabulary {vocab} tokens (the model has {saved['vocab_size']})")
    if differ:
        raise UsageError(f"--config {str(config)!r} describes another model than checkpoint {str(ckpt)!r}: "
                         f"{', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}; evaluate with the run's own "
                         "config.yaml (the default), or a config that changes only the data")
