"""LightningModule around the backbone: next-token loss, AdamW with warmup + cosine, metrics.

Gradient clipping is the Trainer's (``trainer.gradient_clip_val`` in the shipped configs), so it is
logged and applied the same way under every precision and strategy.

A non-finite training loss, or a non-finite gradient before the optimiser step, stops the run at once with
:class:`FloatingPointError` naming the step and the tensor (the loss, or the parameter whose gradient went
bad): a diverged run must never keep training on NaNs. The gradient check is off under a GradScaler
(``16-mixed``), whose skipped inf steps are expected.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.text import Perplexity

from accrot.errors import ConfigError
from accrot.model import ModelConfig, Transformer
from accrot.position import SchemeConfig

_log = logging.getLogger(__name__)

IGNORE_INDEX = -100


def _check_optimiser(lr: float, weight_decay: float, scheme_weight_decay: float, betas, warmup_steps: int,
                     min_lr_ratio: float) -> None:
    """Reject optimiser settings torch would refuse mid-run (or accept and silently not train), by name."""
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if not number(lr) or lr <= 0:
        raise ConfigError(f"model.lr={lr!r} is not valid; it must be a positive number (e.g. 3e-3)")
    for name, value in (("weight_decay", weight_decay), ("scheme_weight_decay", scheme_weight_decay)):
        if not number(value) or value < 0:
            raise ConfigError(f"model.{name}={value!r} is not valid; it must be a number >= 0")
    if len(tuple(betas)) != 2 or not all(number(b) and 0 <= b < 1 for b in betas):
        raise ConfigError(f"model.betas={list(betas)!r} is not valid; give two numbers in [0, 1), e.g. [0.9, 0.95]")
    if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
        raise ConfigError(f"model.warmup_steps={warmup_steps!r} is not valid; it must be an integer >= 0")
    if not number(min_lr_ratio) or not 0 <= min_lr_ratio <= 1:
        raise ConfigError(f"model.min_lr_ratio={min_lr_ratio!r} is not valid; it must lie in [0, 1]")


class LitLM(L.LightningModule):
    """A causal LM whose attention differs only by ``scheme``.

    Args:
        lr: peak learning rate of AdamW.
        weight_decay: decoupled weight decay on the backbone's matrices (not on norms, biases or gains).
        scheme_weight_decay: decoupled weight decay on the position scheme's own matrices (its projections and
            convolutions: w, β, increments, the forget gate). 0 by default: decay pulls a learned increment toward
            zero (NoPE) and a gate toward its init, a prior the schemes' references do not impose on the scheme
            (FoX exempts its gate's bias, Selective RoPE its scalars). At the study size it made no difference beyond
            the seeds' spread (accum-learned, 1x NLL 2.04 and 2.06 without decay, 2.03 with 0.1).
        betas: AdamW betas.
        warmup_steps: linear warm-up length.
        min_lr_ratio: the cosine decays to ``lr · min_lr_ratio`` at ``trainer.max_steps``.
        **backbone: every field of :class:`~accrot.model.ModelConfig` (``d_model``, ``n_layers``, ``n_heads``,
            ``vocab_size``, ``mlp_hidden``, ``tie_embeddings``, ``norm_eps``, ``init_std``, and ``scheme``, the
            position scheme of every layer), under the same keys (``--model.d_model=96``).
    """

    def __init__(
        self,
        lr: float = 3e-3,
        weight_decay: float = 0.1,
        scheme_weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 50,
        min_lr_ratio: float = 0.1,
        **backbone: Any,
    ) -> None:
        super().__init__()
        _check_optimiser(lr, weight_decay, scheme_weight_decay, betas, warmup_steps, min_lr_ratio)
        # the config's keys are ModelConfig's own (jsonargparse reads them from this call); a scheme given as a
        # dict (a checkpoint's hyperparameters) becomes a SchemeConfig, whose vocabulary follows the model's
        self.model_config = ModelConfig(**backbone)
        # plain dicts in the checkpoint: loadable without pickled classes, comparable across runs
        self.save_hyperparameters(ignore=["scheme"])
        backbone = asdict(self.model_config)  # every field, given or default: the checkpoint says what it is
        self.hparams.update({k: v for k, v in backbone.items() if k != "scheme"}, scheme=backbone["scheme"])
        self.model = Transformer(self.model_config)
        self.val_ppl = Perplexity(ignore_index=IGNORE_INDEX)
        self.last_train_loss: torch.Tensor | None = None  # the progress bar's (see _step)

    @property
    def scheme_config(self) -> SchemeConfig:
        return self.model_config.scheme

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    def setup(self, stage: str) -> None:
        # the sampler gives rank r of W rows r, r + W, … of each global batch; random increments draw to match
        self.model.set_data_shard(self.trainer.global_rank, self.trainer.world_size)

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], ppl: Perplexity | None, stage: str) -> torch.Tensor:
        inputs, targets = batch  # [B, T] each
        logits = self.model(inputs)  # [B, T, V]
        # targets of -100 are unscored (a synthetic task scores only its answers)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
        on_step = stage == "train"
        if on_step:
            # the progress bar reads the last loss from here (callbacks/progress.py); each self.log costs ~2 ms of
            # Lightning's bookkeeping (it moves the stored result to the value's device every call), 4 % of a tiny
            # step, so the loggers get it on the steps they keep (accrot bench pipeline)
            self.last_train_loss = loss.detach()
            if self._logs_this_step():
                self.log("train/loss", loss, on_step=True, on_epoch=False)
        else:
            self.log(f"{stage}/loss", loss, prog_bar=True, on_epoch=True, sync_dist=True)
        if ppl is None:
            # one batch's perplexity is exp(its mean token NLL) = exp(loss) exactly; torchmetrics' Perplexity would
            # recompute a softmax over [B, T, V] for it, and logging a Metric object makes Lightning walk the
            # metric's whole state every step: together ~8% of a tiny training step (accrot bench pipeline)
            if self._logs_this_step():
                self.log(f"{stage}/ppl", loss.detach().exp(), on_step=True, on_epoch=False)
        else:  # over an epoch of batches the metric's running sums are what perplexity needs
            ppl(logits.float(), targets)
            self.log(f"{stage}/ppl", ppl, on_step=on_step, on_epoch=not on_step)
        return loss

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._step(batch, None, "train")
        if not torch.isfinite(loss):  # one host sync per step; a NaN never reaches the weights
            raise FloatingPointError(
                f"the training loss is {loss.item()} at step {self.global_step} (epoch {self.current_epoch}, "
                f"batch {batch_idx}); lower model.lr or set trainer.gradient_clip_val"
            )
        if self._logs_this_step():
            # made on the device by a fill (a Python float would be copied host-to-device by self.log)
            lr = torch.full((), self.trainer.optimizers[0].param_groups[0]["lr"], device=loss.device)
            self.log("train/lr", lr, on_step=True, on_epoch=False)
        return loss

    def _logs_this_step(self) -> bool:
        """True on the steps whose on-step values reach the loggers (every ``trainer.log_every_n_steps``, the
        last step, a fast_dev_run): each ``self.log`` costs ~2 ms of Lightning's bookkeeping, and values logged in
        between are dropped anyway. The progress bar shows every step's loss from :attr:`last_train_loss`."""
        trainer = self.trainer
        every = trainer.log_every_n_steps
        step = self.global_step + 1  # the step this batch completes
        last = trainer.max_steps is not None and trainer.max_steps > 0 and step >= trainer.max_steps
        return bool(trainer.fast_dev_run) or last or (every > 0 and step % every == 0)

    def on_before_optimizer_step(self, optimizer) -> None:
        """Stop on the first non-finite gradient (before clipping), naming its parameter. Where the trainer clips by
        norm, :meth:`configure_gradient_clipping` checks instead, with the norm it clips by (one pass, not two)."""
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            return  # a GradScaler skips inf steps and lowers its scale: expected, not a divergence
        if self._clips_by_norm_here(self.trainer.gradient_clip_val, self.trainer.gradient_clip_algorithm):
            return
        named = [(n, p.grad) for n, p in self.named_parameters() if p.grad is not None]
        if named:
            self._check_gradients(named, torch.nn.utils.get_total_norm([g for _, g in named]))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping; when it clips by norm on a plain precision plugin, the total norm is computed once,
        checked for NaN/Inf (naming the parameter, before any gradient is scaled) and then used to clip."""
        if not self._clips_by_norm_here(gradient_clip_val, gradient_clip_algorithm):
            self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                                gradient_clip_algorithm=gradient_clip_algorithm)
            return
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not params:
            return
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if not bool(torch.isfinite(norm)):  # the names are looked up only when there is something to name
            by_id = {id(p): n for n, p in self.named_parameters()}
            self._check_gradients([(by_id.get(id(p), "?"), p.grad) for p in params], norm)
        torch.nn.utils.clip_grads_with_norm_(params, float(gradient_clip_val), norm)

    def _clips_by_norm_here(self, clip_val, algorithm) -> bool:
        """True when the trainer clips by norm through the plain precision plugin (no GradScaler, no strategy of its
        own clipping, e.g. FSDP or DeepSpeed): then :meth:`configure_gradient_clipping` does the check and the clip."""
        from lightning.pytorch.plugins.precision import Precision

        plugin = self.trainer.precision_plugin
        return (bool(clip_val) and algorithm in (None, "norm") and getattr(plugin, "scaler", None) is None
                and getattr(type(plugin), "clip_grad_by_norm", None) is Precision.clip_grad_by_norm)

    def _check_gradients(self, named: list[tuple[str, torch.Tensor]], norm: torch.Tensor) -> None:
        """FloatingPointError naming the first parameter whose gradient is NaN or Inf, when ``norm`` (their total
        norm) is not finite. A huge finite norm can overflow to inf in float32: the search then finds nothing and
        training goes on."""
        if bool(torch.isfinite(norm)):  # one sync: a NaN or Inf anywhere makes the norm non-finite
            return
        finite = torch.stack([torch.isfinite(g).all() for _, g in named])  # [n_params] bool
        if bool(finite.all()):
            return
        name, grad = named[int((~finite).nonzero()[0])]
        kind = "NaN" if bool(torch.isnan(grad).any()) else "Inf"
        raise FloatingPointError(
            f"the gradient of {name} has {kind} values at step {self.global_step} (epoch {self.current_epoch}); "
            "lower model.lr or set trainer.gradient_clip_val"
        )

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, self.val_ppl, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, self.val_ppl, "test")

    def parameter_groups(self) -> list[dict[str, Any]]:
        """AdamW's three groups, always in this order (so an optimiser state loads into any variant's): the
        backbone's matrices (``weight_decay``), the position scheme's own matrices (``scheme_weight_decay``), and
        every vector (norm gains, biases, ladders: no decay)."""
        groups: dict[str, list[torch.nn.Parameter]] = {"backbone": [], "scheme": [], "vectors": []}
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                kind = "vectors" if p.dim() < 2 else "scheme" if ".scheme." in name else "backbone"
                groups[kind].append(p)
        hp = self.hparams
        decay = {"backbone": hp.weight_decay, "scheme": hp.get("scheme_weight_decay", 0.0), "vectors": 0.0}
        return [{"params": ps, "weight_decay": decay[kind], "name": kind} for kind, ps in groups.items()]

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(self.parameter_groups(), lr=hp.lr, betas=tuple(hp.betas))
        total = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else None
        if total is None:
            total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup, floor = hp.warmup_steps, hp.min_lr_ratio
        trainer = self.trainer  # (the pipeline benchmark drives this with a stand-in that has max_steps only)
        if warmup >= total and getattr(trainer, "is_global_zero", True) and not getattr(trainer, "fast_dev_run", 0):
            # legitimate (a short run of a long recipe), but the schedule never leaves its warm-up: say so once
            _log.warning(f"accrot: warning: model.warmup_steps={warmup} >= the run's {total} steps: the learning "
                         f"rate rises linearly for the whole run and never reaches model.lr={hp.lr:g}")

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
