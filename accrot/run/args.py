"""From what a user types to what LightningCLI parses: shipped config names, config files checked before the
parser sees them (one line for a broken one), and ``fit --resume RUN_DIR`` rewritten to the run's own config and
last checkpoint."""

from __future__ import annotations

from pathlib import Path

from accrot.errors import UsageError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def config_path(name: str) -> Path:
    """A shipped config by name (``tiny``) or a path to a YAML file."""
    p = Path(name)
    if p.exists() or p.suffix in (".yaml", ".yml", ".json"):
        return p  # a path: a missing file is reported by the parser with its name
    shipped = CONFIG_DIR / f"{name}.yaml"
    if shipped.exists():
        return shipped
    valid = ", ".join(sorted(f.stem for f in CONFIG_DIR.glob("*.yaml")))
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
        doc = yaml.safe_load(text)
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
    clash = [a for a in rest if a in ("-c", "--config", "--ckpt_path", "--resume")
             or a.startswith(("--config=", "--ckpt_path=", "--resume="))]
    if clash:
        raise UsageError(f"--resume takes the run's own config.yaml and last checkpoint; drop {clash[0].split('=')[0]} "
                         "(overrides such as --trainer.max_steps=N are fine)")
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
