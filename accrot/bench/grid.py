"""The cells every benchmark measures (each built scheme of the ablation grid), the shapes per size, and the
interleaved timing that makes ratios to NoPE robust on a shared machine."""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from accrot.run.args import CONFIG_DIR

SCHEMA = "accrot.bench/1"
SIZES = ("tiny", "small")
# training-step batch per size (the recipes train at 16 and 32), cut to keep the default run near 5 minutes
BENCH_BATCH = {"tiny": 8, "small": 2}
FULL = {"sizes": ["tiny", "small"], "T": 512, "eval_lengths": [4096, 16384], "repeats": 8, "eval_repeats": 3,
        "op_T": 1024, "op_eval_length": 16384}
QUICK = {"sizes": ["tiny"], "T": 256, "eval_lengths": [1024], "repeats": 1, "eval_repeats": 1, "op_T": 256,
         "op_eval_length": 1024}
QUICK_BATCH = {"tiny": 4, "small": 1}
TARGET_EVAL_LENGTH = 16384
PROBE_FORWARDS, PROBE_SECONDS = 3, 0.5  # timed forwards per evaluation child (see eval_probe)
LONG_EVAL = 4096  # beyond this length the default evaluation measures only the anchors (see eval_plan)
ROTATION_LIMIT, ROTATION_VALUES_LIMIT = 1.10, 1.15  # training step / NoPE (rope, accum random increments)
LEARNED_LIMIT, LEARNED_VALUES_LIMIT = 1.05, 1.08  # training step / NoPE (accum learned increments)
PATH_TRAIN_LIMIT = {"tiny": 2.0, "small": 1.5}  # PaTH's training step / NoPE
FAR_MASS_TIME_LIMIT, FAR_MASS_MEMORY_LIMIT = 2.0, 1.5  # evaluation forward / NoPE
OP_FAR_MASS_LIMIT = 1.5  # ALiBi's and FoX's attention op (forward + backward) / NoPE's
PATH_FORGET_LIMIT = 1.2  # PaTH-FoX's op / PaTH's
PATH_EVAL_LIMIT = 4.0  # PaTH's and PaTH-FoX's op evaluation forward at the op evaluation length / NoPE's
MIB = 2.0**20


@dataclasses.dataclass(frozen=True)
class Cell:
    """One built cell of the ablation grid (an output gate and a layer pattern are parts of a cell too)."""

    rotation: str
    far_mass: str = "none"
    rotate_values: bool = False
    increments: str | None = None
    output_gate: str = "none"
    layer_pattern: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.layer_pattern is not None:  # a list from JSON (the evaluation children): hashable again
            object.__setattr__(self, "layer_pattern", tuple(self.layer_pattern))

    @functools.cached_property
    def name(self) -> str:
        """The scheme's one name (:meth:`SchemeConfig.label`), e.g. ``accum:learned/forget+values``."""
        return self.scheme().label()

    @functools.cached_property
    def facts(self):
        """What the cell's parts declare (:func:`accrot.position.facts`): the benchmarks pick their cells by it."""
        from accrot.position import facts

        return facts(self.scheme())

    @property
    def plain(self) -> bool:
        """No output gate and no layer pattern: a cell of rotation × far_mass × rotate_values alone."""
        return not self.facts.gates_output and not self.facts.position_free_layers

    @property
    def far_mass_free(self) -> bool:
        """No far-mass part: neither a logit term growing with distance nor a logit factor."""
        return not (self.facts.controls_far_mass or self.facts.scales_logits)

    def scheme(self):
        from accrot.position import SchemeConfig

        return SchemeConfig(rotation=self.rotation, far_mass=self.far_mass, rotate_values=self.rotate_values,
                            increments=self.increments, output_gate=self.output_gate,
                            layer_pattern=None if self.layer_pattern is None else list(self.layer_pattern))


# beyond rotation × far_mass × rotate_values: the output gate on each rotation kind (its cost does not depend on
# the far mass, so once per rotation; headwise beside elementwise on NoPE) and NoPE/RoPE interleaving
GATED = (Cell("none", output_gate="elementwise"), Cell("none", output_gate="headwise"),
         Cell("rope", output_gate="elementwise"), Cell("accum", "none", True, "learned", output_gate="elementwise"),
         Cell("path", output_gate="elementwise"))
INTERLEAVED = (Cell("rope", layer_pattern=("cell", "none")),)
PATH_FOX = Cell("path", "forget")  # the cell PATH_FORGET_LIMIT was set for


def grid() -> list[Cell]:
    """Every cell the registries build, NoPE first: each registered rotation (each accum increment source the bench
    times itself, :attr:`IncrementSource.timed_as`) × none and each registered far-mass part × value transport where
    the rotation is SO(2), then :data:`GATED` and :data:`INTERLEAVED`. A newly registered family is benchmarked
    without an edit here."""
    from accrot.position import FAR_MASS, INCREMENTS, ROTATIONS, facts

    rotations = sorted(ROTATIONS, key=lambda r: r != "none")  # NoPE first: every ratio is to it
    far_masses = ["none", *FAR_MASS]
    timed = [name for name, source in INCREMENTS.items() if source.timed_as is None]
    cells = []
    for name in rotations:
        for source in timed if ROTATIONS[name].takes_increments else [None]:
            so2 = facts(Cell(name, increments=source).scheme())
            for far in far_masses:
                for values in (False, True) if so2.rotates and so2.commutes else (False,):
                    cells.append(Cell(name, far, values, source))
    return cells + list(GATED + INTERLEAVED)


def size_shape(size: str) -> dict[str, int]:
    """d_model, n_layers, n_heads, vocab_size and the recipe's batch of a shipped config."""
    import yaml

    doc = yaml.safe_load((CONFIG_DIR / f"{size}.yaml").read_text())
    model = doc["model"]
    return {"d_model": model["d_model"], "n_layers": model["n_layers"], "n_heads": model["n_heads"],
            "vocab_size": model.get("vocab_size", 256), "recipe_batch": doc["data"]["init_args"]["batch_size"]}


def build_model(cell: Cell, shape: dict[str, int], seed: int, device: torch.device):
    from accrot.model import ModelConfig, Transformer

    torch.manual_seed(seed)  # same backbone weights for every variant
    cfg = ModelConfig(vocab_size=shape["vocab_size"], d_model=shape["d_model"], n_layers=shape["n_layers"],
                      n_heads=shape["n_heads"], scheme=cell.scheme())
    return Transformer(cfg).to(device)


def parse_device(name: str) -> torch.device:
    """``--device``: a torch device the benchmarks run on (cpu or cuda), or a one-line :class:`UsageError`."""
    from accrot.errors import UsageError

    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise UsageError(f"device={name!r} is not a torch device (cpu, cuda, cuda:1, ...)") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device={name!r} but CUDA is not available here; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"device={name!r} is not supported by the benchmark; use cpu or cuda")
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_rounds(names: Sequence[str], nope: str, repeats: int, seed: int,
                       measure: Callable[[str], dict[str, float]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Measure every variant ``repeats`` times, NoPE interleaved as the reference.

    Each round visits the other variants once in a freshly shuffled order, with a NoPE measurement before the
    first and after each one, so every sample has two NoPE neighbours taken moments apart: a burst of load from
    another process (seconds long, here) hits a sample and its reference alike far more often than it would with
    one NoPE sample per round. ``measure(name)`` returns ``{metric: value}``. Returns, per variant and metric:
    ``median`` of the samples, ``ratio`` = median over rounds of sample / mean of its two NoPE neighbours (1 for
    NoPE), ``ratio_of_min`` = min(samples) / min(the NoPE samples measured right before them), and the samples.

    Both statistics compare equal numbers of draws. The minimum of two NoPE neighbours (as a per-sample
    reference), or the minimum over every NoPE sample of the run (~25 per variant sample), is systematically
    lower than one draw of the same noisy distribution: it inflated both ratios by about the noise's spread, a few
    percent on a shared machine, against every variant alike.
    """
    others = [n for n in names if n != nope]
    values: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    refs: dict[str, dict[str, list[float]]] = {n: {} for n in others}  # mean of the two neighbours
    befores: dict[str, dict[str, list[float]]] = {n: {} for n in others}  # the NoPE sample right before

    def add(store: dict[str, dict[str, list[float]]], name: str, res: dict[str, float]) -> None:
        for key, value in res.items():
            store[name].setdefault(key, []).append(value)

    for r in range(repeats):
        order = list(others)
        random.Random(seed + r).shuffle(order)
        before = measure(nope)
        add(values, nope, before)
        for name in order:
            res, after = measure(name), measure(nope)
            add(values, name, res)
            add(values, nope, after)
            add(refs, name, {key: 0.5 * (before[key] + after[key]) for key in res})
            add(befores, name, {key: before[key] for key in res})
            before = after
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        out[name] = {}
        for key, samples in values[name].items():
            if name == nope:
                ratios, of_min = [1.0] * len(samples), 1.0
            else:
                ratios = [v / ref for v, ref in zip(samples, refs[name][key])]
                of_min = min(samples) / min(befores[name][key])
            out[name][key] = {"median": statistics.median(samples), "ratio": statistics.median(ratios),
                              "ratio_of_min": of_min, "samples": samples, "ratio_samples": ratios}
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine(device: torch.device | str = "cpu") -> dict[str, Any]:
    """What a benchmark measured on: CPU model, cores, torch threads, torch and Python, the rotation-kernel path
    and, on CUDA, the GPU (every report carries it; ratios from two machines are not comparable)."""
    from accrot import runtime
    from accrot.ops import cpu_kernels

    dev = torch.device(device)
    out = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
           "python": platform.python_version(), "kernels": cpu_kernels.describe(dev), "device": str(dev),
           "denormals": runtime.denormals(), "allocator": runtime.allocator()}
    if dev.type == "cuda" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(dev)
        out["cuda"] = torch.version.cuda
    return out


def machine_line(info: dict[str, Any]) -> str:
    """One line of :func:`machine` for the terminal."""
    gpu = f"; {info['gpu']} (CUDA {info['cuda']})" if "gpu" in info else ""
    return (f"machine: {info['cpu']}, {info['cores']} cores, {info['threads']} torch threads; torch {info['torch']}, "
            f"Python {info['python']}; rotation kernels: {info['kernels']} on {info['device']}; "
            f"subnormals: {info.get('denormals', 'IEEE')}; malloc: {info.get('allocator', 'default')}{gpu}")
