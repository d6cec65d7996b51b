"""Lightning's own loop at its barest, the floor under ``ablate bench loop``'s host time per step: a
``Trainer.fit`` of one linear layer on batches already in memory (no callbacks but a clock, no logger,
progress bar, checkpoint or gradient clipping) against the same step written by hand, in one process.
What is left of the host time above it is ablate's own (docs/performance.md, "How bench loop measures")."""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

STEPS = 2000  # timed steps of each side: at about a millisecond a step, a few seconds in all
WARMUP = 100


@dataclass(frozen=True)
class Floor:
    """The bare fit's median step and the median of the same step by hand (ms)."""

    loop_ms: float
    step_ms: float

    @property
    def host_ms(self) -> float:
        """What Lightning's loop itself adds to each step (ms)."""
        return self.loop_ms - self.step_ms


class _Linear(pl.LightningModule):
    """One ``Linear(4, 1)`` trained with SGD: a step of a few tensor operations."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.layer(batch).sum()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Ends(pl.Callback):
    """The wall clock at every training batch's end (as ``StepClock`` stamps the real loop)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: object, batch: object, batch_idx: int
    ) -> None:
        self.ends.append(time.perf_counter())


def lightning_floor(steps: int = STEPS, warmup: int = WARMUP) -> Floor:
    """Time ``warmup + steps`` steps of the bare fit on the CPU, then as many by hand; the medians of
    the last ``steps`` of each."""
    generator = torch.Generator().manual_seed(0)
    data = [torch.randn(2, 4, generator=generator) for _ in range(warmup + steps + 1)]
    ends = _Ends()
    with tempfile.TemporaryDirectory(prefix="ablate-bench-floor-") as root:
        trainer = pl.Trainer(
            max_steps=len(data),
            logger=False,
            callbacks=[ends],
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            devices=1,
            default_root_dir=root,
        )
        trainer.fit(_Linear(), DataLoader(data, batch_size=None))  # type: ignore[arg-type]  # a list of batches
    loop = [b - a for a, b in zip(ends.ends[warmup:], ends.ends[warmup + 1 :], strict=False)]
    module = _Linear()
    optimizer = module.configure_optimizers()
    by_hand = []
    for i, batch in enumerate(data):
        start = time.perf_counter()
        torch.autograd.backward(module.training_step(batch, i))
        optimizer.step()
        optimizer.zero_grad()
        by_hand.append(time.perf_counter() - start)
    return Floor(1e3 * statistics.median(loop), 1e3 * statistics.median(by_hand[warmup:]))
