"""What every training loop gets: the NaN guard and a progress bar, neither of which reads the
device each step (a host read waits for the device, so a GPU's host could not queue the next step):
the guard keeps the losses on the device and reads them every ``trainer.log_every`` steps, the bar
reads the loss only when it refreshes (a log step, at most twice a second)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, TQDMProgressBar
from lightning.pytorch.utilities.types import STEP_OUTPUT

from ablate.lightning_modules.config.run import TrainerConfig


class FiniteLoss(Callback):
    """Fail the run when the training loss is NaN or infinite.

    The module names its loss with a ``loss_name`` attribute (default ``training loss``) and
    may say more with a ``describe_step(step) -> str`` method (a distillation's stage; "" = nothing).

    Args:
        every: read the losses kept since the last check every this many steps (``trainer.log_every``).
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self._step = 0
        self._kept: list[tuple[int, torch.Tensor]] = []  # (step, its loss) since the last check, on the device

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: object, batch_idx: int
    ) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: STEP_OUTPUT, batch: object, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, Mapping) else outputs
        if loss is None:
            return
        self.update(loss, self._step)
        if trainer.global_step % self.every == 0:
            self.check(pl_module)

    def update(self, loss: torch.Tensor, step: int) -> None:
        """Keep one step's loss (a copy on the device: a CUDA graph's next replay overwrites its output)."""
        self._kept.append((step, loss.detach().clone()))

    def check(self, pl_module: pl.LightningModule | None = None) -> None:
        """Raise ``FloatingPointError`` naming the first step since the last check whose loss was not
        finite (one host read of every kept loss's flag); the kept losses are then let go."""
        if not self._kept:
            return
        kept, self._kept = self._kept, []
        finite = torch.isfinite(torch.stack([loss.float() for _, loss in kept])).tolist()
        if all(finite):
            return
        step, loss = kept[finite.index(False)]
        describe = getattr(pl_module, "describe_step", None)
        text = describe(step) if describe is not None else ""
        detail = f" ({text})" if text else ""
        what = getattr(pl_module, "loss_name", "training loss")
        raise FloatingPointError(f"{what} became {float(loss)} at step {step}{detail}")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check(pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check(pl_module)


class LoopProgressBar(TQDMProgressBar):
    """Lightning's bar, refreshed at most every ``REFRESH_S`` seconds and only at every
    ``refresh_rate``-th step (a log step), showing ``train/loss`` (read from the device only then)
    beside what Lightning shows: a refresh costs a millisecond or two of host time and a device read."""

    REFRESH_S = 0.5

    def __init__(self, refresh_rate: int = 1, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self._shown = 0.0

    def _should_update(self, current: int, total: int) -> bool:
        if not super()._should_update(current, total):
            return False
        now = time.monotonic()
        if current != total and now - self._shown < self.REFRESH_S:
            return False
        self._shown = now
        return True

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
