"""``ablate bench loop``: does the whole training loop run at the speed of its own step?

Two measurements of one configuration, in one process:

- the loop: a real ``ablate train`` (:func:`sweeps.runner.train`: the Lightning loop, the
  streamed corpus through ``PretrainDataModule`` and its DataLoader workers, MLflow logging
  into a temporary store, the NaN guard, the progress bar, validation at the end). A callback
  stamps the wall clock at the end of every training batch; the steady state is the steps
  after a warm-up (compilation, the loader's start), bounded by two device syncs.
- the step: the same model and settings (:func:`benchmarks.train_speed.ablate_side`) on
  batches from the same pipeline already on the device, the same number of steps, one sync at
  the end.

Both count real (non-padding) tokens. The last line printed is ``loop efficiency: X.XX``,
loop tokens/s over step tokens/s. The wall time of the run is split into start-up (until the
first step ends: data and tokenizer, model, measurement, MLflow, compilation), training,
validation and teardown (final validation aside: probes, logging the weights, closing).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import lightning.pytorch as pl
import torch
from rich.progress import Progress

from benchmarks import mark
from benchmarks.cases import CASES, Case
from benchmarks.train_speed import ablate_side, batches
from lightning_modules.config import DataConfig, ExperimentConfig, ObjectiveConfig, TrackingConfig, TrainerConfig
from lightning_modules.heads import build_pretraining_model

TARGET = 0.90
WARMUP = {"cpu": 5, "cuda": 30}  # steps before the steady state: compilation and CUDA graph recording, workers starting
STEPS = {"cpu": 40, "cuda": 300}


class StepClock(pl.Callback):
    """Wall-clock stamps of every training batch end, validation time, and the tokens counted
    on the device between two synchronised stamps (``start`` and ``stop`` steps)."""

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop
        self.ends: list[float] = []
        self.validation_s = 0.0
        self.tokens: torch.Tensor | None = None
        self.window: tuple[float, float] = (0.0, 0.0)
        self._val_start = 0.0

    def _sync(self, pl_module: pl.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = len(self.ends)
        if self.start < step <= self.stop:
            count = batch["attention_mask"].sum()
            self.tokens = count if self.tokens is None else self.tokens + count
        if step in (self.start, self.stop):
            self._sync(pl_module)
        self.ends.append(time.perf_counter())

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.validation_s += time.perf_counter() - self._val_start

    @property
    def tokens_per_s(self) -> float:
        assert self.tokens is not None
        return float(self.tokens) / (self.ends[self.stop] - self.ends[self.start])


def run_config(case: Case, corpus: str, device: torch.device, steps: int, root: str) -> ExperimentConfig:
    """The ``ablate train`` config of ``case``: bf16, compiled with CUDA graphs on a GPU; fp32 eager
    on a CPU (its fastest setting there, as ``ablate bench train`` shows)."""
    cuda = device.type == "cuda"
    return ExperimentConfig(
        name=f"bench-loop-{case.name}", model=case.model,
        objective=ObjectiveConfig(sentence=case.sentence, mask_prob=case.mask_prob),
        data=DataConfig(corpus=corpus, max_length=case.seq_len, batch_size=case.batch, tokenizer_docs=5000),
        trainer=TrainerConfig(max_steps=steps, val_every=steps, val_batches=5, accelerator=device.type,
                              precision="bf16-mixed" if cuda else "32-true", compile=cuda,
                              compile_mode="reduce-overhead" if cuda else "default"),
        tracking=TrackingConfig(root=root, experiment="bench-loop"))


def isolated_step(case: Case, cfg: ExperimentConfig, corpus: str, device: torch.device, warmup: int,
                  steps: int) -> float:
    """Tokens/s of the step alone: ``steps`` steps after ``warmup``, on batches already on the device."""
    init = build_pretraining_model(cfg.model, cfg.objective).state_dict()
    precision = "bf16" if cfg.trainer.precision.startswith("bf16") else "fp32"
    side = ablate_side(case, init, precision, cfg.trainer.compile, device, warmup + steps, cfg.trainer.compile_mode)
    data = batches(case, corpus, min(steps, 50), device)
    for i in range(warmup):
        side.step(data[i % len(data)])
    float(side.step(data[0]))  # wait for the warm-up
    tokens = sum(float(data[i % len(data)]["attention_mask"].sum()) for i in range(steps))
    start = time.perf_counter()
    for i in range(steps):
        loss = side.step(data[i % len(data)])
    float(loss)
    return tokens / (time.perf_counter() - start)


def main(args: argparse.Namespace, device: torch.device, progress: Progress) -> tuple[list[str], bool]:
    from sweeps.runner import train

    name = (args.case or ["bert-small" if device.type == "cuda" else "albert-tiny"])[0]
    case = CASES[name]()
    warmup, steps = WARMUP[device.type], args.steps or STEPS[device.type]
    task = progress.add_task(f"{name}: ablate train, {warmup + steps} steps", total=None)
    with tempfile.TemporaryDirectory(prefix="ablate-bench-loop-") as root:
        cfg = run_config(case, args.corpus, device, warmup + steps, root)
        clock = StepClock(start=warmup, stop=warmup + steps - 1)
        begin = time.perf_counter()
        train(cfg, callbacks=[clock])
        end = time.perf_counter()
    progress.update(task, description=f"{name}: the step alone")
    step_rate = isolated_step(case, cfg, args.corpus, device, warmup, steps)
    progress.remove_task(task)
    loop_rate = clock.tokens_per_s
    efficiency = loop_rate / step_rate
    startup = clock.ends[0] - begin
    training = clock.ends[-1] - clock.ends[0]  # the one validation runs after the last step
    teardown = end - clock.ends[-1] - clock.validation_s
    t = cfg.trainer
    lines = [f"### {name}: ablate train ({t.precision}{', compiled ' + t.compile_mode if t.compile else ''}, "
             f"data.num_workers {cfg.data.workers()}, T={case.seq_len} B={case.batch}, {args.corpus}) against "
             f"its isolated step; steady state = steps {warmup + 1} to {warmup + steps - 1}", "",
             "| | tokens/s |", "|---|---:|",
             f"| the loop (ablate train) | {loop_rate:,.0f} |", f"| the step alone | {step_rate:,.0f} |", "",
             "| wall time of the run | s |", "|---|---:|",
             f"| start-up (data, tokenizer, model, measurement, MLflow, compilation, first step) | {startup:.1f} |",
             f"| training ({len(clock.ends)} steps) | {training:.1f} |",
             f"| validation | {clock.validation_s:.1f} |",
             f"| teardown (logging the weights, closing the run) | {teardown:.1f} |",
             f"| total | {end - begin:.1f} |", "",
             f"- target: loop efficiency >= {TARGET} ({mark(efficiency >= TARGET)})", "",
             f"loop efficiency: {efficiency:.2f}"]
    return lines, efficiency >= TARGET
