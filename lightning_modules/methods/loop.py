"""What every training loop gets: the NaN guard and a progress bar, neither of which reads the
device each step.

Reading a device tensor on the host (``.item()``, ``float()``, ``if tensor``) waits for the
device to finish everything queued: on a GPU the host then cannot queue the next step while
this one runs. Lightning converts every ``prog_bar=True`` value to a number after every batch,
so the modules log no progress-bar values during training; :class:`LoopProgressBar` reads the
loss when it refreshes (every ``trainer.log_every`` steps).

The NaN guard:
Reading a loss on the host (``if not torch.isfinite(loss)``) waits for the device to finish
the step: on a GPU it stops the host from queueing the next one. :class:`FiniteLoss` instead
folds each step's loss into a flag that stays on the device, with the first bad step and its
value, and reads it every ``every`` steps (when the logger reads the metrics anyway), before
validation and at the end of training. A non-finite loss fails the run with a
``FloatingPointError`` naming the step at which it first happened.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, TQDMProgressBar

from ablate.lightning_modules.config.run import TrainerConfig


class FiniteLoss(Callback):
    """Fail the run when the training loss is NaN or infinite.

    The module names its loss with a ``loss_name`` attribute (default ``training loss``) and
    may say more with a ``describe_step(step) -> str`` method (a distillation's stage; "" = nothing).

    Args:
        every: read the device flag every this many steps (``trainer.log_every``).
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self._step = 0
        self._first: torch.Tensor | None = None  # () long: the first bad step, -1 while none
        self._value: torch.Tensor | None = None  # () float: the loss at that step

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        self.update(loss.detach(), self._step)
        if trainer.global_step % self.every == 0:
            self.check(pl_module)

    def update(self, loss: torch.Tensor, step: int) -> None:
        """Fold one step's loss into the flag (device operations only)."""
        if self._first is None:
            self._first = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._value = torch.zeros((), dtype=torch.float32, device=loss.device)
        assert self._value is not None
        new = ~torch.isfinite(loss) & (self._first < 0)
        self._first = torch.where(new, step, self._first)
        self._value = torch.where(new, loss.float(), self._value)

    def check(self, pl_module: pl.LightningModule | None = None) -> None:
        """Raise ``FloatingPointError`` if a step so far had a non-finite loss (one host read)."""
        if self._first is None or self._value is None:
            return
        step = int(self._first)
        if step < 0:
            return
        describe = getattr(pl_module, "describe_step", None)
        text = describe(step) if describe is not None else ""
        detail = f" ({text})" if text else ""
        what = getattr(pl_module, "loss_name", "training loss")
        raise FloatingPointError(f"{what} became {float(self._value)} at step {step}{detail}")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check(pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check(pl_module)


class LoopProgressBar(TQDMProgressBar):
    """Lightning's bar, refreshed every ``refresh_rate`` steps, showing ``train/loss`` (read from
    the device only then) beside what Lightning shows."""

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None:
            items["loss"] = f"{float(loss):.4f}"
        return items


def loop_callbacks(t: TrainerConfig) -> list[Callback]:
    """The NaN guard, and the progress bar when ``trainer.progress`` is on."""
    bar: list[Callback] = [LoopProgressBar(refresh_rate=t.log_every, leave=False)] if t.progress else []
    return [FiniteLoss(t.log_every), *bar]
