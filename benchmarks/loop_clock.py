"""The clocks of ``ablate bench loop``: the loop's steady state stamped at every training batch's
end (:class:`StepClock`, a Lightning callback), the step alone run in turns beside it
(:class:`Alone`), and what each timed (:class:`Timing`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import lightning.pytorch as pl
import torch

from ablate.benchmarks.train_speed import Batch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Timing:
    """Timed blocks of steps (seconds, steps), the real tokens they trained on, in all and per block, and
    the main thread's CPU seconds per block (``time.thread_time``: what the machine's other processes
    and threads do not inflate)."""

    blocks: list[tuple[float, int]] = field(default_factory=list)
    tokens: float = 0.0
    block_tokens: list[float] = field(default_factory=list)
    block_cpu: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return sum(n for _, n in self.blocks)

    @property
    def seconds(self) -> float:
        return sum(s for s, _ in self.blocks)

    @property
    def median_step_s(self) -> float:
        """The median block's seconds per step (one block: its mean)."""
        return statistics.median(s / n for s, n in self.blocks)

    @property
    def tokens_per_s(self) -> float:
        """Real tokens per step over the median step time."""
        return self.tokens / self.steps / self.median_step_s

    @property
    def mean_tokens_per_s(self) -> float:
        """Real tokens over the time of all blocks."""
        return self.tokens / self.seconds

    def block_rates(self) -> list[float]:
        """Each block's real tokens per second."""
        return [t / s for t, (s, _) in zip(self.block_tokens, self.blocks, strict=True)]


def turn_ratios(loop: Timing, alone: Timing) -> list[float]:
    """Turn by turn, the loop's tokens/s over the step alone's (the two blocks of a turn run one
    after the other, on the same batches); empty unless they ran in turns."""
    if len(loop.blocks) != len(alone.blocks) or len(loop.block_tokens) != len(loop.blocks):
        return []
    return [a / b for a, b in zip(loop.block_rates(), alone.block_rates(), strict=True)]


def turn_gaps(loop: Timing, alone: Timing) -> list[float]:
    """Turn by turn, the loop's seconds per step less the step alone's: the host time the loop adds to
    each step (its hooks, callbacks, logging, loader); empty unless they ran in turns."""
    if len(loop.blocks) != len(alone.blocks):
        return []
    return [a / n - b / m for (a, n), (b, m) in zip(loop.blocks, alone.blocks, strict=True)]


def turn_cpu_gaps(loop: Timing, alone: Timing) -> list[float]:
    """Turn by turn, the main thread's CPU seconds per step of the loop less the step alone's: the loop's
    own work per step, without the waits (the machine's other processes, the loader, other threads)."""
    if not (len(loop.blocks) == len(alone.blocks) == len(loop.block_cpu) == len(alone.block_cpu)):
        return []
    return [
        a / n - b / m
        for a, (_, n), b, (_, m) in zip(loop.block_cpu, loop.blocks, alone.block_cpu, alone.blocks, strict=True)
    ]


@dataclass
class Alone:
    """The isolated step on pre-built batches, run ``n`` steps at a time; what it did so far."""

    step: Callable[[Batch], torch.Tensor]
    data: list[Batch]
    device: torch.device
    tokens_per_batch: list[float] = field(default_factory=list)
    timing: Timing = field(default_factory=Timing)
    _next: int = 0

    def __post_init__(self) -> None:
        self.tokens_per_batch = [float(b["attention_mask"].sum()) for b in self.data]

    def warm_up(self, n: int) -> None:
        """``n`` untimed steps on the first batches; the timed ones then start at batch ``n + 1``,
        the batch of the loop's first timed step (its steady state starts after step ``n + 1``)."""
        for i in range(n):
            loss = self.step(self.data[i % len(self.data)])
        if n:
            float(loss)  # wait for the warm-up
        self._next = n + 1

    def run(self, n: int) -> None:
        """``n`` timed steps, from a synced device to the last step's loss read back."""
        if n <= 0:
            return
        _sync(self.device)
        start, cpu, tokens = time.perf_counter(), time.thread_time(), 0.0
        for _ in range(n):
            i = self._next % len(self.data)
            loss = self.step(self.data[i])
            tokens += self.tokens_per_batch[i]
            self._next += 1
        float(loss)  # reading the loss waits for the last step
        self.timing.blocks.append((time.perf_counter() - start, n))
        self.timing.block_cpu.append(time.thread_time() - cpu)
        self.timing.tokens += tokens
        self.timing.block_tokens.append(tokens)


class StepClock(pl.Callback):
    """Wall-clock stamps of every training batch end; the loop's steady state (steps
    ``warmup + 1`` to ``warmup + steps - 1``) timed in blocks of ``block`` steps between device
    syncs, with its real tokens counted on the device; after each block but the last, a block of
    as many steps of ``alone`` (when given), whose time the run's phases leave out. It times the
    run's first fit (given as a run context callback, it is in every phase's): later fits are left alone."""

    def __init__(
        self, warmup: int, steps: int, device: torch.device, block: int | None = None, alone: Alone | None = None
    ) -> None:
        if steps < 2:
            raise ValueError("the steady state needs at least 2 steps")
        last = warmup + steps - 1
        self.boundaries = sorted({*range(warmup, last, block or steps), last})
        self.warmup, self.last, self.device, self.alone = warmup, last, device, alone
        self.ends: list[float] = []
        self.fit_start = 0.0
        self.validation_s = 0.0
        self.timing = Timing()  # the loop's steady state
        self.in_run_alone_s = 0.0  # the step alone's blocks, inside the run
        self._tokens: torch.Tensor | None = None
        self._counted = 0.0  # real tokens of the blocks timed so far
        self._block_start = 0.0
        self._block_cpu = 0.0  # the main thread's CPU clock at the block's start
        self._previous = warmup
        self._val_start = 0.0
        self._fits = 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fits += 1
        if self._fits == 1:
            self.fit_start = time.perf_counter()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: Mapping[str, torch.Tensor],
        batch_idx: int,
    ) -> None:
        if self._fits != 1:
            return
        step = len(self.ends)
        if self.warmup < step <= self.last:
            count = batch["attention_mask"].sum()
            self._tokens = count if self._tokens is None else self._tokens + count
        if step not in self.boundaries:
            self.ends.append(time.perf_counter())
            return
        _sync(self.device)
        now, cpu = time.perf_counter(), time.thread_time()
        self.ends.append(now)
        if step > self.warmup:
            self.timing.blocks.append((now - self._block_start, step - self._previous))
            self.timing.block_cpu.append(cpu - self._block_cpu)
            counted = float(self._tokens) if self._tokens is not None else 0.0  # read after the sync above
            self.timing.block_tokens.append(counted - self._counted)
            self._counted = counted
        self._previous = step
        if step < self.last and self.alone is not None:
            following = self.boundaries[self.boundaries.index(step) + 1] - step
            self.alone.run(following)
            self._block_start, self._block_cpu = time.perf_counter(), time.thread_time()
            self.in_run_alone_s += self._block_start - now
        else:
            self._block_start, self._block_cpu = now, cpu

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._fits != 1:
            return
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._fits != 1:
            return
        self.validation_s += time.perf_counter() - self._val_start

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._fits == 1 and self._tokens is not None:
            self.timing.tokens = float(self._tokens)
