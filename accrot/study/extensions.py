"""The RoPE-extension rows of the ablation: every complete RoPE run evaluated again with position interpolation,
NTK-aware scaling and YaRN in the field's code form (accrot.position.rope_scaling; factor s = T / L at each length;
an evaluation recorded under another form of its kind is made again), from its own checkpoint,
on the same evaluation blocks and budget as its training-time evaluation. No extra training: the rows are labelled
"eval-time extension" wherever they appear (tables, figures, claims)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from accrot.position.rope_scaling import KINDS, written_definition
from accrot.study.results import Results, Run, final_lengths
from accrot.study.variants import DATASET_RECORDS, EXTENSION_RECORDS


def extension_runs(res: Results, console=None) -> list[Run]:
    """A :class:`Run` per RoPE run × extension, from ``<run>/eval-<kind>/extrapolation.json``, evaluated once (a
    report built again, or an ablation resumed, reads the files it finds)."""
    out = []
    # the state-tracking tasks read accuracy against S1–S3, which compare no RoPE extension
    state = {d.name for d in DATASET_RECORDS.values() if d.state}
    evaluated = {e.of for e in EXTENSION_RECORDS}  # RoPE
    rope = [r for r in res.runs if r.extension is None and r.variant in evaluated and r.dataset not in state]
    for i, run in enumerate(rope):
        trained = json.loads((Path(run.run_dir) / "extrapolation.json").read_text())["final"]["step"]
        for ext in (e for e in EXTENSION_RECORDS if e.of == run.variant):
            kind = ext.kind
            path = Path(run.run_dir) / f"eval-{kind}" / "extrapolation.json"
            stale = path.is_file() and written_definition(
                json.loads(path.read_text()).get("rope_scaling") or {}) != KINDS[kind].definition
            if not path.is_file() or stale:  # evaluated once; again where the file holds another form of the kind
                if console is not None:
                    again = " again: its file holds an older form" if stale else ""
                    console.print(f"eval-time extensions: {kind} of {run.variant} {run.dataset} seed {run.seed} "
                                  f"({i + 1} of {len(rope)}){again}", highlight=False)
                _evaluate(run, kind)
            doc = json.loads(path.read_text())
            if doc["final"].get("step") != trained:  # another model than the row it would be compared with
                if console is not None:
                    console.print(f"eval-time extensions: {kind} of {run.variant} {run.dataset} seed {run.seed} left out: "
                                  f"its checkpoint is from step {doc['final'].get('step')}, the run's evaluation "
                                  f"from step {trained}", highlight=False)
                continue
            out.append(Run(dataset=run.dataset, variant=ext.label, seed=run.seed, run_dir=run.run_dir,
                           lengths=final_lengths(doc), train_length=int(doc["train_length"]), diagnostics=None,
                           extension=kind))
    return out


def _evaluate(run: Run, kind: str) -> None:
    """``accrot eval`` of the run's last checkpoint with ``kind`` at the run's own lengths and token budget."""
    from accrot.run.eval import main as evaluate

    own = json.loads((Path(run.run_dir) / "extrapolation.json").read_text())
    multipliers = sorted(run.lengths)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        evaluate(["--ckpt", str(Path(run.run_dir) / "checkpoints" / "last.ckpt"), "--rope_scaling", kind,
                  f"--multipliers={json.dumps(multipliers)}", f"--budget_tokens={own['budget_tokens']}"])
