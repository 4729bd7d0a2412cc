"""The bad-input catalogue: every bad input the CLI, the sweep specs, the data modules and the storages reject,
each run through ``accrot.cli.main`` as a user would type it. Each must end with exit status 2 and one line
``accrot: error: ...`` naming the offending value and what would be valid, no traceback, and nothing left behind
(no run directory, no study storage).

Reading it as a catalogue: ``CATALOGUE`` (below the fixtures) is grouped by a comment per section (the command line
and configs, data, the output folder, checkpoints, sweeps and storages, SLURM launches, the ablation; then one section per rule that nothing passes silently: checked before anything is created, every option takes effect or is refused, a result overwrites nothing, every command at one standard). In each
``Row``, ``id`` names the case; ``input`` is what the user types: a flag alone (``--model.d_modle=3``) is added to
the section's command (``accrot fit --config tiny``; ``accrot sweep`` among the storages), words describe the file
or condition it is posed in, and a name in capitals (``ROPE_RUN.ckpt``, ``EMPTY_DIR``) stands for the case's file or
folder, which ``Fixtures`` makes; ``argv`` is the exact command; ``expect`` holds fragments of the one-line message
it must print. To see a message whole, type the input (``.venv/bin/accrot fit --config tiny
--model.d_modle=3``); ``make faults`` (``tests/helpers/fault_injection.py``, which shares ``CATALOGUE``) tries every row and
counts the clean rejections.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shlex
import shutil
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
QUICK = ["--trainer.max_steps=1", "--trainer.enable_progress_bar=false", "--wandb=disabled",
         "--extrapolation.budget_tokens=512", "--trainer.limit_val_batches=1"]


class Fixtures:
    """Files the rows need, made on first use under ``workdir`` (a small corpus, a rope checkpoint, ...)."""

    def __init__(self, workdir: Path) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.runs = self.dir / "runs"  # every fit row's --root: must stay empty
        self.sweeps = self.dir / "sweeps"  # every sweep row's --root: must stay empty

    def _once(self, name: str, make: Callable[[Path], None]) -> Path:
        path = self.dir / name
        if not path.exists():
            make(path)
        return path

    # -- data ------------------------------------------------------------------------------------------
    @property
    def corpus(self) -> Path:
        """20 small Python files: enough for tiny's seq_len and batch size, quick to load."""
        def make(p: Path) -> None:
            p.mkdir()
            for i in range(20):
                (p / f"mod{i:02d}.py").write_text("".join(f"value_{i}_{j} = {j} * {i}\n" for j in range(300)))
        return self._once("corpus", make)

    def fit(self, *extra: str, corpus: bool = True) -> list[str]:
        data = [f"--data.init_args.root={self.corpus}", "--data.init_args.val_fraction=0.3"] if corpus else []
        return ["fit", "--config", "tiny", f"--root={self.runs}", *QUICK, *data, *extra]

    def devices_config(self) -> Path:
        """tiny.yaml asking for 4 devices."""
        def make(p: Path) -> None:
            p.write_text((REPO / "accrot" / "configs" / "tiny.yaml").read_text().replace("devices: 1", "devices: 4"))
        return self._once("devices4.yaml", make)

    def local_runs(self) -> bool:
        """The runs folder is on a node-local filesystem (tmpfs, ext4, ...), as a workstation's /tmp is."""
        from accrot.sweep.slurm import LOCAL_FS, filesystem_type

        return filesystem_type(self.runs) in LOCAL_FS

    def empty_dir(self) -> Path:
        return self._once("empty", lambda p: p.mkdir())

    def empty_files(self) -> Path:
        def make(p: Path) -> None:
            p.mkdir()
            for i in range(3):
                (p / f"m{i}.py").touch()
        return self._once("empty-files", make)

    def unreadable(self) -> Path | None:
        """A corpus with a file that cannot be read: no read permission, or (for root, who may read anything
        else) a link to a write-only sysfs attribute; None where neither exists."""
        if os.geteuid() == 0:
            import glob

            target = next(iter(sorted(glob.glob("/sys/devices/pci*/*/rescan"))), None)
            if target is None:
                return None

        def make(p: Path) -> None:
            shutil.copytree(self.corpus, p)
            bad = p / "mod00.py"
            if os.geteuid() != 0:
                bad.chmod(0)
            else:
                bad.unlink()
                bad.symlink_to(target)
        return self._once("unreadable", make)

    def corrupt_in_run(self) -> Path:
        """broken.ckpt inside a run directory (with its config.yaml), as `accrot eval` expects."""
        def make(p: Path) -> None:
            p.parent.mkdir(parents=True)
            shutil.copy(REPO / "accrot/configs/tiny.yaml", p.parent.parent / "config.yaml")
            p.write_bytes(b"PK\x03\x04 not really a checkpoint")
        return self._once("corrupt-run/checkpoints/broken.ckpt", make)

    def non_utf8(self) -> Path:
        return self._once("latin1.txt", lambda p: p.write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1") * 200))

    def jsonl(self) -> Path:
        return self._once("docs.jsonl", lambda p: p.write_text("".join(
            f'{{"text": "document {i} " , "id": {i}}}\n' for i in range(200))))

    def a_file(self) -> Path:
        return self._once("a-file", lambda p: p.write_text("not a folder\n"))

    def read_only(self) -> Path | None:
        """A folder this process cannot create anything in (None where there is none: root, writable /sys)."""
        if os.geteuid() != 0:
            path = self._once("read-only", lambda p: p.mkdir())
            path.chmod(0o555)
            return path
        probe = Path("/sys/accrot-bad-input-probe")
        try:
            probe.mkdir()
        except OSError:
            return Path("/sys")
        probe.rmdir()
        return None

    # -- config files ----------------------------------------------------------------------------------
    def config_file(self, name: str, text: str | bytes) -> Path:
        path = self.dir / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    def tiny_with(self, name: str, old: str, new: str) -> Path:
        """tiny.yaml with one edit (and the fixture corpus as its data, so only the edit is wrong)."""
        text = (REPO / "accrot" / "configs" / "tiny.yaml").read_text()
        assert old in text, old
        text = text.replace(old, new).replace(
            "    seq_len: 128", f"    seq_len: 128\n    root: {self.corpus}\n    val_fraction: 0.3")
        return self.config_file(name, text)

    def other_data_config(self, name: str, data: str) -> Path:
        """A config for ``accrot eval --config``: the run's own, its data section replaced by ``data`` (YAML)."""
        import yaml

        doc = yaml.safe_load((self.plain_run() / "config.yaml").read_text())
        doc["data"] = yaml.safe_load(data)["data"]
        return self.config_file(name, yaml.safe_dump(doc, sort_keys=False))

    def edited_run(self, name: str, old: str, new: str) -> Path:
        """A real run with a checkpoint (one step, its own --root), whose config.yaml was then edited."""
        run = self.dir / "edited" / name / "version_0"
        if not run.exists():
            from accrot.cli import main

            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                rc = main([*self.fit(f"--root={self.dir / 'edited'}", f"--name={name}")])
            assert rc == 0 and (run / "checkpoints" / "last.ckpt").is_file(), "could not train the run the row needs"
            text = (run / "config.yaml").read_text()
            assert old in text, old
            (run / "config.yaml").write_text(text.replace(old, new))
        return run

    def plain_run(self) -> Path:
        """A real run of the tiny recipe (NoPE) with its checkpoint and config, unedited."""
        return self.edited_run("plain", "seq_len: 128", "seq_len: 128")

    # -- checkpoints -----------------------------------------------------------------------------------
    def rope_checkpoint(self) -> Path:
        """Weights and hyperparameters of tiny's model shape with RoPE (what `accrot fit` saves, minus loops)."""
        def make(p: Path) -> None:
            import torch

            from accrot.lit import LitLM
            from accrot.position import SchemeConfig

            model = LitLM(d_model=64, n_layers=2, n_heads=4, scheme=SchemeConfig(rotation="rope"))
            torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, p)
        return self._once("rope.ckpt", make)

    def corrupt_checkpoint(self) -> Path:
        return self._once("broken.ckpt", lambda p: p.write_bytes(b"PK\x03\x04 not really a checkpoint"))

    def run_without_checkpoint(self) -> Path:
        def make(p: Path) -> None:
            p.mkdir(parents=True)
            shutil.copy(REPO / "accrot/configs/tiny.yaml", p / "config.yaml")
        return self._once("killed-early/version_0", make)

    # -- sweeps ----------------------------------------------------------------------------------------
    def spec(self, name: str, **changes) -> Path:
        import yaml

        from accrot.sweep.spec import SPEC_DIR

        doc = yaml.safe_load((SPEC_DIR / "smoke.yaml").read_text())
        doc["name"] = name.split("-")[0]
        doc.update(changes)
        doc["overrides"] = {**doc.get("overrides", {}), **changes.get("overrides", {}),
                            "data.init_args.root": str(self.corpus), "data.init_args.val_fraction": 0.3,
                            "extrapolation.budget_tokens": 512}
        path = self.dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def existing_ablation(self) -> Path:
        """A results folder holding ablation `taken-ablation` (2 seeds), created but not run (``--workers 0``)."""
        out = self.dir / "ablations"
        if not (out / "taken-ablation").exists():
            from accrot.cli import main

            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                rc = main(["ablation", "--study=taken-ablation", "--seeds=2", "--workers=0", "--variants=[NoPE]",
                           "--datasets=[corpus]", f"--out={out}"])
            assert rc == 0, "could not create the ablation the row needs"
        return out

    def existing_study(self) -> str:
        """A SQLite storage that holds study `taken`, created from another spec than the row's."""
        storage = self.dir / "studies" / "taken.db"
        if not storage.exists():
            from accrot.cli import main

            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                rc = main(["sweep", str(self.spec("taken-first")), f"--root={self.dir / 'studies'}", "--workers=0",
                           f"--storage=sqlite:///{storage}"])
            assert rc == 0, "could not create the study the duplicate row needs"
        return f"sqlite:///{storage}"


    def bare_proxy(self) -> int:
        """The port of Optuna's own gRPC storage proxy (``optuna.storages.run_grpc_proxy_server``'s server, in
        memory), which has no budget lock; stopped when the tests end."""
        if not hasattr(self, "_bare"):
            import atexit

            from optuna.storages import InMemoryStorage
            from optuna.storages._grpc.server import make_server

            port = free_port()
            self._bare = make_server(InMemoryStorage(), "127.0.0.1", port)
            self._bare.start()
            self._bare_port = port
            atexit.register(self._bare.stop, 0)
        return self._bare_port

    def taken_port(self) -> int:
        """A port something listens on (a socket held open until the tests end)."""
        if not hasattr(self, "_taken"):
            import atexit

            self._taken = socket.socket()
            self._taken.bind(("127.0.0.1", 0))
            self._taken.listen()
            atexit.register(self._taken.close)
        return self._taken.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def disk_full() -> Iterator[None]:
    """The run directory's first write fails as on a full disk (ENOSPC), as a real full disk would."""
    import accrot.run.rundir as rundir

    def full(path: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    saved, rundir.write_probe = rundir.write_probe, full
    try:
        yield
    finally:
        rundir.write_probe = saved


_ABSENT = object()


@contextlib.contextmanager
def _swapped(mapping, key: str, value) -> Iterator[None]:
    """``mapping[key] = value`` for one row, then the old entry (or none) back."""
    saved = mapping.get(key, _ABSENT)
    mapping[key] = value
    try:
        yield
    finally:
        if saved is _ABSENT:
            mapping.pop(key, None)
        else:
            mapping[key] = saved


def environment(name: str, value: str) -> contextlib.AbstractContextManager:
    """``name=value`` in the environment for the row, as a user would export it."""
    return _swapped(os.environ, name, value)


@dataclass(frozen=True)
class Row:
    """One bad input: what the user types (``input``), the argv it becomes, and a fragment of the one-line
    message it must produce."""

    id: str
    input: str
    argv: Callable[[Fixtures], list[str] | None]  # None: this machine cannot pose the case (skipped)
    expect: str | tuple[str, ...]  # every fragment must be in the message
    simulate: Callable[[], contextlib.AbstractContextManager] | None = None


def _ablation(id_: str, words: str, expect: str | tuple[str, ...], note: str = "", **kw) -> Row:
    """``accrot ablation WORDS`` (``note``: the condition it is posed in, in words), with the fixtures' sweeps
    folder as ``--out`` (it must stay empty)."""
    return Row(id_, f"accrot ablation {words}" + (f" ({note})" if note else ""),
               lambda f: ["ablation", *shlex.split(words), f"--out={f.sweeps}"], expect, **kw)


CATALOGUE: list[Row] = [
    # -- the command line and configs --------------------------------------------------------------------
    Row("unknown-key", "--model.d_modle=3", lambda f: f.fit("--model.d_modle=3"),
        "unknown key 'model.d_modle'; did you mean model.d_model"),
    Row("unknown-data-argument", "--data.init_args.seq_lem=64", lambda f: f.fit("--data.init_args.seq_lem=64"),
        "unknown key 'data.init_args.seq_lem'; did you mean data.init_args.seq_len?"),
    Row("data-argument-no-match", "--data.init_args.bogus=3", lambda f: f.fit("--data.init_args.bogus=3"),
        "unknown key 'data.init_args.bogus'; data_modules.StdlibDataModule takes: batch_size,"),
    Row("unknown-value", "--model.scheme.rotation=bogus", lambda f: f.fit("--model.scheme.rotation=bogus"),
        "model.scheme.rotation='bogus' is not valid; choose one of 'none', 'rope', 'accum', 'path'"),
    Row("wrong-type", "--data.init_args.seq_len=abc", lambda f: f.fit("--data.init_args.seq_len=abc"),
        "data.seq_len='abc' is not valid; expected int"),
    Row("out-of-range-scheme", "--model.scheme.sigma=-1", lambda f: f.fit("--model.scheme.sigma=-1"),
        "sigma=-1.0 is not valid; it must be a positive number"),
    Row("out-of-range-model", "--model.d_model=0", lambda f: f.fit("--model.d_model=0"),
        "d_model=0 is not valid; it must be a positive integer"),
    Row("negative-lr", "--model.lr=-1e-3", lambda f: f.fit("--model.lr=-1e-3"),
        "model.lr=-0.001 is not valid; it must be a positive number"),
    Row("zero-lr", "--model.lr=0", lambda f: f.fit("--model.lr=0"), "model.lr=0"),
    Row("negative-warmup", "--model.warmup_steps=-1", lambda f: f.fit("--model.warmup_steps=-1"),
        "model.warmup_steps=-1 is not valid; it must be an integer >= 0"),
    Row("window-beyond-float32", "--model.scheme.rotation=accum --model.scheme.increments=random_position "
        "--model.scheme.window=1e12",
        lambda f: f.fit("--model.scheme.rotation=accum", "--model.scheme.increments=random_position",
                        "--model.scheme.window=1e12"),
        "window=1000000000000.0 is not valid; at most 2^24 = 16777216 tokens"),
    Row("evaluation-length-twice", "--extrapolation.multipliers=[1, 2, 2]",
        lambda f: f.fit("--extrapolation.multipliers=[1, 2, 2]"), "multipliers=[1.0, 2.0, 2.0] is not valid; 2 given twice"),
    Row("out-of-range-data", "--data.init_args.seq_len=0", lambda f: f.fit("--data.init_args.seq_len=0"),
        "seq_len=0 is not valid; use an integer >= 2"),
    Row("one-token-windows", "--data.init_args.seq_len=1", lambda f: f.fit("--data.init_args.seq_len=1"),
        "seq_len=1 is not valid; use an integer >= 2"),
    # every setting that leaves a fit with no training step, not only max_steps and max_epochs
    Row("no-train-batches", "--trainer.limit_train_batches=0", lambda f: f.fit("--trainer.limit_train_batches=0"),
        "trainer.limit_train_batches=0 is not valid: the run would train no step"),
    Row("no-train-fraction", "--trainer.limit_train_batches=0.0",
        lambda f: f.fit("--trainer.limit_train_batches=0.0"),
        "trainer.limit_train_batches=0.0 is not valid: the run would train no step"),
    Row("sliding-stride-without-sliding", "--extrapolation.sliding_stride=64",
        lambda f: f.fit("--extrapolation.sliding_stride=64"),
        "sliding_stride=64 has no effect without sliding_multipliers"),
    # Trainer and callback values Lightning takes and then fails on mid-run, or that silently invert training
    Row("val-check-interval-zero", "--trainer.val_check_interval=0",
        lambda f: f.fit("--trainer.val_check_interval=0"), "trainer.val_check_interval=0 is not valid"),
    Row("accumulate-zero", "--trainer.accumulate_grad_batches=0",
        lambda f: f.fit("--trainer.accumulate_grad_batches=0"), "trainer.accumulate_grad_batches=0 is not valid"),
    Row("negative-clip", "--trainer.gradient_clip_val=-1", lambda f: f.fit("--trainer.gradient_clip_val=-1"),
        "trainer.gradient_clip_val=-1 is not valid; give a norm >= 0"),
    Row("negative-seed", "--seed_everything=-1", lambda f: f.fit("--seed_everything=-1"),
        "seed_everything=-1 is not valid"),
    Row("extrapolation-batch-zero", "--extrapolation.max_batch_tokens=0",
        lambda f: f.fit("--extrapolation.max_batch_tokens=0"), "max_batch_tokens=0 is not valid"),
    Row("extrapolation-filename-empty", "--extrapolation.filename=",
        lambda f: f.fit("--extrapolation.filename="), "filename='' is not valid; give a file name ending in .json"),
    Row("extrapolation-filename-in-a-folder", "--extrapolation.filename=sub/x.json",
        lambda f: f.fit("--extrapolation.filename=sub/x.json"), "filename='sub/x.json' is not valid"),
    Row("out-of-range-trainer", "--trainer.max_steps=-5", lambda f: f.fit("--trainer.max_steps=-5"),
        "`max_steps` must be a non-negative integer or -1"),
    Row("out-of-range-evaluation", "--extrapolation.multipliers=[0]", lambda f: f.fit("--extrapolation.multipliers=[0]"),
        "multipliers=[0.0] is not valid; give positive multiples of the training length"),
    Row("impossible-combination", "--model.scheme.increments=learned (no accum)",
        lambda f: f.fit("--model.scheme.increments=learned"), "increments='learned' needs rotation='accum'"),
    Row("option-for-another-kind", "--model.scheme.rotation=accum --model.scheme.increments=softplus "
        "--model.scheme.conv_size=4",
        lambda f: f.fit("--model.scheme.rotation=accum", "--model.scheme.increments=softplus",
                        "--model.scheme.conv_size=4"),
        "conv_size=4 needs increments='learned' (got increments='softplus')"),
    Row("unknown-learned-form", "--model.scheme.learned_form=tanh",
        lambda f: f.fit("--model.scheme.learned_form=tanh"),
        "model.scheme.learned_form='tanh' is not valid; choose one of 'selective', 'plain'"),
    Row("negative-scheme-weight-decay", "--model.scheme_weight_decay=-0.1",
        lambda f: f.fit("--model.scheme_weight_decay=-0.1"),
        "model.scheme_weight_decay=-0.1 is not valid; it must be a number >= 0"),
    Row("impossible-values-with-path", "--model.scheme.rotation=path --model.scheme.rotate_values=true",
        lambda f: f.fit("--model.scheme.rotation=path", "--model.scheme.rotate_values=true"),
        "rotate_values=true needs an SO(2) rotation (rope or accum), not rotation='path'"),
    Row("layer-pattern-entry", "--model.scheme.rotation=rope --model.scheme.layer_pattern=[cell,rope]",
        lambda f: f.fit("--model.scheme.rotation=rope", "--model.scheme.layer_pattern=[cell,rope]"),
        "layer_pattern entry='rope' is not valid; choose one of 'cell', 'none'"),
    Row("layer-pattern-not-a-list", "--model.scheme.rotation=rope --model.scheme.layer_pattern=cell",
        lambda f: f.fit("--model.scheme.rotation=rope", "--model.scheme.layer_pattern=cell"),
        "model.scheme.layer_pattern='cell' is not valid; give a list in brackets ([a, b, ...]) or null"),
    Row("layer-pattern-beyond-the-layers",
        "--model.scheme.rotation=rope --model.scheme.layer_pattern=[cell,cell,cell,none] (tiny: 2 layers)",
        lambda f: f.fit("--model.scheme.rotation=rope", "--model.scheme.layer_pattern=[cell,cell,cell,none]"),
        "makes every one of n_layers=2 layers the cell"),
    Row("unknown-output-gate", "--model.scheme.output_gate=sigmoid",
        lambda f: f.fit("--model.scheme.output_gate=sigmoid"),
        "model.scheme.output_gate='sigmoid' is not valid; choose one of 'none', 'elementwise', 'headwise'"),
    Row("odd-head-dim", "--model.n_heads=8 --model.d_model=72 --model.scheme.rotation=rope",
        lambda f: f.fit("--model.n_heads=8", "--model.d_model=72", "--model.scheme.rotation=rope"), "head dim 9"),
    Row("missing-config", "--config=/nonexistent/x.yaml",
        lambda f: ["fit", "--config=/nonexistent/x.yaml", f"--root={f.runs}"], "/nonexistent/x.yaml"),
    Row("unknown-shipped-config", "--config=tinyy", lambda f: ["fit", "--config=tinyy", f"--root={f.runs}"],
        "config 'tinyy' is neither a YAML file nor a shipped config; shipped: "),
    Row("config-not-text", "--config=RANDOM_BYTES.yaml (200 bytes of /dev/urandom)",
        lambda f: ["fit", f"--config={f.config_file('random.yaml', bytes(range(56, 256)))}", f"--root={f.runs}"],
        ("random.yaml' is not UTF-8 text", "pass a YAML config")),
    Row("config-section-not-a-mapping", "a config file holding model: 5",
        lambda f: ["fit", f"--config={f.config_file('model5.yaml', 'model: 5')}", f"--root={f.runs}"],
        "model5.yaml': model: '5' is not valid; model holds its options as a mapping"),
    Row("config-nested-unknown-key", "a config file with model: {d_modle: 3}",
        lambda f: ["fit", f"--config={f.tiny_with('nested.yaml', '  d_model: 64', '  d_modle: 3')}", *QUICK,
                   f"--root={f.runs}"],
        "unknown key 'model.d_modle'; did you mean model.d_model"),
    Row("config-empty", "an empty config file",
        lambda f: ["fit", f"--config={f.config_file('empty.yaml', '')}", f"--root={f.runs}"],
        "empty.yaml' is empty; a config holds trainer:, model: and data: sections"),
    Row("config-not-yaml", "a config file with model: [1 (a YAML syntax error)",
        lambda f: ["fit", f"--config={f.config_file('broken.yaml', 'model: [1')}", f"--root={f.runs}"],
        ("broken.yaml' is not valid YAML: ", "at line 1, column 10")),
    Row("bad-wandb-mode", "--wandb=sometimes", lambda f: f.fit("--wandb=sometimes"),
        "--wandb='sometimes' is not valid; choose one of auto, online, offline, disabled"),
    Row("bad-kernel-switch", "ACCROT_CPU_KERNELS=fast accrot fit ...", lambda f: f.fit(),
        "ACCROT_CPU_KERNELS='fast' is not valid; choose one of auto, on, off",
        simulate=lambda: environment("ACCROT_CPU_KERNELS", "fast")),
    Row("bad-denormal-switch", "ACCROT_DENORMALS=sometimes accrot fit ...", lambda f: f.fit(),
        "ACCROT_DENORMALS='sometimes' is not valid; choose one of keep, flush",
        simulate=lambda: environment("ACCROT_DENORMALS", "sometimes")),
    Row("bad-malloc-switch", "ACCROT_MALLOC=fast accrot fit ...", lambda f: f.fit(),
        "ACCROT_MALLOC='fast' is not valid; choose one of tuned, default",
        simulate=lambda: environment("ACCROT_MALLOC", "fast")),
    Row("fla-without-cuda", "--model.scheme.rotation=path --model.scheme.path_kernel=fla --trainer.accelerator=cpu",
        lambda f: f.fit("--model.scheme.rotation=path", "--model.scheme.path_kernel=fla", "--trainer.accelerator=cpu"),
        "model.scheme.path_kernel='fla' needs CUDA tensors (got device 'cpu'); use model.scheme.path_kernel='chunked'"),
    # -- data ---------------------------------------------------------------------------------------------
    Row("misspelt-data-module", "--data=data_modules.MultiKeyNeedelDataModule",
        lambda f: f.fit("--data=data_modules.MultiKeyNeedelDataModule", corpus=False),
        ("data='data_modules.MultiKeyNeedelDataModule' is not a data module; did you mean "
         "data_modules.MultiKeyNeedleDataModule?", "shipped: FlipFlopDataModule, FormalLanguageDataModule, HFDataModule, KJVDataModule")),
    Row("missing-data", "--data.init_args.root=/nonexistent/accrot",
        lambda f: f.fit("--data.init_args.root=/nonexistent/accrot", corpus=False),
        "data root '/nonexistent/accrot' does not exist"),
    Row("empty-data-folder", "--data.init_args.root=EMPTY_DIR",
        lambda f: f.fit(f"--data.init_args.root={f.empty_dir()}", corpus=False), "match glob '**/*.py'"),
    Row("empty-data-files", "--data.init_args.root=DIR_OF_EMPTY_FILES",
        lambda f: f.fit(f"--data.init_args.root={f.empty_files()}", corpus=False), "are empty; pass a directory of"),
    Row("impossible-split", "--data.init_args.val_fraction=0.001 (20 files)",
        lambda f: f.fit("--data.init_args.val_fraction=0.001"),
        "val_fraction=0.001 puts none of the 20 files under '"),
    Row("unreadable-data", "--data.init_args.root=DIR_WITH_UNREADABLE_FILE",
        lambda f: None if f.unreadable() is None else f.fit(f"--data.init_args.root={f.unreadable()}",
                                                              "--data.init_args.val_fraction=0.3", corpus=False),
        "cannot read '"),
    Row("non-utf8-data", "--data=data_modules.HFDataModule --data.init_args.path=latin1.txt",
        lambda f: f.fit("--data=data_modules.HFDataModule", f"--data.init_args.path={f.non_utf8()}",
                        f"--data.init_args.cache_dir={f.dir / 'cache'}", corpus=False),
        "file 'latin1.txt' is not valid UTF-8 (byte 0xe9 at offset 3)"),
    Row("missing-data-file", "--data=data_modules.HFDataModule --data.init_args.path=/nonexistent.jsonl",
        lambda f: f.fit("--data=data_modules.HFDataModule", "--data.init_args.path=/nonexistent.jsonl", corpus=False),
        "data path '/nonexistent.jsonl' does not exist"),
    Row("dataset-column-missing", "--data=data_modules.HFDataModule --data.init_args.path=docs.jsonl "
        "--data.init_args.column=content",
        lambda f: f.fit("--data=data_modules.HFDataModule", f"--data.init_args.path={f.jsonl()}",
                        "--data.init_args.column=content", f"--data.init_args.cache_dir={f.dir / 'cache'}",
                        corpus=False),
        "column 'content' is not in 'docs.jsonl'; columns: text, id"),
    Row("evaluation-too-long", "--extrapolation.multipliers=[100000]",
        lambda f: f.fit("--extrapolation.multipliers=[100000]"),
        "evaluation length 12800000 needs 12800001 tokens per block but the validation stream has"),
    Row("train-length-too-long", "--data.init_args.seq_len=100000", lambda f: f.fit("--data.init_args.seq_len=100000"),
        "needs 100001 tokens per"),
    # -- the output folder ----------------------------------------------------------------------------------
    Row("name-outside-the-root", "--name=../../x", lambda f: f.fit("--name=../../x"),
        "--name='../../x' is not valid; a run name is a folder inside --root"),
    Row("eval-negative-same-target-anchors", "accrot eval --ckpt RUN --same_target_anchors -1",
        lambda f: ["eval", "--ckpt", str(f.plain_run()), "--same_target_anchors=-1"],
        "--same_target_anchors=-1 is not valid; give a whole number >= 0"),
    Row("negative-same-target-anchors", "--extrapolation.same_target_anchors=-1",
        lambda f: f.fit("--extrapolation.same_target_anchors=-1"),
        "same_target_anchors=-1 is not valid; give 0 (none) or more windows"),
    Row("eval-out-under-a-file", "accrot eval --ckpt RUN.ckpt --out A_FILE/x",
        lambda f: ["eval", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"), f"--out={f.a_file()}/x"],
        ("--out='", "is a file, not a folder; give an output folder")),
    Row("diagnose-out-under-a-file", "accrot diagnose --ckpt RUN.ckpt --out A_FILE/x",
        lambda f: ["diagnose", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"), f"--out={f.a_file()}/x"],
        ("--out='", "is a file, not a folder; give an output folder")),
    Row("root-under-a-file", "--root=A_FILE/runs", lambda f: [*f.fit(), f"--root={f.a_file()}/runs"],
        "is a file, not a folder; give a folder for the run directories"),
    Row("read-only-root", "--root=READ_ONLY_DIR/runs",
        lambda f: None if f.read_only() is None else [*f.fit(), f"--root={f.read_only()}/accrot-runs"],
        "cannot be written"),
    Row("full-disk", "--root=FULL_DISK/runs (simulated: the first write fails with ENOSPC)",
        lambda f: f.fit(), "(No space left on device); pass a writable --root with free space", simulate=disk_full),
    Row("needles-do-not-fit", "--data=data_modules.MultiKeyNeedleDataModule --data.init_args.seq_len=128",
        lambda f: f.fit("--data=data_modules.MultiKeyNeedleDataModule", "--data.init_args.seq_len=128"),
        "seq_len=128 cannot hold the 4 needles and the question of multikey_needle; use seq_len >= 260"),
    Row("eval-length-too-short-for-the-task",
        "--data=data_modules.VariableTrackingDataModule --data.init_args.seq_len=256 --extrapolation.multipliers=[0.5, 1]",
        lambda f: f.fit("--data=data_modules.VariableTrackingDataModule", "--data.init_args.seq_len=256",
                        "--extrapolation.multipliers=[0.5, 1]"),
        "evaluation length 128 cannot hold"),
    Row("flipflop-density-outside-0-1", "--data=data_modules.FlipFlopDataModule --data.init_args.eval_p_ignore=1.5",
        lambda f: f.fit("--data=data_modules.FlipFlopDataModule", "--data.init_args.eval_p_ignore=1.5"),
        "eval_p_ignore=1.5 is not valid; use a number in (0, 1)"),
    Row("modulus-below-2", "--data=data_modules.ModCountDataModule --data.init_args.modulus=1",
        lambda f: f.fit("--data=data_modules.ModCountDataModule", "--data.init_args.modulus=1"),
        "modulus=1 is not valid; use an integer in 2..26"),
    Row("query-rate-zero", "--data=data_modules.ModCountDataModule --data.init_args.query_rate=0",
        lambda f: f.fit("--data=data_modules.ModCountDataModule", "--data.init_args.query_rate=0"),
        ("query_rate=0", "is not valid; use a number in (0, 1]")),
    Row("unknown-group", "--data=data_modules.WordProblemDataModule --data.init_args.group=S6",
        lambda f: f.fit("--data=data_modules.WordProblemDataModule", "--data.init_args.group=S6"),
        "group='S6' is not valid; choose one of S3, S4, S5, A4, A5"),
    Row("nback-beyond-the-training-length", "--data=data_modules.NBackDataModule --data.init_args.n_back=200",
        lambda f: f.fit("--data=data_modules.NBackDataModule", "--data.init_args.n_back=200"),
        "seq_len=128 cannot hold a nback sequence with its answer; use seq_len >= 203 for n_back=200"),
    Row("eval-length-too-short-for-flipflop",
        "--data=data_modules.FlipFlopDataModule --data.init_args.seq_len=4 --extrapolation.multipliers=[0.5, 1]",
        lambda f: f.fit("--data=data_modules.FlipFlopDataModule", "--data.init_args.seq_len=4",
                        "--extrapolation.multipliers=[0.5, 1]"),
        "evaluation length 2 cannot hold a flipflop sequence with its answer; the minimum is 3"),
    # -- checkpoints ------------------------------------------------------------------------------------------
    Row("missing-checkpoint", "accrot fit ... --ckpt_path=/nonexistent.ckpt", lambda f: f.fit("--ckpt_path=/nonexistent.ckpt"),
        "checkpoint '/nonexistent.ckpt' does not exist"),
    Row("corrupt-checkpoint", "accrot fit ... --ckpt_path=broken.ckpt",
        lambda f: f.fit(f"--ckpt_path={f.corrupt_checkpoint()}"), "is not a readable accrot checkpoint"),
    Row("checkpoint-of-another-scheme", "accrot fit ... --model.scheme.rotation=path --ckpt_path=ROPE_RUN.ckpt",
        lambda f: f.fit("--model.scheme.rotation=path", f"--ckpt_path={f.rope_checkpoint()}"),
        "is of another scheme (rope/none) than the config (path/none)"),
    Row("checkpoint-of-another-shape", "accrot fit ... --model.d_model=32 --ckpt_path=ROPE_RUN.ckpt",
        lambda f: f.fit("--model.scheme.rotation=rope", "--model.d_model=32", f"--ckpt_path={f.rope_checkpoint()}"),
        "has model.d_model=64 but the config builds model.d_model=32"),
    Row("eval-missing-checkpoint", "accrot eval --ckpt /nonexistent.ckpt",
        lambda f: ["eval", "--ckpt", "/nonexistent.ckpt"], "--ckpt='/nonexistent.ckpt': no such file or folder; give a checkpoint (.ckpt) of an accrot run"),
    Row("eval-corrupt-checkpoint", "accrot eval --ckpt broken.ckpt",
        lambda f: ["eval", "--ckpt", str(f.corrupt_in_run())], "is not a readable accrot checkpoint"),
    Row("sample-empty-prompt", "accrot sample --ckpt RUN --prompt ''",
        lambda f: ["sample", "--ckpt", str(f.plain_run()), "--prompt", ""], "--prompt is empty"),
    Row("sample-prompt-the-tokenizer-rejects", "accrot sample --ckpt RUN --prompt (a lone surrogate, not UTF-8)",
        lambda f: ["sample", "--ckpt", str(f.plain_run()), "--prompt", "ab\udcff"],
        "the prompt cannot be encoded by the run's tokenizer (bytes)"),
    Row("sample-no-new-tokens", "accrot sample --ckpt RUN --prompt x --max_new_tokens 0",
        lambda f: ["sample", "--ckpt", str(f.plain_run()), "--prompt", "x", "--max_new_tokens=0"],
        "--max_new_tokens=0 is not valid; give a whole number >= 1"),
    Row("sample-not-a-checkpoint", "accrot sample --ckpt broken.ckpt --prompt x",
        lambda f: ["sample", "--ckpt", str(f.corrupt_in_run()), "--prompt", "x"], "is not a readable accrot checkpoint"),
    Row("sample-top-k-zero", "accrot sample --ckpt RUN --prompt x --top_k 0",
        lambda f: ["sample", "--ckpt", str(f.plain_run()), "--prompt", "x", "--top_k=0"], "--top_k=0 is not valid"),
    Row("sample-negative-temperature", "accrot sample --ckpt RUN --prompt x --temperature -1",
        lambda f: ["sample", "--ckpt", str(f.plain_run()), "--prompt", "x", "--temperature=-1"],
        "--temperature=-1.0 is not valid"),
    Row("sample-prompt-file-missing", "accrot sample --ckpt RUN --prompt_file /nonexistent.txt",
        lambda f: ["sample", "--ckpt", str(f.plain_run()), "--prompt_file", "/nonexistent.txt"],
        "--prompt_file='/nonexistent.txt': no such file; give a UTF-8 text file"),
    Row("eval-generate-on-a-corpus", "accrot eval --ckpt RUN --generate true (a corpus run: no answers to generate)",
        lambda f: ["eval", "--ckpt", str(f.plain_run()), "--generate=true", "--multipliers", "1"],
        "--generate scores a retrieval task's answer"),
    Row("eval-one-token-length", "accrot eval --ckpt RUN --multipliers 0.001",
        lambda f: ["eval", "--ckpt", str(f.plain_run()), "--multipliers", "0.001"],
        "--multipliers gives an evaluation length of 1 token(s)"),
    Row("eval-unknown-rope-scaling", "accrot eval --ckpt RUN.ckpt --rope_scaling yarm",
        lambda f: ["eval", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"), "--rope_scaling=yarm"],
        "--rope_scaling='yarm' is not valid; did you mean yarn? choose one of pi, ntk, yarn, yarn-paper, llama3"),
    Row("eval-rope-factor-not-positive", "accrot eval --ckpt RUN.ckpt --rope_scaling yarn --rope_factor 0",
        lambda f: ["eval", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"), "--rope_scaling=yarn",
                   "--rope_factor=0"], "--rope_factor=0.0 is not valid; give a finite number > 0"),
    Row("eval-rope-scaling-without-rope", "accrot eval --ckpt NOPE_RUN.ckpt --rope_scaling pi",
        lambda f: ["eval", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"), "--rope_scaling=pi"],
        "rope_scaling='pi' needs a RoPE model (rotation=rope); this model is none/none"),
    Row("eval-device-without-cuda", "accrot eval --ckpt RUN.ckpt --device cuda (a torch or machine without CUDA)",
        lambda f: None if _cuda() else ["eval", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"),
                                        "--device", "cuda"],
        ("--device='cuda' needs a CUDA GPU, but ", "devices here: cpu")),
    Row("diagnose-device-without-cuda", "accrot diagnose --ckpt RUN.ckpt --device cuda (a torch or machine without CUDA)",
        lambda f: None if _cuda() else ["diagnose", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"),
                                        "--device", "cuda"],
        ("--device='cuda' needs a CUDA GPU, but ", "devices here: cpu")),
    Row("eval-device-gpu", "accrot eval --ckpt RUN.ckpt --device gpu",
        lambda f: ["eval", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"), "--device", "gpu"],
        "--device='gpu' is not a device; did you mean cuda? devices here: cpu"),
    Row("eval-multipliers-not-numbers", "accrot eval --ckpt RUN.ckpt --multipliers 1 2 x",
        lambda f: ["eval", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"), "--multipliers", "1", "2", "x"],
        "--multipliers='1 2 x' is not valid; give finite numbers > 0 (multiples of the training length), e.g. 1 2 4"),
    Row("eval-other-data-with-an-option-it-lacks", "accrot eval --ckpt RUN.ckpt --config OTHER_DATA.yaml "
        "(LocalDependencyDataModule given the corpus's root:)",
        lambda f: ["eval", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"), "--config",
                   str(f.other_data_config("local-root.yaml", "data:\n  class_path: data_modules.LocalDependencyDataModule"
                                           f"\n  init_args:\n    seq_len: 128\n    root: {f.corpus}\n"))],
        ("data.init_args.root is not an option of data_modules.LocalDependencyDataModule; its options: seq_len,",)),
    Row("eval-misspelt-data-module", "accrot eval --ckpt RUN.ckpt --config OTHER_DATA.yaml (data_modules.LocalDependncyDataModule)",
        lambda f: ["eval", "--ckpt", str(f.plain_run() / "checkpoints" / "last.ckpt"), "--config",
                   str(f.other_data_config("local-typo.yaml", "data:\n  class_path: data_modules.LocalDependncyDataModule\n"))],
        "data.class_path='data_modules.LocalDependncyDataModule' is not a data module; did you mean "
        "data_modules.LocalDependencyDataModule?"),
    Row("eval-run-directory-without-checkpoint", "accrot eval --ckpt RUN_WITHOUT_CHECKPOINT",
        lambda f: ["eval", "--ckpt", str(f.run_without_checkpoint())],
        "is a directory without checkpoints/last.ckpt; pass a run directory that holds one, or the path of a .ckpt"),
    Row("eval-corrupt-checkpoint-outside-a-run", "accrot eval --ckpt broken.ckpt (outside a run directory)",
        lambda f: ["eval", "--ckpt", str(f.corrupt_checkpoint())], "broken.ckpt' is not a readable accrot checkpoint"),
    Row("eval-checkpoint-outside-a-run", "accrot eval --ckpt ROPE.ckpt (outside a run directory)",
        lambda f: ["eval", "--ckpt", str(f.rope_checkpoint())],
        "rope.ckpt' is not inside a run directory (RUN/checkpoints/x.ckpt beside RUN/config.yaml); pass --config"),
    Row("resume-missing-run", "accrot fit --resume /nonexistent/version_0",
        lambda f: ["fit", "--resume", "/nonexistent/version_0"], "--resume '/nonexistent/version_0' is not a directory"),
    Row("resume-before-first-checkpoint", "accrot fit --resume RUN_WITHOUT_CHECKPOINT",
        lambda f: ["fit", "--resume", str(f.run_without_checkpoint())], "has no checkpoints/last.ckpt"),
    Row("resume-with-another-config", "accrot fit --resume RUN_DIR --config tiny",
        lambda f: ["fit", "--resume", str(f.run_without_checkpoint()), "--config", "tiny"],
        "--resume takes the run's own config.yaml and last checkpoint; drop --config"),
    Row("eval-with-another-model", "accrot eval --ckpt ROPE_RUN.ckpt --config OTHER.yaml (rotation: path)",
        lambda f: ["eval", "--ckpt", str(f.rope_checkpoint()),
                   "--config", str(f.tiny_with("path.yaml", "rotation: none", "rotation: path"))],
        ("describes another model than checkpoint", "model.scheme.rotation='rope' (config: 'path')")),
    Row("resume-after-editing-seq-len", "accrot fit --resume RUN_DIR after editing seq_len in RUN_DIR/config.yaml",
        lambda f: ["fit", "--resume", str(f.edited_run("seq-len", "seq_len: 128", "seq_len: 64"))],
        ("was trained with other settings than the config: data.seq_len=128 (config: 64)",
         "undo the edit of '")),
    Row("resume-after-editing-rotation", "accrot fit --resume RUN_DIR after editing the rotation in its config.yaml",
        lambda f: ["fit", "--resume", str(f.edited_run("rotation", "rotation: none", "rotation: rope"))],
        ("is of another scheme (none/none) than the config (rope/none)",
         "undo the edit of '", "or train a new run with it: accrot fit --config")),
    Row("resume-with-a-model-override", "accrot fit --resume RUN_DIR --model.scheme.rotation=rope",
        lambda f: ["fit", "--resume", str(f.plain_run()), "--model.scheme.rotation=rope"],
        ("is of another scheme (none/none) than the config (rope/none)",
         "a resumed run keeps its model and data: drop --model.scheme.rotation=rope, or train a new run with it: "
         "accrot fit --config ")),
    Row("resume-at-its-step-limit", "accrot fit --resume RUN_DIR --trainer.max_steps=1 (the run is at step 1)",
        lambda f: ["fit", "--resume", str(f.plain_run()), "--trainer.max_steps=1"],
        ("is at step 1 and trainer.max_steps=1: nothing left to train; pass --trainer.max_steps=N with N > 1 to "
         "train longer, or start a new run from its weights: accrot fit --config ", "--init_from ")),
    Row("ckpt-path-at-its-step-limit", "accrot fit --config RUN_DIR/config.yaml --ckpt_path RUN_DIR/checkpoints/last.ckpt",
        lambda f: ["fit", "--config", str(f.plain_run() / "config.yaml"), f"--root={f.runs}", "--wandb=disabled",
                   f"--ckpt_path={f.plain_run() / 'checkpoints' / 'last.ckpt'}"],
        ("is at step 1 and trainer.max_steps=1: nothing left to train (--ckpt_path continues its training state); "
         "start a new run from its weights with --init_from ")),
    Row("init-from-and-ckpt-path", "accrot fit ... --init_from RUN.ckpt --ckpt_path RUN.ckpt",
        lambda f: f.fit(f"--init_from={f.plain_run() / 'checkpoints' / 'last.ckpt'}",
                        f"--ckpt_path={f.plain_run() / 'checkpoints' / 'last.ckpt'}"),
        "--init_from starts a new run from a checkpoint's weights, --ckpt_path continues one from its whole training "
        "state; give one of them"),
    Row("init-from-missing-checkpoint", "accrot fit ... --init_from=/nonexistent.ckpt",
        lambda f: f.fit("--init_from=/nonexistent.ckpt"), "--init_from='/nonexistent.ckpt': no such file or folder; give a checkpoint (.ckpt) or its run directory"),
    Row("init-from-another-scheme", "accrot fit ... --model.scheme.rotation=path --init_from=ROPE_RUN.ckpt",
        lambda f: f.fit("--model.scheme.rotation=path", f"--init_from={f.rope_checkpoint()}"),
        ("is of another scheme (rope/none) than the config (path/none)",
         "a new run from its weights takes the model of the checkpoint's run")),
    Row("resume-with-init-from", "accrot fit --resume RUN_DIR --init_from RUN.ckpt",
        lambda f: ["fit", "--resume", str(f.plain_run()), "--init_from", str(f.rope_checkpoint())],
        "--resume takes the run's own config.yaml and last checkpoint; drop --init_from"),
    # -- sweeps and storages ------------------------------------------------------------------------------------
    Row("sweep-unknown-spec", "accrot sweep nope", lambda f: ["sweep", "nope", f"--root={f.sweeps}"],
        "sweep spec 'nope' does not exist; give a YAML path or one of:"),
    Row("sweep-unknown-key", "spec with trails: 3",
        lambda f: ["sweep", str(f.spec("bad-key", trails=3)), f"--root={f.sweeps}"],
        "unknown key 'trails'; did you mean 'trials'?"),
    Row("sweep-search-key", "spec with space: {model.lrr: ...}",
        lambda f: ["sweep", str(f.spec("bad-space", space={"model.lrr": {"type": "float", "low": 1e-3, "high": 1e-2}})),
                   f"--root={f.sweeps}"],
        "search-space key 'model.lrr' is not a key of the accrot fit config; did you mean model.lr"),
    Row("sweep-invalid-choice", "spec with space: {model.scheme.rotation: [none, rope, rotary]}",
        lambda f: ["sweep", str(f.spec("bad-choice", space={"model.scheme.rotation": ["none", "rope", "rotary"]})),
                   f"--root={f.sweeps}"],
        "space.model.scheme.rotation value 'rotary' is not valid: model.scheme.rotation='rotary' is not valid"),
    Row("sweep-invalid-conditional-choice", "spec with increments: {choices: [random_position, lerned], when: "
        "{model.scheme.rotation: accum}}",
        lambda f: ["sweep", str(f.spec("bad-when", space={
            "model.scheme.rotation": ["none", "accum"],
            "model.scheme.increments": {"type": "categorical", "choices": ["random_position", "lerned"],
                                        "when": {"model.scheme.rotation": "accum"}}})), f"--root={f.sweeps}"],
        "model.scheme.increments='lerned' is not valid; choose one of 'random_position', 'random_token', 'learned'"),
    Row("sweep-invalid-bound", "spec with space: {model.lr: {type: float, low: -1.0e-3, high: 1.0e-2}}",
        lambda f: ["sweep", str(f.spec("bad-bound", space={"model.lr": {"type": "float", "low": -1e-3, "high": 1e-2}})),
                   f"--root={f.sweeps}"],
        "space.model.lr value -0.001 is not valid: model.lr=-0.001 is not valid"),
    Row("sweep-objective-not-evaluated", "spec with objectives: [nll@16x] (runs evaluate at 1×, 2×)",
        lambda f: ["sweep", str(f.spec("bad-objective", objectives=[{"metric": "nll@16x"}])), f"--root={f.sweeps}"],
        "objective 'nll@16x' is never produced: the runs evaluate at multipliers 1, 2"),
    Row("sweep-multi-device-trials", "spec with overrides: {trainer.devices: 2}",
        lambda f: ["sweep", str(f.spec("devices", overrides={"trainer.devices": 2})), f"--root={f.sweeps}"],
        "trainer.devices=2, trainer.num_nodes=1: a sweep trial runs on one device"),
    Row("sweep-shared-tuning", "spec with shared_study: true and a TPE sampler",
        lambda f: ["sweep", str(f.spec("shared-tpe", shared_study=True, variants={"a": {}, "b": {}})), f"--root={f.sweeps}"],
        "shared_study: true runs a fixed grid; set sampler: {type: grid} (sampler 'tpe' would tune across variants"),
    Row("sweep-shared-pruner", "spec with shared_study: true, a grid and a median pruner",
        lambda f: ["sweep", str(f.spec("shared-pruner", shared_study=True, variants={"a": {}, "b": {}},
                                       space={"model.lr": [1e-3]}, sampler={"type": "grid"}, trials=1)), f"--root={f.sweeps}"],
        "shared_study: true needs pruner: {type: none} (pruner 'median' would compare, and prune, one variant"),
    Row("sweep-unreachable-storage", "--storage=postgresql://accrot:pw@127.0.0.1:FREE_PORT/accrot",
        lambda f: ["sweep", str(f.spec("unreachable")), f"--root={f.sweeps}", "--workers=2",
                   f"--storage=postgresql://accrot:pw@127.0.0.1:{free_port()}/accrot"],
        ("accrot:***@127.0.0.1:", "' is unreachable: ")),
    Row("sweep-relative-journal", "--storage=journal://relative/x.log",
        lambda f: ["sweep", str(f.spec("journal")), f"--root={f.sweeps}", "--storage=journal://relative/x.log"],
        "storage 'journal://relative/x.log' names a relative file; write journal:///ABS/PATH.log"),
    Row("sweep-duplicate-study", "a spec named like a study of the storage, with another space",
        lambda f: ["sweep", str(f.spec("taken-second", space={"model.weight_decay": [0.0, 0.1]})),
                   f"--root={f.sweeps}", "--workers=0", f"--storage={f.existing_study()}"],
        "study 'taken' already exists in the storage from a different spec"),
    Row("sweep-proxy-without-port", "--storage=grpc://proxyhost",
        lambda f: ["sweep", str(f.spec("grpc")), f"--root={f.sweeps}", "--storage=grpc://proxyhost"],
        "storage 'grpc://proxyhost' is not valid; write grpc://HOST:PORT with a port from 1 to 65535"),
    Row("sweep-unreachable-proxy", "--storage=grpc://127.0.0.1:FREE_PORT",
        lambda f: ["sweep", str(f.spec("noproxy")), f"--root={f.sweeps}", f"--storage=grpc://127.0.0.1:{free_port()}"],
        ("' is unreachable: no storage proxy answered at 127.0.0.1:", "start one there with `accrot storage-proxy")),
    Row("sweep-bare-optuna-proxy", "--storage=grpc://HOST:PORT of optuna.storages.run_grpc_proxy_server",
        lambda f: ["sweep", str(f.spec("bare")), f"--root={f.sweeps}", "--workers=0",
                   f"--storage=grpc://127.0.0.1:{f.bare_proxy()}"],
        "is an Optuna storage proxy without accrot's budget lock"),
    Row("sweep-proxy-without-grpcio", "--storage=grpc://HOST:PORT without grpcio installed",
        lambda f: ["sweep", str(f.spec("nogrpc")), f"--root={f.sweeps}", "--workers=0",
                   f"--storage=grpc://127.0.0.1:{f.bare_proxy()}"],
        "needs grpcio, which is not installed; pip install grpcio", simulate=lambda: _hidden_module("grpc")),
    Row("proxy-no-storage", "accrot storage-proxy (no --storage, no ACCROT_SWEEP_STORAGE)",
        lambda f: ["storage-proxy"], "accrot storage-proxy needs the database it serves: --storage postgresql://",
        simulate=lambda: _patched_env(ACCROT_SWEEP_STORAGE="")),
    Row("proxy-journal", "accrot storage-proxy --storage journal:///abs/x.log",
        lambda f: ["storage-proxy", f"--storage=journal:///{f.sweeps}/x.log"],
        "is a journal file, which Optuna's storage proxy cannot serve"),
    Row("proxy-of-a-proxy", "accrot storage-proxy --storage grpc://HOST:PORT",
        lambda f: ["storage-proxy", "--storage=grpc://127.0.0.1:13000"], "is a storage proxy already"),
    Row("proxy-port-taken", "accrot storage-proxy --host 127.0.0.1 --port TAKEN_PORT",
        lambda f: ["storage-proxy", f"--storage=sqlite:///{f.sweeps}/x.db", "--host=127.0.0.1",
                   f"--port={f.taken_port()}"],
        ("cannot listen on 127.0.0.1:", "(Address already in use); pass another --port (0: any free port)")),
    Row("proxy-bad-port", "accrot storage-proxy --port 70000",
        lambda f: ["storage-proxy", f"--storage=sqlite:///{f.sweeps}/x.db", "--port=70000"],
        "--port=70000 is not valid; give a whole number from 0 to 65535"),
    Row("proxy-bad-threads", "accrot storage-proxy --threads 0",
        lambda f: ["storage-proxy", f"--storage=sqlite:///{f.sweeps}/x.db", "--threads=0"],
        "--threads=0 is not valid; give a whole number from 1 to 4096"),
    Row("proxy-address-file-folder", "accrot storage-proxy --address_file /nonexistent/proxy.address",
        lambda f: ["storage-proxy", f"--storage=sqlite:///{f.sweeps}/x.db", "--address_file=/nonexistent/proxy.address"],
        "--address_file='/nonexistent/proxy.address': folder '/nonexistent' does not exist"),
    Row("proxy-without-grpcio", "accrot storage-proxy ... without grpcio installed",
        lambda f: ["storage-proxy", f"--storage=sqlite:///{f.sweeps}/x.db"],
        "accrot storage-proxy needs grpcio, which is not installed", simulate=lambda: _hidden_module("grpc")),
    Row("slurm-proxy-journal", "accrot slurm sweep smoke --storage journal:///abs/x.log --proxy",
        lambda f: ["slurm", "sweep", "smoke", f"--storage=journal:///{f.sweeps}/x.log", "--proxy", "--dry-run",
                   f"--root={f.sweeps}", "--assume_shared=true"],
        "is a journal file, which Optuna's storage proxy cannot serve"),
    Row("bench-storage-workers", "accrot bench storage --workers 0 8", lambda f: ["bench", "storage", "--workers", "0", "8"],
        "--workers: 0 is not valid; give finite whole numbers > 0 (worker counts)"),
    Row("bench-storage-no-postgres", "accrot bench storage (no PostgreSQL server binaries installed)",
        lambda f: ["bench", "storage"],
        "accrot bench storage starts its own PostgreSQL server: PostgreSQL's server binaries were not found",
        simulate=lambda: _patched_module("accrot.bench.postgres", find_bindir=lambda: None)),
    # -- SLURM launches (tests/sweep/test_slurm.py has a real cluster; here the cluster's answers are simulated) ------
    Row("slurm-layout-mismatch", "accrot slurm train --tasks_per_node 2 -- --config CONFIG_WITH_DEVICES_4",
        lambda f: ["slurm", "train", "--tasks_per_node=2", "--dry-run", "--", *f.fit("--config", str(f.devices_config()))[1:]],
        "the config asks for trainer.devices=4 x trainer.num_nodes=1, but the job has --nodes=1 x --tasks_per_node=2"),
    Row("slurm-no-partition", "accrot slurm train -- ... (on a cluster without a default partition)",
        lambda f: ["slurm", "train", "--", *f.fit()[1:]], "this cluster has no default partition; pass --partition",
        simulate=lambda: _patched(partitions=lambda: (["cpu", "gpu"], None))),
    Row("slurm-local-root", "accrot slurm train --nodes 2 -- ... --root=LOCAL_DISK/runs",
        lambda f: ["slurm", "train", "--nodes=2", "--partition=gpu", "--", *f.fit()[1:]] if f.local_runs() else None,
        ("is on a node-local filesystem", "pass --root on a shared filesystem"),
        simulate=lambda: _patched(partitions=lambda: (["gpu"], "gpu"), cluster_is_this_machine=lambda: False)),
    Row("slurm-srun-mismatch", "srun -n1 accrot fit ... --trainer.devices=2",
        lambda f: f.fit("--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.accelerator=cpu"),
        "trainer.devices=2 x trainer.num_nodes=1 = 2 ranks, but srun started 1 task(s)",
        simulate=lambda: _patched_env(SLURM_NTASKS="1", SLURM_JOB_ID="7", SLURM_PROCID="0", SLURM_LOCALID="0",
                                      SLURM_NODEID="0", SLURM_NNODES="1", SLURM_JOB_NAME="accrot")),
    # -- the ablation ----------------------------------------------------------------------------------------
    Row("ablation-unknown-size", "accrot ablation --size=huge", lambda f: ["ablation", "--size=huge",
                                                                          f"--out={f.sweeps}"],
        "--size='huge' is not valid; choose one of study, decide, tiny, small, paper"),
    Row("ablation-unknown-variant", "accrot ablation --variants='[NoPE, Rope]'",
        lambda f: ["ablation", "--variants=[NoPE, Rope]", f"--out={f.sweeps}"],
        "--variants='Rope' is not valid; did you mean RoPE? choose one of NoPE, RoPE"),
    Row("ablation-unknown-variant-words", "accrot ablation --variants NoPE Rope",
        lambda f: ["ablation", "--variants", "NoPE", "Rope", f"--out={f.sweeps}"],
        "--variants='Rope' is not valid; did you mean RoPE? choose one of NoPE, RoPE"),
    Row("ablation-empty-text-root", "accrot ablation --datasets corpus text --text_root EMPTY_DIR",
        lambda f: ["ablation", "--datasets", "corpus", "text", "--text_root", str(f.empty_dir()), f"--out={f.sweeps}"],
        ("' holds no .txt files (at any depth); pass a folder of .txt files",)),
    _ablation("ablation-corpus-unknown", "--corpus wiki",
              "--corpus='wiki' is not valid; choose one of stdlib, corpus, prose, text or hf:NAME_OR_FILES"),
    _ablation("ablation-corpus-hf-not-cached", "--corpus hf:missing-name",
              ("hf:missing-name: dataset 'missing-name' is not available offline", "and is not cached"),
              note="offline, not cached", simulate=lambda: _patched_env(HF_HUB_OFFLINE="1")),
    _ablation("ablation-tokens-below-a-step", "--tokens 1000",
              "--tokens=1000 is not valid; at least one step of 16 x 128 = 2048 tokens"),
    _ablation("ablation-tokens-and-steps", "--tokens 1000000 --max_steps 100",
              "--tokens=1000000 and --max_steps=100 both set the training length; give one"),
    _ablation("ablation-precision-unknown", "--precision fp8",
              "--precision='fp8' is not valid; choose one of 32-true, bf16-mixed"),
    _ablation("ablation-set-not-key-value", "--set weight_decay",
              "--set 'weight_decay' is not valid; give KEY=VALUE with a dotted key of accrot fit"),
    _ablation("ablation-set-unknown-key", "--set model.weight_dcay=0.05",
              ("--set model.weight_dcay=0.05", "unknown key 'model.weight_dcay'; did you mean model.weight_decay")),
    _ablation("ablation-set-variant-key", "--set model.scheme.rotation=rope",
              "the ablation sets model.scheme.rotation per variant or data set"),
    _ablation("ablation-set-own-option", "--set trainer.max_steps=100",
              "the ablation sets trainer.max_steps itself; use --max_steps or --tokens"),
    Row("ablation-other-options", "the same --study again with other options (here fewer seeds: --seeds 1; more "
        "seeds are a second batch, which resumes the first)",
        lambda f: ["ablation", "--study=taken-ablation", "--seeds=1", "--variants=[NoPE]", "--datasets=[corpus]",
                   f"--out={f.existing_ablation()}"],
        ("holds an ablation with other options (seeds differ)", "pass --study NAME for a new one")),
    # -- checked before anything is created: what a run, a sweep or an ablation would refuse at its start (the
    # evaluation blocks its data cannot fill, an argument of the wrong type, a run of no step) is refused by building
    # it once first (accrot.run.probe with its set-up; the spec sections' typed fields), before a study or run exists
    Row("zero-steps", "--trainer.max_steps=0", lambda f: f.fit("--trainer.max_steps=0"),
        "trainer.max_steps=0 is not valid: the run would train no step; give a positive trainer.max_steps"),
    Row("diagnose-far-window-beyond-the-lengths", "accrot diagnose --ckpt RUN.ckpt --far_window 100000",
        lambda f: ["diagnose", "--ckpt", str(f.plain_run()), "--far_window=100000", f"--out={f.sweeps}/d"],
        "--far_window=100000 is not valid; no key of the longest length diagnosed (4096 tokens) is that far back"),
    Row("sweep-pruner-argument-type", "spec with pruner: {type: median, n_startup_trials: two}",
        lambda f: ["sweep", str(f.spec("pruner-type", pruner={"type": "median", "n_startup_trials": "two"})),
                   f"--root={f.sweeps}"],
        "pruner: n_startup_trials='two' is not valid; expected an integer or null"),
    Row("sweep-evaluation-too-long", "spec with overrides: {extrapolation.multipliers: [1, 2, 100000]}",
        lambda f: ["sweep", str(f.spec("eval-long", overrides={"extrapolation.multipliers": [1, 2, 100000]})),
                   f"--root={f.sweeps}"],
        ("overrides are not valid: evaluation length 12800000 needs 12800001 tokens per block",)),
    _ablation("ablation-evaluation-too-long", "--size tiny --multipliers 1 10000 --variants NoPE --datasets corpus "
              "--workers 0", "evaluation length 1280000 needs 1280001 tokens per block"),
    _ablation("ablation-study-name-with-a-slash", "--study my/study --variants NoPE --datasets corpus --workers 0",
              "--study='my/study' is not valid; a study name is letters, digits and _ . + - (no '/')"),
    # -- every option takes effect or is refused: an option the command would drop (a place beside --resume, the
    # first of two equal YAML keys, a misspelt or bad environment switch, a search space with nothing to search) is
    # compared with what the command applies (accrot.run.args.RESUME_PLACES, accrot.io.load_yaml for every config
    # and spec, accrot.run.launch.SWITCHES, the spec's budget check)
    Row("resume-with-a-name", "accrot fit --resume RUN_DIR --name other",
        lambda f: ["fit", "--resume", str(f.run_without_checkpoint()), "--name", "other"],
        ("in place, so --name cannot take effect; drop --name, or start a new run there from its weights",)),
    Row("resume-with-a-root", "accrot fit --resume RUN_DIR --root OTHER",
        lambda f: ["fit", "--resume", str(f.run_without_checkpoint()), f"--root={f.runs}"],
        ("in place, so --root cannot take effect; drop --root",)),
    Row("config-duplicate-key", "a config file with model: twice",
        lambda f: ["fit", "--config", str(f.config_file("twice.yaml", "model:\n  n_layers: 2\nmodel:\n  n_layers: 4\n")),
                   f"--root={f.runs}"],
        "twice.yaml' is not valid YAML: key 'model' is given twice (lines 1 and 3); keep one"),
    Row("config-duplicate-nested-key", "a config file with model: {n_layers: 2, n_layers: 4}",
        lambda f: ["fit", "--config", str(f.config_file("twice-nested.yaml", "model:\n  n_layers: 2\n  n_layers: 4\n")),
                   f"--root={f.runs}"],
        "key 'n_layers' is given twice (lines 2 and 3)"),
    Row("sweep-spec-duplicate-key", "spec with trials: given twice",
        lambda f: ["sweep", str(f.config_file("twice-spec.yaml", f.spec("twice-spec").read_text() + "trials: 2\n")),
                   f"--root={f.sweeps}"],
        "not valid YAML (key 'trials' is given twice"),
    Row("bad-gpu-kernel-switch", "ACCROT_GPU_KERNELS=bogus accrot fit ...", lambda f: f.fit(),
        "ACCROT_GPU_KERNELS='bogus' is not valid; choose one of auto, on, off",
        simulate=lambda: environment("ACCROT_GPU_KERNELS", "bogus")),
    Row("misspelt-switch", "ACCROT_GPU_KERNEL=off accrot fit ... (the switch is ACCROT_GPU_KERNELS)", lambda f: f.fit(),
        "ACCROT_GPU_KERNEL='off' is not a switch accrot reads; did you mean ACCROT_GPU_KERNELS?",
        simulate=lambda: environment("ACCROT_GPU_KERNEL", "off")),
    Row("sweep-empty-space", "spec with space: {} (trials: 4)",
        lambda f: ["sweep", str(f.spec("empty-space", space={})), f"--root={f.sweeps}"],
        "space is empty, so each of trials=4 would run the same config; give the space its search keys, or set trials: 1"),
    Row("sweep-null-space", "spec with space: null (trials: 4)",
        lambda f: ["sweep", str(f.spec("null-space", space=None)), f"--root={f.sweeps}"],
        "space is empty, so each of trials=4 would run the same config"),
    # -- a result says what ran and overwrites nothing: eval and diagnose refuse an --out that is a run's own folder
    # (accrot.run.checkpoints.output_folder, which both write through) and data the model cannot read
    Row("eval-out-is-the-run-directory", "accrot eval --ckpt RUN --out RUN",
        lambda f: ["eval", "--ckpt", str(f.plain_run()), "--out", str(f.plain_run())],
        ("is a run directory (it holds run.json): what the training wrote there would be overwritten; pass another "
         "--out",)),
    Row("diagnose-out-is-the-run-directory", "accrot diagnose --ckpt RUN --out RUN",
        lambda f: ["diagnose", "--ckpt", str(f.plain_run()), "--out", str(f.plain_run())],
        "is a run directory (it holds run.json)"),
    Row("eval-data-of-another-vocabulary", "accrot eval --ckpt RUN --config OTHER_DATA.yaml (LocalDependencyDataModule, "
        "a task's own symbols)",
        lambda f: ["eval", "--ckpt", str(f.plain_run()), "--config",
                   str(f.other_data_config("local-task.yaml", "data:\n  class_path: data_modules.LocalDependencyDataModule\n"))],
        ("describes another model than checkpoint", "data vocabulary 72 tokens (the model reads 256)")),
    # -- every command at the same standard, its message naming the option at fault and the remedy: LightningCLI's
    # subcommands other than fit are not offered; a run directory stands for its last checkpoint wherever a
    # checkpoint is taken (accrot.run.lightning.checkpoint_file); a union of plain types is one line (accrot.errors)
    Row("validate-is-not-a-command", "accrot validate --config tiny",
        lambda f: ["validate", "--config", "tiny", f"--root={f.runs}"],
        "accrot validate is not a command; score a checkpoint with accrot eval --ckpt RUN_DIR"),
    Row("test-is-not-a-command", "accrot test --config RUN/config.yaml --ckpt_path RUN.ckpt",
        lambda f: ["test", "--config", str(f.plain_run() / "config.yaml"), f"--root={f.runs}",
                   f"--ckpt_path={f.plain_run() / 'checkpoints' / 'last.ckpt'}"],
        "accrot test is not a command; score a checkpoint with accrot eval --ckpt RUN_DIR"),
    Row("report-no-trials", "accrot report --study NAME (a study created, none of its trials run)",
        lambda f: ["report", "--study=taken", f"--storage={f.existing_study()}", f"--out={f.sweeps}/report"],
        "study 'taken' in storage 'sqlite:///"),
    Row("init-from-a-run-directory", "accrot fit ... --model.scheme.rotation=rope --init_from RUN_DIR (a NoPE run)",
        lambda f: f.fit("--model.scheme.rotation=rope", f"--init_from={f.plain_run()}"),
        "checkpoints/last.ckpt' is of another scheme (none/none) than the config (rope/none)"),
    Row("ckpt-path-a-run-directory", "accrot fit --config RUN_DIR/config.yaml --ckpt_path RUN_DIR (at its step limit)",
        lambda f: ["fit", "--config", str(f.plain_run() / "config.yaml"), f"--root={f.runs}", "--wandb=disabled",
                   f"--ckpt_path={f.plain_run()}"],
        "checkpoints/last.ckpt' is at step 1 and trainer.max_steps=1: nothing left to train"),
    Row("init-from-a-folder-without-a-checkpoint", "accrot fit ... --init_from RUN_WITHOUT_CHECKPOINT",
        lambda f: f.fit(f"--init_from={f.run_without_checkpoint()}"),
        "is a directory without checkpoints/last.ckpt; pass a run directory that holds one, or the path of a .ckpt"),
    Row("name-too-long", "--name=300_CHARACTERS", lambda f: f.fit("--name=" + "x" * 300),
        "is not valid; a folder name is at most 255 bytes (this one is 300); give a shorter --name"),
    Row("name-too-long-leaves-no-root", "--root=NEW_FOLDER --name=300_CHARACTERS",
        lambda f: [*f.fit("--name=" + "x" * 300), f"--root={f.runs}/new-root"], "give a shorter --name"),
    Row("seed-not-an-integer", "--seed_everything=abc", lambda f: f.fit("--seed_everything=abc"),
        "seed_everything='abc' is not valid; expected bool or int"),
    _ablation("ablation-seeds-not-an-integer", "--seeds 1.5", "seeds='1.5' is not valid; expected int (or null)"),
    Row("config-is-a-folder", "--config RUN_DIR", lambda f: ["fit", "--config", str(f.plain_run()), f"--root={f.runs}"],
        ("is a folder, not a config file; its run's config is --config ", "config.yaml")),
    Row("devices-zero", "--trainer.devices=0", lambda f: f.fit("--trainer.devices=0"),
        "trainer.devices='0' is not valid; give a number of devices >= 1, a list of device indices ([0, 1]) or auto"),
    Row("cpu-bf16-without-hardware-bf16", "--trainer.precision=bf16-mixed --trainer.accelerator=cpu (a CPU without "
        "AVX-512 BF16 or AMX)", lambda f: f.fit("--trainer.precision=bf16-mixed", "--trainer.accelerator=cpu"),
        ("trainer.precision='bf16-mixed' is not valid on this CPU", "no hardware bfloat16",
         "use trainer.precision=32-true (the default) here"),
        simulate=lambda: _patched_module("accrot.runtime", cpu_bf16=lambda: None)),
    Row("wandb-not-installed", "--wandb=offline (wandb not installed: a node's minimal install)",
        lambda f: f.fit("--wandb=offline"),
        ("--wandb='offline' (mode offline) needs wandb, which is not installed", "--wandb=disabled"),
        simulate=lambda: _hidden_module("wandb")),
    _ablation("ablation-cpu-bf16-without-hardware-bf16", "--size tiny --precision bf16-mixed",
              ("trainer.precision='bf16-mixed' is not valid on this CPU", "no hardware bfloat16"),
              note="on a CPU without AVX-512 BF16 or AMX",
              simulate=lambda: _patched_module("accrot.runtime", cpu_bf16=lambda: None)),
]


def _cuda() -> bool:
    """This torch and machine have a CUDA device (the rows that ask for one without it cannot be posed)."""
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def _patched_module(module: str, **targets) -> Iterator[None]:
    """Replace functions of ``module`` for one row (what this machine has installed)."""
    import importlib

    mod = importlib.import_module(module)
    saved = {name: getattr(mod, name) for name in targets}
    for name, value in targets.items():
        setattr(mod, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(mod, name, value)


def _patched(**targets) -> contextlib.AbstractContextManager:
    """Replace functions of accrot.sweep.slurm (the cluster's answers) for one row."""
    return _patched_module("accrot.sweep.slurm", **targets)


def _hidden_module(name: str) -> contextlib.AbstractContextManager:
    """``name`` is not installed, for one row (``import name`` fails, ``find_spec`` finds nothing)."""
    import sys

    return _swapped(sys.modules, name, None)


@contextlib.contextmanager
def _patched_env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@contextlib.contextmanager
def log_handlers_to(stream: io.StringIO) -> Iterator[None]:
    """Point the stream handlers Lightning attached at import to ``stream`` (they hold the stderr of that moment,
    which ``redirect_stderr`` does not reach), so the check sees every line a user's terminal would show."""
    import logging

    handlers = {h: h.stream for name in ("lightning", "lightning.pytorch", "lightning.fabric")
                for h in logging.getLogger(name).handlers if type(h) is logging.StreamHandler}  # not pytest's own
    for h in handlers:
        h.setStream(stream)
    try:
        yield
    finally:
        for h, old in handlers.items():
            h.setStream(old)


def run_row(row: Row, fixtures: Fixtures, dry: bool = False) -> str | None:
    """None when ``row`` is rejected cleanly; ``"skipped"`` when this machine cannot pose it; else what was wrong."""
    from accrot.cli import main

    argv = row.argv(fixtures)
    if argv is None:
        return "skipped"
    if dry:
        return None
    err = io.StringIO()
    simulate = row.simulate() if row.simulate else contextlib.nullcontext()
    with simulate, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), log_handlers_to(err):
        try:
            rc = main(argv)
        except BaseException as exc:  # noqa: BLE001 - an escaped exception is the finding
            return f"raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    lines = err.getvalue().strip().splitlines()
    last = lines[-1] if lines else ""
    if rc != 2:
        return f"exit status {rc}, expected 2 ({last[:300]})"
    if any("Traceback" in ln for ln in lines):
        return "a traceback was printed"
    expect = (row.expect,) if isinstance(row.expect, str) else row.expect
    if not last.startswith("accrot: error: ") or not all(e in last for e in expect):
        return f"message {last!r} lacks {row.expect!r}"
    if len(lines) != 1:  # nothing prints before the error (no seed line, no Lightning banner) and nothing after
        return f"{len(lines)} lines on stderr: {lines[:3]}"
    if ":pw@" in err.getvalue():
        return "a storage password reached the output"
    left = [p for d in (fixtures.runs, fixtures.sweeps) if d.exists() for p in d.rglob("*")]
    if left:
        return f"left behind {left[:3]}"
    return None


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Fixtures:
    return Fixtures(tmp_path_factory.mktemp("bad-inputs"))


@pytest.mark.parametrize("row", CATALOGUE, ids=[r.id for r in CATALOGUE])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(row: Row, fixtures: Fixtures, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(fixtures.dir / "xdg"))  # HF stream caches stay in tmp
    problem = run_row(row, fixtures)
    if problem == "skipped":
        pytest.skip("this machine cannot pose the case (e.g. running as root with a writable /sys)")
    assert problem is None, problem
