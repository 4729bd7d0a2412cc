"""The common backbone: a decoder-only pre-norm transformer whose attention is a position scheme.

Every variant of the ablation shares this module exactly; only the per-layer scheme built from
``ModelConfig.scheme`` differs; a ``scheme.layer_pattern`` makes some layers position-free
(NoPE/RoPE interleaving, as in Llama 4's iRoPE), each layer's scheme built by the registry for its index.
RMSNorm and SwiGLU follow LLaMA (Touvron et al., 2023).
No Lightning import here: the LightningModule in :mod:`accrot.lit` adds loop, loss and optimiser.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from accrot.position import ConfigError, SchemeConfig, build
from accrot.position.config import saved_scheme


@dataclass
class ModelConfig:
    """Backbone shape. ``d_model // n_heads`` is the head dim D of every scheme."""

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden: int | None = None  # None: SwiGLU's usual 8/3·d_model rounded up to a multiple of 32
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    init_std: float = 0.02
    scheme: SchemeConfig = field(default_factory=SchemeConfig)

    def __post_init__(self) -> None:
        if isinstance(self.scheme, dict):  # a checkpoint's hyperparameters (an earlier version's mean what they meant)
            self.scheme = SchemeConfig(**saved_scheme(self.scheme))
        if self.scheme.vocab_size != self.vocab_size:  # random_token tables index the model's vocabulary
            self.scheme = dataclasses.replace(self.scheme, vocab_size=self.vocab_size)
        for name in ("vocab_size", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r} is not valid; it must be a positive integer")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.mlp_hidden is not None and self.mlp_hidden < 1:
            raise ConfigError(f"mlp_hidden={self.mlp_hidden!r} is not valid; it must be a positive integer or null")
        self._check_layer_pattern()

    def _check_layer_pattern(self) -> None:
        """A ``scheme.layer_pattern`` must give these layers both kinds (layer i takes entry i mod len)."""
        pattern = self.scheme.layer_pattern
        if pattern is None:
            return
        kinds = {pattern[i % len(pattern)] for i in range(self.n_layers)}
        if kinds != {"cell", "none"}:
            raise ConfigError(
                f"scheme.layer_pattern={pattern!r} makes every one of n_layers={self.n_layers} layers "
                f"{'position-free' if kinds == {'none'} else 'the cell'}; give a pattern whose first {self.n_layers} "
                "entries hold both 'cell' and 'none' (e.g. [cell, none]), or drop it"
            )

    @property
    def hidden(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        return 32 * -(-(8 * self.d_model // 3) // 32)


class RMSNorm(nn.Module):
    """x / rms(x) · g, computed in float32 (Zhang & Sennrich, 2019)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    """W_2 (silu(W_1 x) ⊙ W_3 x) (Shazeer, 2020)."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w13 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)  # [B, T, hidden] each
        return self.w2(F.silu(gate) * up)


class Attention(nn.Module):
    """Multi-head causal attention; the position scheme does the q·k pairing and the mixing."""

    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.scheme = build(cfg.scheme, cfg.d_model, cfg.n_heads, layer)  # this layer's entry of a layer_pattern

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, T, d_model]`` → q, k, v ``[B, H, T, D]`` (exposed for diagnostics)."""
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim)  # [B, T, 3, H, D]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, H, T, D] each
        return q, k, v

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.project(x)
        y = self.scheme(q, k, v, x, tokens)  # [B, H, T, D]
        return self.out(y.transpose(1, 2).reshape(B, T, C))

    def prefill(self, x: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, object]:
        """:meth:`forward` over a prompt and this layer's decoding cache (the scheme's)."""
        B, T, C = x.shape
        q, k, v = self.project(x)
        y, cache = self.scheme.prefill(q, k, v, x, tokens)  # [B, H, T, D]
        return self.out(y.transpose(1, 2).reshape(B, T, C)), cache

    def step(self, x: torch.Tensor, tokens: torch.Tensor, cache) -> torch.Tensor:
        """One new position ``x [B, 1, d_model]`` after ``cache`` (extended in place)."""
        B, T, C = x.shape
        q, k, v = self.project(x)
        y = self.scheme.step(q, k, v, x, tokens, cache)  # [B, H, 1, D]
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.hidden)

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        # the scheme sees the normalised layer input, the same tensor q, k, v are projected from
        x = x + self.attn(self.attn_norm(x), tokens)
        return x + self.mlp(self.mlp_norm(x))

    def prefill(self, x: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, object]:
        y, cache = self.attn.prefill(self.attn_norm(x), tokens)
        x = x + y
        return x + self.mlp(self.mlp_norm(x)), cache

    def step(self, x: torch.Tensor, tokens: torch.Tensor, cache) -> torch.Tensor:
        x = x + self.attn.step(self.attn_norm(x), tokens, cache)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Decoder-only LM: ``tokens [B, T] int64 → logits [B, T, vocab]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        for layer, scheme in enumerate(self.schemes()):  # random increments: each layer its own draws
            scheme.set_stream(layer)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        # GPT-2's depth-scaled init of the residual projections keeps the residual stream's variance flat
        for name, p in self.named_parameters():
            if name.endswith(("attn.out.weight", "mlp.w2.weight")):
                nn.init.normal_(p, std=cfg.init_std / (2 * cfg.n_layers) ** 0.5)

    def set_data_shard(self, rank: int, world: int) -> None:
        """Tell the schemes which rows of the global batch this process trains on (DDP rank r of W holds rows
        r, r + W, …), so random increments' training draws match a single process's for the same global batch."""
        for scheme in self.schemes():
            scheme.set_data_shard(rank, world)

    def _init(self, module: nn.Module) -> None:
        # only the backbone's own layers: schemes initialise their parameters themselves
        if isinstance(module, (Attention, SwiGLU)):
            for lin in module.children():
                if isinstance(lin, nn.Linear):
                    nn.init.normal_(lin.weight, std=self.cfg.init_std)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=self.cfg.init_std)
        elif module is getattr(self, "head", None):
            nn.init.normal_(module.weight, std=self.cfg.init_std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [B, T], got shape {tuple(tokens.shape)}")
        x = self.embed(tokens)  # [B, T, d_model]
        for block in self.blocks:
            x = block(x, tokens)
        return self.head(self.norm(x))  # [B, T, vocab]

    def schemes(self) -> list[nn.Module]:
        return [block.attn.scheme for block in self.blocks]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- cached decoding: a prompt once, then one token per step -------------------------------------------
    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list]:
        """The forward over a prompt ``tokens [B, T]`` (T ≥ 1) and the cache :meth:`step` continues from:
        ``(logits [B, T, vocab], cache)``, one entry per layer (its scheme's). In ``eval()``: random increments
        are then the fixed function of position that decoding reproduces."""
        if tokens.dim() != 2 or tokens.shape[1] < 1:
            raise ValueError(f"tokens must be [B, T] with T >= 1, got shape {tuple(tokens.shape)}")
        x = self.embed(tokens)  # [B, T, d_model]
        caches = []
        for block in self.blocks:
            x, cache = block.prefill(x, tokens)
            caches.append(cache)
        return self.head(self.norm(x)), caches

    def step(self, tokens: torch.Tensor, cache: list) -> torch.Tensor:
        """The next token of every row (``tokens [B]`` or ``[B, 1]``) after ``cache`` (extended in place):
        ``logits [B, vocab]``, what the forward over the whole sequence so far gives at its last position."""
        tokens = tokens.reshape(-1, 1)  # [B, 1]
        x = self.embed(tokens)  # [B, 1, d_model]
        for block, layer_cache in zip(self.blocks, cache):
            x = block.step(x, tokens, layer_cache)
        return self.head(self.norm(x))[:, 0]  # [B, vocab]
