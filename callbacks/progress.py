"""The terminal progress bar of a run: Lightning's ``RichProgressBar``, with an epoch label that makes sense for a
step-limited run, and every step's training loss.

The loss comes from :attr:`accrot.lit.LitLM.last_train_loss`, not from ``self.log``: LitLM logs it to the loggers
only on the steps they keep (``trainer.log_every_n_steps``), since each ``self.log`` call costs Lightning ~2 ms.

accrot's recipes stop at ``max_steps`` and leave ``max_epochs`` at Lightning's "unlimited" (−1), where Lightning
labels the bar ``Epoch 0/-2`` (``max_epochs − 1``). Without an epoch limit the label is ``Epoch N``; with one it is
Lightning's ``Epoch N/M``.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    def get_metrics(self, trainer, pl_module) -> dict:
        items = super().get_metrics(trainer, pl_module)
        loss = getattr(pl_module, "last_train_loss", None)
        if loss is not None:
            items["train/loss"] = float(loss)
        return items

    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        description = f"Epoch {current_epoch}"
        return f"{description:{len(self.validation_description)}}"  # as wide as "Validation": no flicker
