"""Generation from a trained model: greedy or sampled continuations by cached decoding (``Transformer.prefill`` and
``step``: one new token costs O(context × D) per head), or by recomputing the whole prefix each token (the
reference a benchmark compares against), and the retrieval tasks' answers scored by what the model generates.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def next_token(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token of every row from ``logits [B, V]``: the argmax at temperature 0, else a draw from
    softmax(logits / temperature) restricted to the ``top_k`` largest (all without it). ``[B]`` int64."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(logits.device)


@torch.no_grad()
def generate(model, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             generator: torch.Generator | None = None, cached: bool = True, on_token=None) -> torch.Tensor:
    """``max_new_tokens`` tokens after ``prompt [B, T]`` (T ≥ 1), ``[B, max_new_tokens]`` int64.

    ``model`` is a :class:`~accrot.model.Transformer` in ``eval()``; ``cached=False`` recomputes the forward over
    the whole sequence for every token instead of decoding from the cache (the same tokens, at O(T²) a token).
    ``on_token(token [B])`` is called with each new token as it is drawn (progress, or keeping what was generated
    when the caller is interrupted)."""
    out = []
    if cached:
        logits, cache = model.prefill(prompt)
        last = logits[:, -1]
        for i in range(max_new_tokens):
            token = next_token(last, temperature, top_k, generator)  # [B]
            out.append(token)
            if on_token is not None:
                on_token(token)
            if i + 1 < max_new_tokens:
                last = model.step(token, cache)
    else:
        seq = prompt
        for _ in range(max_new_tokens):
            token = next_token(model(seq)[:, -1], temperature, top_k, generator)
            out.append(token)
            if on_token is not None:
                on_token(token)
            seq = torch.cat((seq, token[:, None]), 1)
    return torch.stack(out, 1) if out else prompt.new_zeros(prompt.shape[0], 0)


def answer_span(mask: torch.Tensor) -> tuple[int, int] | None:
    """``(first, last)`` scored target index of one block's ``mask [ℓ]``, or None when nothing is scored."""
    scored = mask.nonzero()
    if scored.numel() == 0:
        return None
    return int(scored[0]), int(scored[-1])


@torch.no_grad()
def generated_exact(model, blocks: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor,
                    max_batch_tokens: int = 16384, device: torch.device | str = "cpu") -> list[bool]:
    """Per block of ``blocks [N, ℓ+1]``: whether the answer the model generates greedily, from the block up to its
    first scored target's input, equals the answer (every scored target of ``targets [N, ℓ]`` under ``mask [N, ℓ]``,
    the answer's unscored separators generated in between). The blocks of one answer span decode as one batch."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i in range(blocks.shape[0]):
        span = answer_span(mask[i])
        if span is None:
            raise ValueError(f"block {i} scores no target: it has no answer to generate")
        groups.setdefault(span, []).append(i)
    exact = [False] * blocks.shape[0]
    for (first, last), rows in groups.items():
        per_batch = max(1, max_batch_tokens // (first + 1))
        for start in range(0, len(rows), per_batch):
            idx = torch.tensor(rows[start:start + per_batch])
            prompt = blocks[idx, : first + 1].to(device=device, dtype=torch.long)  # inputs 0..first
            got = generate(model, prompt, last - first + 1).cpu()  # [b, span]
            want = targets[idx, first:last + 1]
            scored = mask[idx, first:last + 1]
            hits = ((got == want) | ~scored).all(-1)  # [b]
            for i, hit in zip(rows[start:start + per_batch], hits.tolist()):
                exact[i] = bool(hit)
    return exact


def exact_by_depth(exact: Sequence[bool], depths: Sequence[float] | None) -> tuple[float, dict[str, float] | None]:
    """The share of exact answers, overall and per key depth (None without depths)."""
    overall = sum(exact) / max(1, len(exact))
    if depths is None:
        return overall, None
    by: dict[str, list[bool]] = {}
    for hit, d in zip(exact, depths):
        by.setdefault(f"{d:g}", []).append(hit)
    return overall, {d: sum(v) / len(v) for d, v in sorted(by.items(), key=lambda kv: float(kv[0]))}
