"""From what a user types to what LightingCLI and the other commands parse: shipped config names, config files
checked before the parser sees them (one line for a broken one), ``fit --resume RUN_DIR`` rewritten to the run's own
config and last checkpoint, data module classes, devices and lists of numbers (one line naming the option for a bad
one)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from accrot.errors import UsageError
from accrot.io import load_yaml
from accrot.options import Kind, read_dir, read_path

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def config_path(name: str) -> Path:
    """A shipped config by name (``tiny``) or a path to a YAML file."""
    p = Path(name)
    if p.is_dir():
        inside = p / "config.yaml"
        hint = f"its run's config is --config {inside}" if inside.is_file() else "pass a YAML file"
        raise UsageError(f"--config {name!r} is a folder, not a config file; {hint} (or a shipped config: "
                         f"{', '.join(sorted(f.stem for f in CONFIG_DIR.glob('*.yaml')))})")
    if p.exists():
        return p
    valid = ", ".join(sorted(f.stem for f in CONFIG_DIR.glob("*.yaml")))
    # a shipped config by its name (tiny) or by its file's name anywhere (tiny.yaml, small.yml, configs/tiny.yaml)
    stem = p.stem if p.suffix in (".yaml", ".yml") else p.name
    shipped = CONFIG_DIR / f"{stem}.yaml"
    if shipped.exists() and p.suffix in (".yaml", ".yml", "") and not p.is_absolute():
        return shipped
    if p.suffix in (".yaml", ".yml", ".json"):
        raise UsageError(f"--config {name!r}: no such file; pass a YAML config file, or a shipped config: {valid}")
    raise UsageError(f"config {name!r} is neither a YAML file nor a shipped config; shipped: {valid}")


def resolve_config_args(args: list[str]) -> list[str]:
    """Let ``--config tiny`` name a shipped config (``accrot/configs/tiny.yaml``); every config file is read and
    checked first (:func:`check_config_file`), so a broken one is one line naming the file."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg in ("-c", "--config") and i + 1 < len(out):
            out[i + 1] = str(check_config_file(config_path(out[i + 1])))
        elif arg.startswith("--config="):
            out[i] = "--config=" + str(check_config_file(config_path(arg.split("=", 1)[1])))
    return out


_SECTIONS = ("trainer", "model", "extrapolation")  # sections that hold options (data may name a class alone)


def check_config_file(path: Path) -> Path:
    """A config file that exists must be UTF-8 YAML holding a mapping whose option sections are mappings; a
    one-line UsageError naming the file otherwise (the parser would raise a decode error, a type error, or name
    ``<unicode string>``). A missing file is left to the parser, which names it."""
    import yaml

    if not path.is_file():
        return path
    where = f"config {str(path)!r}"
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not UTF-8 text (a binary file?); pass a YAML config such as "
                         "accrot/configs/tiny.yaml") from None
    except OSError as err:
        raise UsageError(f"{where} cannot be read ({err.strerror})") from None
    try:
        doc = load_yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UsageError(f"{where} is not valid YAML: {problem}{at}") from None
    if doc is None:
        raise UsageError(f"{where} is empty; a config holds trainer:, model: and data: sections "
                         "(see accrot/configs/tiny.yaml)")
    if not isinstance(doc, dict):
        raise UsageError(f"{where} holds a {type(doc).__name__} ({str(doc)[:40]!r}), not a mapping of sections "
                         "(trainer:, model:, data:)")
    for section in _SECTIONS:
        value = doc.get(section)
        if value is not None and not isinstance(value, dict):
            raise UsageError(f"{where}: {section}: {str(value)[:40]!r} is not valid; {section} holds its options "
                             f"as a mapping ({section}: {{key: value, ...}})")
    return path


RESUME_PLACES = ("--name", "--root")  # where a new run goes: a resumed run stays where it is


def resume_args(args: list[str]) -> tuple[list[str], Path | None]:
    """``fit --resume RUN_DIR [overrides]`` → ``fit --config RUN_DIR/config.yaml [overrides] --ckpt_path
    RUN_DIR/checkpoints/last.ckpt`` and the run directory; other arguments pass through unchanged."""
    from accrot.resume import last_checkpoint  # imports Lightning: not for a spec's or a command's --help

    where = [i for i, a in enumerate(args) if a == "--resume" or a.startswith("--resume=")]
    if not where:
        return args, None
    i = where[-1]
    if args[i] == "--resume":
        if i + 1 >= len(args):
            raise UsageError("--resume needs a run directory (runs/<name>/version_N)")
        value, rest = args[i + 1], args[:i] + args[i + 2 :]
    else:
        value, rest = args[i].split("=", 1)[1], args[:i] + args[i + 1 :]
    if not rest or rest[0] != "fit":
        raise UsageError("--resume is an option of accrot fit: accrot fit --resume RUN_DIR")
    clash = [a for a in rest if a in ("-c", "--config", "--ckpt_path", "--resume", "--init_from")
             or a.startswith(("--config=", "--ckpt_path=", "--resume=", "--init_from="))]
    if clash:
        raise UsageError(f"--resume takes the run's own config.yaml and last checkpoint; drop {clash[0].split('=')[0]} "
                         "(overrides such as --trainer.max_steps=N are fine)")
    placed = next((a.split("=")[0] for a in rest if a in RESUME_PLACES or a.startswith(tuple(f"{o}=" for o in
                                                                                           RESUME_PLACES))), None)
    if placed:  # the run continues in its own folder: a place given beside --resume would be dropped
        raise UsageError(f"--resume continues {value!r} in place, so {placed} cannot take effect; drop {placed}, or "
                         f"start a new run there from its weights: accrot fit --config RUN_DIR/config.yaml "
                         f"--init_from RUN_DIR {placed}=...")
    run = Path(value)
    if not run.is_dir():
        raise UsageError(f"--resume {value!r} is not a directory; pass a run directory such as runs/rope-none/version_0")
    if not (run / "config.yaml").is_file():
        raise UsageError(f"--resume {value!r} has no config.yaml; it is not an accrot run directory")
    ckpt = last_checkpoint(run)
    if not ckpt.is_file():
        raise UsageError(f"--resume {value!r} has no checkpoints/last.ckpt (the run stopped before its first "
                         "checkpoint); start it again")
    return ["fit", "--config", str(run / "config.yaml"), *rest[1:], f"--ckpt_path={ckpt}"], run.resolve()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a SLURM or cgroup share), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_device(device: str, flag: str = "--device") -> str:
    """A torch device this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``), or a one-line UsageError naming
    the valid ones: an unknown name (``gpu``), CUDA on a build or machine without it, an index past the last GPU."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        close = difflib.get_close_matches(str(device), ["cpu", "cuda", "mps"], n=1, cutoff=0.3)
        hint = "cuda" if str(device).lower() in ("gpu", "gpus", "nvidia") else close[0] if close else None
        raise UsageError(f"{flag}={device!r} is not a device; {f'did you mean {hint}? ' if hint else ''}devices "
                         f"here: {', '.join(available_devices())}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise UsageError(f"{flag}={device!r} needs a CUDA GPU, but {why} (torch {torch.__version__}); "
                             f"devices here: {', '.join(available_devices())}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"{flag}={device!r} is not valid; this machine has {torch.cuda.device_count()} CUDA "
                             f"device(s): devices here: {', '.join(available_devices())}")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"{flag}={device!r} needs Apple's MPS, which this machine lacks; devices here: "
                         f"{', '.join(available_devices())}")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"{flag}={device!r} is not valid; devices here: {', '.join(available_devices())}")
    return str(dev)


def available_devices() -> list[str]:
    """The devices ``--device`` may name on this machine."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        out += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        out.append("mps")
    return out


def data_module_class(class_path: str, where: str = "data"):
    """The data module class ``class_path`` names (``data_modules.PasskeyDataModule``, a short shipped name, or
    ``module.Class`` of one's own), or a one-line UsageError with the close match and the shipped ones."""
    import importlib
    import inspect

    import data_modules
    from data_modules import TokenStreamDataModule

    shipped = [n for n in data_modules.__all__ if inspect.isclass(getattr(data_modules, n))
               and issubclass(getattr(data_modules, n), TokenStreamDataModule)
               and n not in ("TokenStreamDataModule", "SyntheticDataModule")]
    module, _, name = str(class_path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module or "data_modules"), name)
    except (ImportError, AttributeError, ValueError):
        cls = None
    if inspect.isclass(cls) and issubclass(cls, TokenStreamDataModule):
        return cls
    close = difflib.get_close_matches(name, shipped, n=1, cutoff=0.6)
    hint = f"did you mean data_modules.{close[0]}? " if close else ""
    raise UsageError(f"{where}={class_path!r} is not a data module; {hint}shipped: {', '.join(sorted(shipped))} "
                     "(data_modules.NAME), or module.Class of your own (a TokenStreamDataModule)")


DEVICE = Kind("device", lambda flag, value: check_device(str(value), flag), ("gpu", "cuda:99", "bogus", ""),
              "a device this machine has (cpu, cuda, cuda:1, mps)")
READ_CKPT = read_path("a checkpoint (.ckpt) of an accrot run, or its run directory")
RESUME = read_dir("a run directory (runs/<name>/version_N)")  # resume_args reads it before LightningCLI does
