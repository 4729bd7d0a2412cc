"""Theory diagnostics (T1–T5 of accrot/study/CLAIMS.md): coherence decay, mixing window, far-attention mass, score gap, value incoherence.

Everything is computed from a model's own per-layer q, k, v and the quantities its schemes expose
(``angles``, ``householder``, ``log_decay``), never from a fast kernel's internals:

* **coherence** (T1, T2). For query t and key s = t − Δ let ℓᴹ = q_tᵀ M_{t,s} k_s (the transported pairing the
  model uses, without scale or bias) and ℓᴵ = q_tᵀ k_s (the same pair, untransported). The curve is the
  least-squares slope of ℓᴹ on ℓᴵ, per head, over blocks and query positions:

      c(Δ) = E[ℓᴹ ℓᴵ] / E[(ℓᴵ)²]            (per head; expectations over blocks and query positions t ≥ Δ)

  "how much of the untransported signal survives transport over Δ steps". Why this normalisation: the plain
  ratio E[ℓᴹ] / E[ℓᴵ] has a denominator ≈ 0 whenever q·k has no systematic sign (random initialisation, most
  heads), while E[(ℓᴵ)²] > 0 always. It makes the i.i.d. prediction exact: for SO(2) pair i write
  z_i = conj(q_t,i) k_s,i (complex, half-split layout), so ℓᴹ = Σ_i Re(z_i e^{iφ_i}) with φ_i = θ_s,i − θ_t,i;
  when the increments are independent of q, k then E[ℓᴹ ℓᴵ] = Σ_i Re(E[e^{iφ_i}] E[z_i ℓᴵ]), and for zero-mean
  increments E[e^{iφ_i}] = |E[e^{iδ_i}]|^Δ, so with one spread for every pair c(Δ) = |E[e^{iδ}]|^Δ for *any*
  distribution of q, k. NoPE gives c ≡ 1 exactly (ℓᴹ = ℓᴵ). With pair-dependent spreads (ladder) or RoPE-mean
  drift μ_i the prediction assumes isotropic q, k (E[z_i ℓᴵ] real and equal across pairs):
  c(Δ) = mean_i |E[e^{iδ_i}]|^Δ cos(Δ μ_i). PaTH: ℓᴹ = (H_{s+1} ⋯ H_t q_t)·k_s by the per-query backward
  recurrence u ← H_j u (vector ops only).
* **error bars and fresh draws**: blocks are kept apart as replicates and the standard error is the ratio
  estimator's across them (:func:`~accrot.diagnostics.coherence.sums_stderr`). For random increments one fixed evaluation draw would be shared
  by every block (so blocks are not independent at all where the draw matters), and one draw spreads far more
  than its pairs suggest; instead each block's q, k are transported by ``draws`` independent fresh draws of the
  scheme's own increment distribution (:data:`FRESH_DRAWS`), which are independent of q, k: the prediction
  |φ|^Δ is then exact in expectation and the error bar covers it at its nominal rate (tested on known truth).
  Learned increments are a deterministic function of x: their blocks are the replicates.
* **mixing window** (:func:`fitted_window`): a weighted log-linear fit of c(Δ) over the resolved range
  1 ≤ Δ ≤ 7L/8 — the same range at every length, so T2 compares like with like — W where the fit meets ε; a window
  the range cannot place is *censored* ("> Δmax"), never dropped. The first crossing (``window_first_crossing``)
  and the sustained one are kept for reference: a crossing moves by ~20 tokens for an error of 0.03 in c.
* **far mass** (T3): attention probability on keys farther than ``window`` tokens (t − s > W), averaged over
  the last ``n_queries`` queries of each block, from the scheme's explicit attention (:mod:`accrot.position.explicit`:
  q, k, the rotation, the row's logit factor, scalable softmax's s_h·log(t + 1), and the far-mass bias, each term
  asked of its part), row chunk by row chunk (never a ``[T, T]`` tensor).
  The lower bound predicts growth with length for rotation-only schemes (NoPE with flat logits: (t − W)/(t + 1))
  and a bounded value with far-mass control (ALiBi). An output gate scales what the row averages, not the row:
  it leaves the far mass as it is.
* **score gap** (T5): over the same last queries, the transported scores D^−1/2 q_tᵀ M_{t,s} k_s (no far-mass
  bias, no logit factor: a factor common to a row's near and far keys leaves the gap's ratio as it is) of the
  near keys (0 ≤ Δ ≤ W) against the far keys' (Δ > W) mean and spread: gap = (mean near − mean
  far) / std far. Concentration predicts the far spread ≈ ‖q‖‖k‖/D (``concentration``, the mean over far pairs)
  and a near signal above it; the claim is that the gap measured at L holds at the longest length.
* **value far norm** (T4, SO(2) rotations): ‖Σ_{t−s>W} a_ts R(θ_t − θ_s) v_s‖ ("rotated") against
  ‖Σ_{t−s>W} a_ts v_s‖ ("unrotated") with the same weights a_ts, and the random-walk reference
  √(Σ a_ts² ‖v_s‖²) ("incoherent"). For a scheme without ``rotate_values`` "rotated" is the counterfactual.

Functions take a :class:`~accrot.model.Transformer` (or a LightningModule holding one as ``.model``) and token
blocks ``[N, T]``; they run in ``eval()`` mode (restoring the previous mode) so the exposed quantities are the
ones forward uses, under ``torch.no_grad`` with autocast off. The ``scheme_*`` functions do the same on one
scheme module and its inputs (tests use them with random q, k).
"""

from accrot.diagnostics.bundle import diagnose, summary
from accrot.diagnostics.coherence import (
    FRESH_DRAWS,
    curve_and_stderr,
    fitted_window,
    mixing_window_measured,
    predicted_coherence,
    prediction_basis,
    replicate_window,
    scheme_coherence,
    scheme_coherence_fresh,
    scheme_coherence_sums,
)
from accrot.diagnostics.far_mass import attention_rows, scheme_far_sums
from accrot.diagnostics.figures import plot_diagnostics
from accrot.diagnostics.inputs import SCHEMA, LayerInputs, default_distances, layer_inputs
from accrot.diagnostics.layers import coherence_curve, far_mass, value_far_norm

__all__ = [
    "FRESH_DRAWS", "SCHEMA", "LayerInputs", "attention_rows", "coherence_curve", "curve_and_stderr",
    "default_distances", "diagnose", "far_mass", "fitted_window", "layer_inputs", "mixing_window_measured",
    "plot_diagnostics", "predicted_coherence", "prediction_basis", "replicate_window", "scheme_coherence",
    "scheme_coherence_fresh", "scheme_coherence_sums", "scheme_far_sums", "summary", "value_far_norm",
]
