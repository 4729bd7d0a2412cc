"""Deliberate breakages the suite must catch (``make breakages``).

Each entry is a small, plausible mistake in the code — an interval at the wrong level, a verdict rule's direction
flipped, a running sum in the wrong precision, a gradient summed over ranks. For each, this script copies the
tracked tree into a scratch folder, applies the one edit, runs the test files that should notice, and reports
*caught* (they fail, having passed on the intact copy) or *MISSED* (they pass: the tests pin less than they
claim). It exits 1 if any is missed or
any edit no longer applies (the code it targets moved: update the entry). A later change shows its tests still
catch these by running it; add an entry whenever a review finds a test that could not fail.

    python tests/helpers/breakages.py [NAME ...]     # all entries, or the named ones
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Breakage:
    name: str
    what: str
    path: str  # file to edit, relative to the repository
    old: str  # text that must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest arguments (files, -k selections)


BREAKAGES = [
    Breakage("nll-bf16", "the evaluation's per-token NLL taken in the logits' dtype (bf16 under bf16-mixed)",
             "accrot/evaluation.py",
             'return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")',
             'return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").float()',
             ("tests/test_evaluation.py", "-k", "bf16")),
    Breakage("same-target-unpaired", "each length's same-target windows end at anchors of their own (shifted by the "
             "length): the lengths score different text again",
             "accrot/evaluation.py",
             "            chunk = torch.stack([stream[a - ln : a + 1] for a in batch]).to(device=device, dtype=torch.long)",
             "            chunk = torch.stack([stream[a - ln - ln // 2 : a + 1 - ln // 2] for a in batch]).to("
             "device=device, dtype=torch.long)",
             ("tests/test_evaluation.py", "-k", "same_target or receptive")),
    Breakage("same-target-rise-unpaired", "the rise's interval taken over each length's anchors separately (the "
             "text's shared variance kept)",
             "accrot/evaluation.py", "        diff = per_length[ln] - ref  # [n] paired per anchor",
             "        diff = per_length[ln] - ref.mean() + (ref - ref.mean()).flip(0)  # [n] not paired",
             ("tests/test_evaluation.py", "-k", "same_target or receptive")),
    Breakage("bootstrap-50", "the evaluation's 95 % bootstrap interval computed at 50 %",
             "accrot/evaluation.py", "torch.tensor([0.025, 0.975]", "torch.tensor([0.25, 0.75]",
             ("tests/test_evaluation.py",)),
    Breakage("bootstrap-made-up", "a made-up interval with no resampling at all",
             "accrot/evaluation.py", "    gen = torch.Generator().manual_seed(seed)\n",
             "    mean = float(block_nll.sum() / block_count.sum())\n    return [mean - 0.05, mean + 0.05]\n",
             ("tests/test_evaluation.py",)),
    Breakage("welch-z", "Welch's interval with the normal 1.96 instead of Student's t (too narrow for few seeds)",
             "accrot/study/stats.py", "    return _Test(ma - mb, math.sqrt(se2), max(1.0, df), math.sqrt(sa**2 + sb**2), min(na, nb))",
             "    return _Test(ma - mb, math.sqrt(se2), 1e9, math.sqrt(sa**2 + sb**2), min(na, nb))",
             ("tests/study/test_ablation.py", "-k", "not interrupted")),
    Breakage("unpaired", "variants with the same seeds compared unpaired (the seeds' shared variance kept)",
             "accrot/study/stats.py",
             "    common = sorted(set(va) & set(vb)) if isinstance(va, Mapping) and isinstance(vb, Mapping) else []",
             "    common = []",
             ("tests/study/test_ablation.py", "-k", "not interrupted")),
    Breakage("c3-flipped", "C3's direction flipped (+values must be *higher* to support it)",
             "accrot/study/claims.py",
             'c.comparisons.append(compare_nll(res, d, f"{a}: NLL {times(m)}", a, b, m, margin=margin))',
             'c.comparisons.append(compare_nll(res, d, f"{a}: NLL {times(m)}", a, b, m, margin=-margin,\n'
             '                                              lower_is_for=False))',
             ("tests/study/test_ablation.py", "-k", "not interrupted")),
    Breakage("c3-sign-only", "C3 read on the sign alone (no smallest help: a help of 0.01 nats would support it)",
             "accrot/study/claims.py", "        margin = c3_margin(res, d, b)\n        for m in lengths:",
             "        margin = 0.0\n        for m in lengths:",
             ("tests/study/test_ablation.py", "-k", "value_rotation")),
    Breakage("regularity-every-pair", "T1's prediction counts every pair alike, whatever share of the score it carries",
             "accrot/diagnostics/regularity.py", "        if q is None or k is None:\n",
             "        if True:\n",
             ("tests/diagnostics/test_diagnostics.py", "-k", "regularity")),
    Breakage("loggers-off-cwd", "a run with its loggers off written into the current directory (Lightning's default)",
             "accrot/run/lightning.py",
             '            kwargs["default_root_dir"] = str(self.run_dir)\n\n    def _loggers',
             "            pass\n\n    def _loggers",
             ("tests/test_cli.py", "-k", "loggers_off")),
    Breakage("pool-no-pair-check", "the pooled variance used for every pair, also a pair noisier than the pool",
             "accrot/study/stats.py",
             "        if self.sigma2 <= 0 or sps.f.sf(pair / self.sigma2, 2 * (self.seeds - 1), self.df) < 0.5:",
             "        if self.sigma2 <= 0:",
             ("tests/study/test_statistics.py",)),
    Breakage("pool-no-cochran", "the variants pooled even where one variant's residual variance stands out",
             "accrot/study/stats.py", "        if not p >= 0.05:\n", "        if False:\n",
             ("tests/study/test_statistics.py",)),
    Breakage("n1-direction", "N1 reading a cell *worse* than its comparator at 1× as precise",
             "accrot/study/claims.py", "cell, sibling, 1.0,\n                          margin=N1_MARGIN)",
             "cell, sibling, 1.0,\n                          margin=N1_MARGIN, lower_is_for=False)",
             ("tests/study/test_verdicts.py", "-k", "N1 or n1")),
    Breakage("coherence-one-draw", "random increments' coherence from one fixed evaluation draw (no fresh draws)",
             "accrot/diagnostics/layers.py", "                    if fresh_draws_apply(li.scheme) and draws > 0:",
             "                    if False:", ("tests/study/test_instruments.py", "-k", "end_to_end")),
    Breakage("t1-share-flipped", "T1 reading a share of placed windows *below* 3/4 as support, for the heads "
             "predicted to mix",
             "accrot/study/theory.py",
             'comps.append(compare_share(f"{v}: heads predicted to mix", k1, n1, T1_SHARE, label="placed "))',
             'comps.append(compare_share(f"{v}: heads predicted to mix", k1, n1, T1_SHARE, above_is_for=False, '
             'label="placed "))',
             ("tests/study/test_verdicts.py", "-k", "T1 or t1")),
    Breakage("t2-one-sided", "T2 accepting any growth of the window (a one-sided band)",
             "accrot/study/theory.py", "comp = compare_band(v, drifts, -WINDOW_BAND, WINDOW_BAND,",
             "comp = compare_band(v, drifts, -WINDOW_BAND, 10.0,", ("tests/study/test_verdicts.py", "-k", "T2")),
    Breakage("t3-sample-mean", "the lower bound's far weight per query as the sample mean of e^ℓ (ruled by its "
             "few largest logits) instead of its mean and spread", "accrot/diagnostics/far_mass.py",
             "        e_q = torch.exp((mu + var / 2).clamp(max=700))",
             "        e_q = (weights * far_keys).sum(-1) / n_far", ("tests/study/test_instruments.py", "-k", "far_mass_predicted")),
    Breakage("t3-no-gate", "the lower bound's prediction ignoring the bias's gate (ALiBi predicted unbounded)",
             "accrot/diagnostics/far_mass.py", "    g = decay.double()[:, None].clamp(max=0.0)  # [H, 1]",
             "    g = 0.0 * decay.double()[:, None]  # [H, 1]", ("tests/study/test_instruments.py", "-k", "predicted")),
    Breakage("t3-any-prediction", "T3 accepting any distance between measured and predicted far mass",
             "accrot/study/theory.py", "T3_AGREEMENT = 0.10", "T3_AGREEMENT = 1.0", ("tests/study/test_verdicts.py", "-k", "T3")),
    Breakage("t5-quarter-split", "far keys from L/4 for every head, ignoring the variant's own window",
             "accrot/diagnostics/bundle.py",
             "    windows = [max(base, math.ceil(w)) if math.isfinite(w) else base for w in own]",
             "    windows = [base for w in own]", ("tests/diagnostics/test_diagnostics.py", "-k", "bundle_is_json")),
    Breakage("c4-no-precondition", "C4 crediting a curve that never extrapolated (no check at 4×)",
             "accrot/study/claims.py", 'HORIZON_TOLERANCE, label="rise to 4× "', '10.0, label="rise to 4× "',
             ("tests/study/test_verdicts.py", "-k", "c4")),
    Breakage("n1-every-cell", "N1 asking every cell to be precise and flat (one imprecise cell sinks it)",
             "accrot/study/stats.py", "    if any(holm(p_case)):", "    if all(holm(p_case)):",
             ("tests/study/test_verdicts.py", "-k", "n1")),
    Breakage("null-ignored", "a claim's verdict that ignores what its rule reads on its null",
             "accrot/study/stats.py", "        if self.null is not None and self.null.verdict == SUPPORTED:",
             "        if False:", ("tests/study/test_nulls.py",)),
    Breakage("null-on-own-data", "the null read on the claim's own data (no control put in the subject's place)",
             "accrot/study/claims.py", "        return res.relabelled(self.reads(res) if self.reads else {})",
             "        return res", ("tests/study/test_nulls.py",)),
    Breakage("graft-keeps-own-curves", "T1's and T2's null keeping each transport's own coherence curves (no "
             "control's windows grafted in)", "accrot/study/claims.py",
             '            layer["coherence"] = grafted', "            pass",
             ("tests/study/test_nulls.py", "-k", "T1 or T2 or graft")),
    Breakage("t2-reads-layer-0", "T2 reading layer 0, whose increments see the token embeddings alone",
             "accrot/study/theory.py", '    return [layer["layer"] for layer in diag_layers(run) if layer.get("layer", 0) >= 1]',
             '    return [layer["layer"] for layer in diag_layers(run)]',
             ("tests/study/test_verdicts.py", "-k", "context")),
    Breakage("p-for-overruled", "a case verdict reading the seeds' p-value where the text's noise overruled it",
             "accrot/study/stats.py", "    if not agrees[\"for\"]:\n        comp.p_for = 1.0",
             "    if False:\n        comp.p_for = 1.0", ("tests/study/test_nulls.py", "-k", "overruled")),
    Breakage("learnability-gate-off", "S1–S3 reading variants that never learned the task at L",
             "accrot/study/state.py", "    if scaled >= LEARNED:", "    if True:",
             ("tests/study/test_verdicts.py", "-k", "never_learned or S2 or s2")),
    Breakage("rise-per-length-blocks", "the rises read on each length's own blocks where the same targets were scored",
             "accrot/study/results.py", '        name = "same_target_nll" if self.same_targets else "nll"',
             '        name = "nll"', ("tests/study/test_verdicts.py", "-k", "same_targets")),
    Breakage("holm-off", "no correction: one boundary against among many comparisons refutes a claim",
             "accrot/study/stats.py", "    keep = holm([c.p_against for c in comparisons])",
             "    keep = [True] * len(comparisons)", ("tests/study/test_verdicts.py", "-k", "holm")),
    Breakage("envelope-off", "an oscillating coherence fitted log-linearly to its first zero crossing",
             "accrot/diagnostics/coherence.py", "    oscillates = negative.any(-1)\n",
             "    oscillates = negative.any(-1) & False\n", ("tests/study/test_instruments.py", "-k", "oscillating")),
    Breakage("n1-accuracy-as-nll", "N1 judging an answer task's flatness by its NLL rise",
             "accrot/study/claims.py", "    if dataset in ANSWER_TASKS:", "    if False:",
             ("tests/study/test_verdicts.py", "-k", "local_task")),
    Breakage("far-mass-float32-sum", "the far-mass bias's running sum done in float32",
             "accrot/ops/attention.py", "c = log_decay.to(torch.float64).cumsum(-1)",
             "c = log_decay.to(torch.float32).cumsum(-1).double()",
             ("tests/ops/test_attention.py", "-k", "long_sequence")),
    Breakage("ddp-gradient-sum", "DDP gradients summed over the ranks instead of averaged",
             "accrot/lit.py", "        return loss\n\n    def _logs_this_step",
             "        return loss * self.trainer.world_size\n\n    def _logs_this_step",
             ("tests/test_ddp.py", "-k", "single_process_gradient and PaTH")),
    Breakage("ddp-shared-draws", "every DDP rank drawing the same random increments for different samples",
             "accrot/lit.py", "        self.model.set_data_shard(self.trainer.global_rank, self.trainer.world_size)\n",
             "        pass\n",
             ("tests/test_ddp.py", "-k", "single_process_gradient and accum")),
    Breakage("alibi-interleaving", "ALiBi's non-power-of-two heads taking the wrong half of 2n's slopes",
             "accrot/position/alibi.py", "alibi_slopes(2 * n)[0::2]", "alibi_slopes(2 * n)[1::2]",
             ("tests/position/test_far_mass.py",)),
    Breakage("lightning-lines-before-error", "Lightning's start-up lines printed before a one-line error",
             "accrot/run/lightning.py", "        with hold_startup_logs():  # an error before training is the only line printed\n",
             "        if True:\n",
             ("tests/test_bad_inputs.py", "-k", "out-of-range-scheme or missing-data or full-disk")),
    Breakage("counter-rng-arithmetic-shift", "the device draws' SplitMix64 shifted arithmetically (sign-extending)",
             "accrot/ops/counter_rng.py", "    return (z >> s) & ((1 << (64 - s)) - 1)\n", "    return z >> s\n",
             ("tests/ops/test_counter_rng.py",)),
    Breakage("device-draw-contiguous-shard", "a DDP rank's device draw takes a contiguous block of the global batch",
             "accrot/position/accum.py", "rows = torch.arange(B, device=device, dtype=torch.int64) * world + rank",
             "rows = torch.arange(B, device=device, dtype=torch.int64) + rank * B",
             ("tests/position/test_so2.py", "-k", "shards_the_global_batch")),
    Breakage("ssmax-block-length", "scalable softmax's n taken as the block length T, not the keys t + 1 a query sees",
             "accrot/position/ssmax.py", "torch.arange(1, T + 1, dtype=torch.float64, device=device).log()",
             "torch.full((T,), float(T), dtype=torch.float64, device=device).log()",
             ("tests/position/test_ssmax.py",)),
    Breakage("gate-before-transport", "the output gate applied to the values, before attention and their transport",
             "accrot/position/scheme.py",
             "        out = self._attend(q, k, v, x, tokens)  # [B, H, T, D]\n        if self.gate is not None:\n"
             "            out = out * self.gate.gate(x, tokens).to(out.dtype)",
             "        if self.gate is not None:\n            v = v * self.gate.gate(x, tokens).to(v.dtype)\n"
             "        out = self._attend(q, k, v, x, tokens)  # [B, H, T, D]",
             ("tests/position/test_output_gate.py", "-k", "explicit_twin")),
    Breakage("diagnostics-unscaled-rows", "the diagnostics' attention rows without the row's logit factor (ssmax)",
             "accrot/position/explicit.py",
             "    out = scores.double() * logit_factor(scheme, x, tokens)[:, :, rows, None]  # [B, H, R, T]\n",
             "    out = scores.double()  # [B, H, R, T]\n",
             ("tests/diagnostics/test_diagnostics.py", "-k", "attention_rows or closed_form")),
    Breakage("layer-pattern-ignored", "every layer built as layer 0 of its pattern", "accrot/model.py",
             "Block(cfg, layer) for layer in range(cfg.n_layers)", "Block(cfg, 0) for layer in range(cfg.n_layers)",
             ("tests/position/test_layer_pattern.py",)),
]


def scratch_copy(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of the working tree (no .venv, no runs)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def stale(b: Breakage) -> str | None:
    """Why the entry no longer applies to the code (its text must occur exactly once), or None."""
    path = REPO / b.path
    count = path.read_text().count(b.old) if path.is_file() else 0
    return None if count == 1 else f"its text occurs {count}× in {b.path}"


def _pytest(b: Breakage, scratch: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(scratch), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *b.tests],
                          cwd=scratch, env=env, capture_output=True, text=True, check=False)


def run(b: Breakage, scratch: Path) -> tuple[str, float]:
    """Run the entry's tests on the intact copy (they must pass), then with the edit (they must fail)."""
    if why := stale(b):
        return f"STALE ({why}: update the entry)", 0.0
    started = time.perf_counter()
    baseline = _pytest(b, scratch)
    if baseline.returncode != 0:
        return f"BASELINE FAILS (exit {baseline.returncode}: {baseline.stdout.strip().splitlines()[-1:]})", 0.0
    target = scratch / b.path
    text = target.read_text()
    target.write_text(text.replace(b.old, b.new))
    try:
        done = _pytest(b, scratch)
    finally:
        target.write_text(text)
    took = time.perf_counter() - started
    if done.returncode == 1:  # tests ran and failed; 2+ would be a collection or usage error, not a catch
        return "caught", took
    if done.returncode == 0:
        return "MISSED", took
    return f"ERROR (pytest exit {done.returncode}: {done.stdout.strip().splitlines()[-1:]})", took


def main(names: list[str]) -> int:
    chosen = [b for b in BREAKAGES if not names or b.name in names]
    unknown = set(names) - {b.name for b in BREAKAGES}
    if unknown:
        print(f"breakages: unknown name(s) {sorted(unknown)}; choose from {[b.name for b in BREAKAGES]}",
              file=sys.stderr)
        return 2
    bad = 0
    with tempfile.TemporaryDirectory(prefix="accrot-breakages-") as tmp:
        scratch = Path(tmp)
        scratch_copy(scratch)
        # the scratch copy, not the editable install, must be what the tests import
        where = subprocess.run([sys.executable, "-c", "import accrot; print(accrot.__file__)"], cwd=scratch,
                               env={**os.environ, "PYTHONPATH": str(scratch)}, capture_output=True, text=True)
        if not where.stdout.strip().startswith(str(scratch)):
            print(f"breakages: the scratch copy is not imported first ({where.stdout.strip()})", file=sys.stderr)
            return 1
        print(f"{'breakage':30} {'result':8} {'s':>5}  what")
        for b in chosen:
            result, took = run(b, scratch)
            bad += result != "caught"
            print(f"{b.name:30} {result:8} {took:5.0f}  {b.what} [{' '.join(b.tests)}]", flush=True)
    print(f"{len(chosen) - bad} caught, {bad} not caught")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
