"""The one Lightning Trainer factory and fit of every regime (pre-training, distillation, pruning phases,
fine-tuning): settings from the config, DDP ranks forked at ``fit``, Ctrl-C and a rank's error turned into
what the caller expects; and every loop's callbacks (:func:`loop_callbacks`: the NaN guard and a progress bar,
neither of which reads the device each step)."""

from __future__ import annotations

import builtins
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, TQDMProgressBar
from lightning.pytorch.loggers import Logger, MLFlowLogger
from lightning.pytorch.profilers import AdvancedProfiler, Profiler, PyTorchProfiler, SimpleProfiler
from lightning.pytorch.strategies import DDPStrategy, Strategy
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.types import STEP_OUTPUT
from mlflow import MlflowClient
from mlflow.entities import Metric
from mlflow.utils.validation import MAX_METRICS_PER_BATCH
from torch.multiprocessing.spawn import ProcessRaisedException

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.run import TrainerConfig
from ablate.sweeps.engine import forksafe, tracking
from ablate.sweeps.engine.ckpt_files import FileWriter
from ablate.sweeps.engine.grouped import grouped

SEND_EVERY = 5.0
"""Seconds between two sends of what a fit logs: the metrics of every log step in between go to MLflow
as one batch. Writing a batch takes the training process's interpreter lock for milliseconds whatever
its size, which a send at every log step took from the loop (docs/performance.md, "Log steps")."""


class RunLogger(MLFlowLogger):
    """Lightning's MLflow logger for a run ablate owns: it logs, and never ends the run.

    Lightning's logger marks its run FINISHED (or FAILED) when a fit ends; a run of ablate has more
    to do after a fit (validation of the quantized model, the exit curve, another phase, its
    weights), and only its owner (:func:`ablate.sweeps.engine.context.tracked_run`) ends it, once all of
    that is done. Metrics are held, each with the time it was logged, and sent every
    :data:`SEND_EVERY` seconds, before each checkpoint and when a fit ends (:meth:`flush`); a log step's
    values on the device (:meth:`log_tensor`) are read then, all in one read.
    ``offset`` moves the steps of a later fit of the same run on (a pruning run's phases).
    """

    offset = 0
    logged: Mapping[str, int] = {}
    """Each metric's last step in the run's history before this attempt (a reopened run's): a resumed fit
    does not log those steps again (the steps between its checkpoint and the stop), one point per step."""

    def __init__(self, uri: str, run_id: str, *, synchronous: bool) -> None:
        super().__init__(tracking_uri=uri, run_id=run_id, log_model=False, synchronous=synchronous)
        self.held: list[Metric] = []
        self.unread: list[tuple[Sequence[str], torch.Tensor, int, int]] = []  # names, values, step, time (ms)
        self.sent_at = time.monotonic()

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        at = (step or 0) + self.offset
        now = int(time.time() * 1000)
        self.held += [Metric(k, float(v), now, at) for k, v in metrics.items() if at > self.logged.get(k, -1)]
        self._send_when_due()

    @rank_zero_only
    def log_tensor(self, names: Sequence[str], values: torch.Tensor, step: int) -> None:
        """``values`` (one per name, on the device) at ``step``, read when they are sent."""
        self.unread.append((names, values, step + self.offset, int(time.time() * 1000)))
        self._send_when_due()

    def _send_when_due(self) -> None:
        if (self.held or self.unread) and time.monotonic() - self.sent_at >= SEND_EVERY:
            self.send()

    def _read(self) -> list[Metric]:
        """The unread values, read from their device at once, less the steps an earlier attempt logged."""
        unread, self.unread = self.unread, []
        if not unread:
            return []
        values = torch.cat([v.to(unread[0][1].device) for _, v, _, _ in unread]).tolist()
        read = iter(values)
        return [
            Metric(name, value, now, at)
            for names, _, at, now in unread
            for name, value in zip(names, read, strict=False)
            if at > self.logged.get(name, -1)
        ]

    def send(self) -> None:
        """Hand the held metrics to MLflow (in batches of MLflow's largest size)."""
        held, self.held, self.sent_at = [*self.held, *self._read()], [], time.monotonic()
        size = MAX_METRICS_PER_BATCH
        for i in range(0, len(held), size):
            self.experiment.log_batch(self.run_id, metrics=held[i : i + size], **self._log_batch_kwargs)

    def finalize(self, status: str = "success") -> None:
        self.flush()  # sent, not ended

    def flush(self) -> None:
        """Send what is held and queued (a checkpoint is written only once what was logged before it is stored)."""
        if self.held or self.unread:
            self.send()
        if self._initialized:
            self.experiment._tracking_client.store.flush_async_logging()


def run_logger(uri: str, run_id: str, *, synchronous: bool = True, going_on: bool = False) -> RunLogger:
    """The logger of run ``run_id`` in store ``uri`` (``synchronous`` False: metrics are sent in the
    background during the fit, flushed when it ends; ``going_on``: the run has a history of an earlier
    attempt, whose steps are not logged again)."""
    logger = RunLogger(uri, run_id, synchronous=synchronous)
    if going_on:
        client = MlflowClient(uri)
        keys = client.get_run(run_id).data.metrics
        logger.logged = {k: max((m.step for m in client.get_metric_history(run_id, k)), default=-1) for k in keys}
    return logger


class ValidateAtEnd(Callback):
    """Validate after the last step when ``max_steps`` is not a multiple of ``val_every``."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        val_every = int(trainer.val_check_batch or 1) // trainer.accumulate_grad_batches  # batches -> optimizer steps
        if trainer.global_step % val_every and not trainer.interrupted:
            trainer.validate_loop.verbose = False  # no results table: the progress bar shows them
            trainer.validate_loop.run()


def lightning_strategy(t: TrainerConfig) -> str | Strategy:
    """The Lightning strategy for ``trainer.strategy`` and ``trainer.devices``.

    Lightning's own ``ddp`` starts the other ranks by running the command line again, which
    here would start a second MLflow run (or a second sweep worker). ablate's ``ddp`` (and
    ``auto`` on several devices) instead forks the ranks at ``fit`` (spawns them once CUDA
    is initialised, which cannot be forked): only training runs in the ranks, and the run,
    the trial and the metrics stay in the one process that started them.
    """
    if t.devices == 1 or t.strategy not in ("auto", "ddp"):
        return t.strategy
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return DDPStrategy(start_method="spawn")
    forksafe.install()  # the ranks inherit this process's database pools (the ablate command did it already)
    return DDPStrategy(start_method="fork")


PROFILERS: dict[str, type[Profiler]] = {
    "simple": SimpleProfiler,
    "advanced": AdvancedProfiler,
    "pytorch": PyTorchProfiler,
}


def lightning_profiler(t: TrainerConfig) -> Profiler | None:
    """The profiler ``trainer.profiler`` names, writing its reports into a new temporary folder
    (its ``dirpath``), which :func:`fit` logs as the run's ``profiler/`` artifacts and removes."""
    if t.profiler is None:
        return None
    return PROFILERS[t.profiler](dirpath=tempfile.mkdtemp(prefix="ablate-profile-"), filename="profile")


def rank_error(exc: ProcessRaisedException) -> Exception:
    """The error a DDP rank raised, rebuilt in this process from the traceback torch passes on:
    its own type when it is a builtin one (the NaN guard's ``FloatingPointError``), else a
    RuntimeError carrying its last line."""
    last = str(exc).strip().splitlines()[-1]
    name, _, message = last.partition(": ")
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(message)
    return RuntimeError(f"a DDP rank failed: {last}")


def build_trainer(
    cfg: ExperimentConfig,
    logger: Logger | None,
    callbacks: list[Callback],
    *,
    max_steps: int | None = None,
    val_every: int | None = None,
    val_batches: int | float | None = None,
    writer: FileWriter | None = None,
) -> pl.Trainer:
    """A Lightning Trainer from ``cfg.trainer`` and ``cfg.optim.grad_clip``.

    ``max_steps``, ``val_every`` and ``val_batches`` default to the trainer section's (a
    fine-tuning run passes its own; ``1.0`` validates on the whole dev set). Validation runs
    every ``val_every`` steps across epoch ends. Checkpoints are written only when
    ``callbacks`` bring a ModelCheckpoint, by ``writer`` (the run's, :class:`FileWriter`).

    Steps are optimizer steps: with ``accumulate_grad_batches`` = k, Lightning's ``max_steps``,
    ``global_step``, ``log_every_n_steps`` and the step-wise LR schedule count them, but its
    ``val_check_interval`` counts batches, so it is given ``val_every`` x k.
    """
    t = cfg.trainer
    max_steps = max_steps or t.max_steps
    extra: list[Callback] = [LearningRateMonitor(logging_interval="step")] if logger else []
    every = [*extra, *loop_callbacks(t), *callbacks]
    return pl.Trainer(
        max_steps=max_steps,
        val_check_interval=min(val_every or t.val_every, max_steps) * t.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches if val_batches is None else val_batches,
        num_sanity_val_steps=0,
        gradient_clip_val=cfg.optim.grad_clip or None,
        precision=t.precision,
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=lightning_strategy(t),
        accumulate_grad_batches=t.accumulate_grad_batches,
        profiler=lightning_profiler(t),
        logger=logger or False,
        callbacks=grouped(every) if t.profiler is None else every,  # a profiler times each apart
        enable_checkpointing=writer is not None,
        plugins=[writer or FileWriter()],
        enable_progress_bar=t.progress,
        enable_model_summary=False,
        log_every_n_steps=t.log_every,
        deterministic=t.deterministic,
    )


def fit(
    trainer: pl.Trainer, module: pl.LightningModule, data: pl.LightningDataModule, ckpt_path: str | None = None
) -> dict[str, float]:
    """``trainer.fit`` with MLflow's tracking URI scoped to the run; the final callback metrics.
    A profiler's reports are logged with the run (``profiler/``).

    Raises:
        KeyboardInterrupt: the fit was interrupted (Ctrl-C).
        Exception: a forked DDP rank's own error, rebuilt here (:func:`rank_error`).
    """
    profile = getattr(getattr(trainer, "profiler", None), "dirpath", None)  # set by lightning_profiler
    try:
        with tracking.scoped_tracking_uri():
            try:
                trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
            except ProcessRaisedException as exc:  # a forked DDP rank failed: its own error, not the wrapper
                raise rank_error(exc) from None
        if profile is not None and isinstance(trainer.logger, MLFlowLogger) and trainer.logger.run_id:
            tracking.log_profile(trainer.logger.experiment, trainer.logger.run_id, Path(profile))
    finally:
        if profile is not None:
            shutil.rmtree(profile, ignore_errors=True)
    if trainer.interrupted:
        raise KeyboardInterrupt
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@dataclass
class _Asked:
    """A check's question: the steps and losses kept, and whether each is finite, on its way to the host."""

    steps: list[int]
    losses: list[torch.Tensor]
    finite: torch.Tensor
    ready: torch.cuda.Event | None  # recorded after the copy on a CUDA device


class FiniteLoss(Callback):
    """Fail the run when the training loss is NaN or infinite.

    The module names its loss with a ``loss_name`` attribute (default ``training loss``) and
    may say more with a ``describe_step(step) -> str`` method (a distillation's stage; "" = nothing).
    Every ``every`` steps a check asks whether the losses kept since the check before were finite (the
    flags copied to the host without waiting for the device) and reads what the check before asked: the
    loop never waits for the device here, and a bad step is found at most ``2 x every`` steps later; before
    a validation and at the fit's end both are read.

    Args:
        every: steps between two checks (``trainer.log_every``).
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self._step = 0
        self._kept: list[tuple[int, torch.Tensor]] = []  # (step, its loss) since the last check, on the device
        self._asked: _Asked | None = None

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
            self.check(pl_module, wait=False)

    def update(self, loss: torch.Tensor, step: int) -> None:
        """Keep one step's loss (a copy on the device: a CUDA graph's next replay overwrites its output)."""
        self._kept.append((step, loss.detach().clone()))

    def check(self, pl_module: pl.LightningModule | None = None, wait: bool = True) -> None:
        """Ask about the losses kept since the last check and answer what the check before asked; ``wait``:
        answer this one too (one host read). Raises ``FloatingPointError`` naming the first step whose loss
        was not finite."""
        earlier, self._asked = self._asked, self._ask()
        self._answer(earlier, pl_module)
        if wait:
            now, self._asked = self._asked, None
            self._answer(now, pl_module)

    def _ask(self) -> _Asked | None:
        if not self._kept:
            return None
        kept, self._kept = self._kept, []
        losses = [loss for _, loss in kept]
        finite = torch.isfinite(torch.stack([loss.float() for loss in losses]))
        ready = None
        if finite.device.type == "cuda":  # into page-locked memory, without waiting; the event says when it is there
            finite, ready = finite.to("cpu", non_blocking=True), torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record()
        return _Asked([step for step, _ in kept], losses, finite, ready)

    def _answer(self, asked: _Asked | None, pl_module: pl.LightningModule | None) -> None:
        if asked is None:
            return
        if asked.ready is not None:
            asked.ready.synchronize()
        finite = asked.finite.tolist()
        if all(finite):
            return
        i = finite.index(False)
        describe = getattr(pl_module, "describe_step", None)
        text = describe(asked.steps[i]) if describe is not None else ""
        detail = f" ({text})" if text else ""
        what = getattr(pl_module, "loss_name", "training loss")
        raise FloatingPointError(f"{what} became {float(asked.losses[i])} at step {asked.steps[i]}{detail}")

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
