"""A run is a list of phases, then finishers, executed by one runner for every regime: :class:`Phase` (one
Lightning fit), :class:`Finisher`, :class:`RunPlan` (what ``ablate train print-plan`` prints), :func:`execute`
(the phases on one step counter, each resuming where an earlier attempt stopped, then the finishers) and
:func:`weights_finisher`. How a run is executed: docs/development.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import nn

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.sweeps.engine.context import ActiveRun, RunContext
from ablate.sweeps.engine.phase_store import PhaseStore
from ablate.sweeps.engine.trainer import ValidateAtEnd, build_trainer, fit, run_logger
from ablate.sweeps.engine.weights import log_weights


class Leaves(Protocol):
    """Materials whose run leaves a model: the weights finisher logs what ``leaving`` returns."""

    def leaving(self) -> tuple[nn.Module, ExperimentConfig, Path | None]:
        """The model as the phases left it, the config that builds it, the tokenizer (None: the run's own)."""
        ...


M = TypeVar("M")
"""A regime's materials: what its phases and finishers work on."""

Metrics = dict[str, float]


def at_end() -> list[Callback]:
    """A phase's own callbacks by default: validate after its last step."""
    return [ValidateAtEnd()]


@dataclass(frozen=True)
class Phase(Generic[M]):
    """One fit of a run.

    Attributes:
        name: said as the run's phase (``ablate.phase``) and printed by ``--print-plan``.
        steps: its optimizer steps (at most: early stopping may end it sooner).
        module: how its module is prepared from the materials (``how`` says which kind).
        how: ``new module`` or ``same module, new stages``: what ``--print-plan`` shows.
        detail: what the status line adds (task, method, bits).
        callbacks: its own callbacks (the run context's come beside them).
        val_every: validate every so many steps (None: ``trainer.val_every``).
        val_batches: validation batches (None: ``trainer.val_batches``; 1.0: the whole dev set).
        monitor: the metric ``best.ckpt`` keeps the lowest of (None: none kept).
        optim: its optimizer plan, as ``--print-plan`` shows it (the module's own, from the same function).
        ended: what the phase hands on once its fit has ended (or been restored); the metrics it returns
            are logged at the phase's last step (once: not again when a retry restores the phase).
    """

    name: str
    steps: int
    module: Callable[[M], pl.LightningModule]
    how: str = "new module"
    detail: str = ""
    callbacks: Callable[[], list[Callback]] = at_end
    val_every: int | None = None
    val_batches: int | float | None = None
    monitor: str | None = "val/loss"
    optim: str = ""
    ended: Callable[[M, pl.LightningModule, Metrics], Metrics] | None = None


@dataclass(frozen=True)
class Finisher(Generic[M]):
    """What runs after the phases: ``work(materials, run, step, metrics)`` returns metrics to add."""

    name: str
    detail: str
    work: Callable[[M, ActiveRun, int, Metrics], Metrics]


@dataclass(frozen=True)
class RunPlan(Generic[M]):
    """A run's phases and finishers, as its config makes them."""

    phases: Sequence[Phase[M]]
    finishers: Sequence[Finisher[M]] = field(default_factory=tuple)

    def describe(self) -> str:
        """The plan as ``ablate train --print-plan`` prints it: a numbered line per phase, then the finishers."""
        lines = ["phases:"] if self.phases else ["phases: none (the run evaluates what it is given)"]
        for i, p in enumerate(self.phases):
            detail = "".join(f"; {text}" for text in (p.detail, p.optim) if text)
            lines.append(f"  {i + 1}. {p.name}: {p.steps} steps, {p.how}{detail}")
        lines.append("finishers:" if self.finishers else "finishers: none")
        lines.extend(f"  - {f.name}: {f.detail}" for f in self.finishers)
        return "\n".join(lines)


def _log_weights(m: Leaves, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    model, cfg, tokenizer = m.leaving()
    log_weights(run.client, run.run_id, model, cfg, tokenizer=tokenizer)
    return {}


def weights_finisher() -> Finisher[Any]:
    """Every run's last finisher, the one rule for where weights are logged: the model as the phases
    left it (after a QAT phase, its trained float weights; quantization is redone from them and the
    config), its config and tokenizer, as the run's ``model/`` artifacts (what ``ablate export`` reads,
    what a later run starts from or learns from)."""
    return Finisher(
        "weights", "the model as the phases left it, its config and tokenizer as model/ artifacts", _log_weights
    )


def execute(
    plan: RunPlan[M],
    materials: M,
    cfg: ExperimentConfig,
    data: pl.LightningDataModule,
    run: ActiveRun,
    ctx: RunContext,
) -> Metrics:
    """Run ``plan`` inside ``run``: its phases in turn on one step counter, with the run context's
    callbacks, clocks and checkpoints in each (resuming from what an earlier attempt left), then its
    finishers, each timed as ``finisher:<name>`` (the context's ``timed`` hook); the run's final metrics."""
    logger = run_logger(run.uri, run.run_id, synchronous=False)
    store = PhaseStore.of(ctx, run)
    done, partial = store.resume_point(len(plan.phases))
    step, metrics = 0, Metrics()
    for index, phase in enumerate(plan.phases):
        module = phase.module(materials)
        if index < done:  # ended in an earlier attempt: its state, not its training
            ended_at, got = store.restore(index, module)
        else:
            start = partial if index == done else None
            logger.offset = step
            ended_at, got = _fit_phase(cfg, phase, index, module, data, run, ctx, store, logger, start)
        metrics.update(got)
        if phase.ended is not None:  # what it hands on; what it returns is logged where it ended, once
            handed = phase.ended(materials, module, metrics)
            if handed and index >= done:
                run.log(handed, step=step + ended_at)
            metrics.update(handed)
        step += ended_at
    for finisher in plan.finishers:
        with ctx.timing(f"finisher:{finisher.name}"):
            metrics.update(finisher.work(materials, run, step, metrics))
    return metrics


def _fit_phase(
    cfg: ExperimentConfig,
    phase: Phase[Any],
    index: int,
    module: pl.LightningModule,
    data: pl.LightningDataModule,
    run: ActiveRun,
    ctx: RunContext,
    store: PhaseStore,
    logger: Any,
    start: str | None,
) -> tuple[int, Metrics]:
    """Fit phase ``index`` (from ``start``, a ``last.ckpt`` of it, when given); the steps it ended at
    and its final metrics, kept as its ``phase-<index>.ckpt``."""
    saving = store.callbacks(index, phase.monitor, start)
    callbacks = [*phase.callbacks(), *ctx.callbacks, *ctx.clocks, *saving]
    trainer = build_trainer(
        cfg,
        logger,
        callbacks,
        max_steps=phase.steps,
        val_every=phase.val_every,
        val_batches=phase.val_batches,
        checkpointing=bool(saving),
    )
    resumed = f", from {start}" if start else ""
    run.phase(phase.name, f"{phase.detail}{', ' if phase.detail else ''}{phase.steps} steps{resumed}")
    got = fit(trainer, module, data, ckpt_path=start)
    if start and phase.monitor is not None and phase.monitor not in got:
        # resumed from the checkpoint of a phase that had trained to its end: nothing trained, nothing
        # validated; the run still logs the phase's final validation, as the first attempt did
        (scores,) = trainer.validate(module, datamodule=data, verbose=False)
        run.log({k: float(v) for k, v in scores.items()}, step=logger.offset + trainer.global_step)
        got.update({k: float(v) for k, v in scores.items()})
    for callback in ctx.callbacks:  # under DDP a rank's prune reaches this process through the trial
        check_pruned = getattr(callback, "check_pruned", None)  # optuna-integration's documented call
        if check_pruned is not None:
            check_pruned()
    ended_at = trainer.global_step or phase.steps  # forked DDP ranks do not send their step back
    store.finish(index, trainer, ended_at, got)
    return ended_at, got
