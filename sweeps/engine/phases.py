"""A run is a list of phases, then finishers, executed by one runner for every regime: :class:`Phase` (one
Lightning fit), :class:`Finisher`, :class:`RunPlan` (what ``ablate train print-plan`` prints), :func:`execute`
(the phases on one step counter, then the finishers), :class:`PhaseStore` (each phase's checkpoints, what a
retry resumes from) and :func:`weights_finisher`. How a run is executed: docs/development.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Generic, Protocol, TypeVar

import lightning.pytorch as pl
from lightning.fabric.utilities.cloud_io import _load as load_checkpoint
from lightning.pytorch.callbacks import Callback
from torch import nn

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.sweeps.engine import checkpoints, tracking
from ablate.sweeps.engine.ckpt_files import FileWriter
from ablate.sweeps.engine.context import ActiveRun, Prepared, RunContext, say
from ablate.sweeps.engine.trainer import RunLogger, ValidateAtEnd, build_trainer, run_logger
from ablate.sweeps.engine.trainer import fit as _fit
from ablate.sweeps.engine.weights import log_weights

M = TypeVar("M")
"""A regime's materials: what its preparation loaded (module, data, source), the same for the whole run."""
H = TypeVar("H")
"""What a regime's phases hand on: a frozen value each phase may replace (``ended``), read by the next
phase and by the finishers as an argument."""

Metrics = dict[str, float]
Leaving = tuple[nn.Module, ExperimentConfig, Path | None]
"""The model a run leaves, the config that builds it and its tokenizer (None: the run's own)."""


H_in = TypeVar("H_in", contravariant=True)


class Leaves(Protocol[H_in]):
    """Materials whose run leaves a model: the weights finisher logs what ``leaving`` returns."""

    def leaving(self, handed: H_in, /) -> Leaving:
        """The model as the phases left it (``handed``: what the last of them handed on)."""
        ...


def at_end() -> list[Callback]:
    """A phase's own callbacks by default: validate after its last step."""
    return [ValidateAtEnd()]


@dataclass(frozen=True)
class Phase(Generic[M, H]):
    """One fit of a run.

    Attributes:
        name: said as the run's phase (``ablate.phase``) and printed by ``--print-plan``.
        steps: its optimizer steps (at most: early stopping may end it sooner).
        module: its module, made in the run from the materials and what the phases before handed on
            (which it may add to: a QAT phase's plan); ``how`` says which kind.
        how: ``new module`` or ``same module, new stages``: what ``--print-plan`` shows.
        detail: what the status line adds (task, method, bits).
        callbacks: its own callbacks (the run context's come beside them).
        val_every: validate every so many steps (None: ``trainer.val_every``).
        within_epoch: ``val_every`` at most the steps of one pass over the training set (a task's).
        val_batches: validation batches (None: ``trainer.val_batches``; 1.0: the whole dev set).
        monitor: the metric ``best.ckpt`` keeps the lowest of (None: none kept).
        optim: its optimizer plan, as ``--print-plan`` shows it (the module's own, from the same function).
        ended: what the phase hands on once its fit has ended (or been restored), and metrics logged at the
            phase's last step (once: not again when a retry restores the phase).
    """

    name: str
    steps: int
    module: Callable[[M, H, ActiveRun], tuple[pl.LightningModule, H]]
    how: str = "new module"
    detail: str = ""
    callbacks: Callable[[], list[Callback]] = at_end
    val_every: int | None = None
    within_epoch: bool = False
    val_batches: int | float | None = None
    monitor: str | None = "val/loss"
    optim: str = ""
    ended: Callable[[M, H, pl.LightningModule, Metrics], tuple[H, Metrics]] | None = None


@dataclass(frozen=True)
class Finisher(Generic[M, H]):
    """What runs after the phases: ``work(materials, handed, run, step, metrics)`` returns metrics to add."""

    name: str
    detail: str
    work: Callable[[M, H, ActiveRun, int, Metrics], Metrics]


@dataclass(frozen=True)
class RunPlan(Generic[M, H]):
    """A run's phases and finishers, as its config makes them."""

    phases: Sequence[Phase[M, H]]
    finishers: Sequence[Finisher[M, H]] = field(default_factory=tuple)

    def then(self, finisher: Finisher[M, H]) -> RunPlan[M, H]:
        """This plan with ``finisher`` last."""
        return RunPlan(self.phases, (*self.finishers, finisher))

    def describe(self) -> str:
        """The plan as ``ablate train --print-plan`` prints it: a numbered line per phase, then the finishers."""
        lines = ["phases:"] if self.phases else ["phases: none (the run evaluates what it is given)"]
        for i, p in enumerate(self.phases):
            detail = "".join(f"; {text}" for text in (p.detail, p.optim) if text)
            lines.append(f"  {i + 1}. {p.name}: {p.steps} steps, {p.how}{detail}")
        lines.append("finishers:" if self.finishers else "finishers: none")
        lines.extend(f"  - {f.name}: {f.detail}" for f in self.finishers)
        return "\n".join(lines)


def _log_weights(m: Leaves[H], handed: H, run: ActiveRun, step: int, metrics: Metrics) -> Metrics:
    model, cfg, tokenizer = m.leaving(handed)
    log_weights(run.client, run.run_id, model, cfg, tokenizer=tokenizer)
    return {}


def weights_finisher() -> Finisher[Leaves[H], H]:
    """Every run's last finisher (the runner's), the one rule for where weights are logged: the model as
    the phases left it (after a QAT phase, its trained float weights; quantization is redone from them
    and the config), its config and tokenizer, as the run's ``model/`` artifacts (what ``ablate export``
    reads, what a later run starts from or learns from)."""
    return Finisher(
        "weights", "the model as the phases left it, its config and tokenizer as model/ artifacts", _log_weights
    )


PHASE = "ablate_phase"  # in a checkpoint: the index of the phase that wrote it
ENDED = "ablate_phase_end"  # in a phase's end checkpoint: (steps it ended at, its fit's final metrics)


def ended_name(index: int) -> str:
    """The file phase ``index`` leaves when it ends."""
    return f"phase-{index}.ckpt"


class PhaseMark(Callback):
    """Tag every checkpoint of a phase with its index (and its end's with its steps and metrics), and send
    the run's queued metrics first: a process killed after the checkpoint has logged what led to it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.ended: tuple[int, dict[str, float]] | None = None

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[PHASE] = self.index
        if isinstance(trainer.logger, RunLogger):  # what was logged before the checkpoint is in the store
            trainer.logger.flush()
        if self.ended is not None:  # an ended phase is restored, never trained on: its optimizer state is left out
            checkpoint[ENDED] = {"step": self.ended[0], "metrics": self.ended[1]}
            for training_only in ("optimizer_states", "lr_schedulers"):
                checkpoint.pop(training_only, None)


@dataclass
class PhaseStore:
    """One run's phase checkpoints.

    Attributes:
        run: the run they belong to.
        plan: where its checkpoints are written (None: none kept).
        resume: the context's ``resume``: True (what an earlier attempt at the config left), a
            ``last.ckpt`` (``ablate train --resume``: its folder holds the ended phases), or False.
        writer: what writes them (and uploads them), in the background, for all the run's fits: the
            run waits for it before it ends (:meth:`close`).
    """

    run: ActiveRun
    plan: checkpoints.CheckpointPlace | None
    resume: str | bool
    mark: PhaseMark | None = None
    writer: FileWriter = field(default_factory=lambda: FileWriter(held=True))

    @classmethod
    def of(cls, ctx: RunContext, run: ActiveRun) -> PhaseStore:
        plan = None if ctx.checkpoint is None else ctx.checkpoint.for_run(run.run_id)
        return cls(run, plan, ctx.resume)

    def _find(self, name: str) -> str | None:
        """``name`` as an earlier attempt left it; None: not there."""
        if self.resume is True:
            return checkpoints.resume_path(self.plan, self.run.client, self.run.run_id, name)
        if not self.resume:
            return None
        path = str(PurePosixPath(self.resume).with_name(name))
        if checkpoints.exists(path):
            return path
        # a mirrored run resumed by id: its artifacts, beside the downloaded last.ckpt
        folder = str(PurePosixPath(self.resume).parent)
        return checkpoints.download_whole(self.run.client, self.run.run_id, folder, name)

    def resume_point(self, phases: int) -> tuple[int, str | None]:
        """How many phases ended in an earlier attempt, and the ``last.ckpt`` of the next one (None: it
        starts afresh)."""
        if not self.resume:
            return 0, None
        done = 0
        while done < phases and self._find(ended_name(done)) is not None:
            done += 1
        last = self._find(checkpoints.LAST) if self.resume is True else str(self.resume)
        if done == phases or last is None:
            return done, None
        return done, last if int(load_checkpoint(last, map_location="cpu").get(PHASE, 0)) == done else None

    def callbacks(self, index: int, monitor: str | None, start: str | None) -> list[Callback]:
        """What keeps phase ``index``'s ``last.ckpt`` (and ``best.ckpt``, lowest ``monitor``); the run is
        tagged ``ablate.resumed_from`` when its fit restores ``start``. None without a plan."""
        if self.plan is None:
            return []

        def resumed(step: int) -> None:
            where = f"step {step}" if index == 0 else f"phase {index + 1}, step {step}"
            self.run.tag(tracking.RESUMED, f"{start} ({where})")

        self.mark = PhaseMark(index)
        return [
            *checkpoints.callbacks(self.plan, self.run.client, self.run.run_id, resumed, monitor=monitor),
            self.mark,
        ]

    def finish(self, index: int, trainer: pl.Trainer, step: int, metrics: dict[str, float]) -> None:
        """Keep phase ``index``'s end as ``phase-<index>.ckpt`` (uploaded too when the plan mirrors)."""
        if self.plan is None or self.mark is None or not trainer.is_global_zero:
            return
        self.mark.ended = (step, dict(metrics))
        path = f"{self.plan.folder}/{ended_name(index)}"
        trainer.save_checkpoint(path, weights_only=False)  # its state for a resume (PhaseMark leaves the optimizer out)
        self.mark.ended = None
        if self.plan.mirror:
            client, run_id = self.run.client, self.run.run_id
            self.writer.then(lambda: client.log_artifact(run_id, path, checkpoints.ARTIFACTS))

    def close(self, failed: bool = False) -> None:
        """Wait for the checkpoints still being written (the run's finishers ran beside them); raise a
        write's error, unless the run ``failed`` already (its own error is the one to see)."""
        try:
            self.writer.close()
        except Exception:
            if not failed:
                raise

    def restore(self, index: int, module: pl.LightningModule) -> tuple[int, dict[str, float]]:
        """Load ended phase ``index`` into ``module`` (and the generators); its step and metrics. The data
        module's position is not: each phase's fit starts its stream afresh."""
        path = self._find(ended_name(index))
        assert path is not None, "resume_point found it"
        ckpt = load_checkpoint(path, map_location="cpu")
        module.on_load_checkpoint(ckpt)
        module.load_state_dict(ckpt["state_dict"])
        checkpoints.restore_rng(ckpt)
        self.run.tag(tracking.RESUMED, f"{path} (phase {index + 1} ended)")
        name = self.run.name or self.run.run_id[:8]
        say(f"{name}: phase {index + 1} ended in an earlier attempt: restored from {path}")
        return int(ckpt[ENDED]["step"]), {k: float(v) for k, v in ckpt[ENDED]["metrics"].items()}


def execute(plan: RunPlan[M, H], ready: Prepared[M, H], run: ActiveRun, ctx: RunContext) -> Metrics:
    """Run ``plan`` inside ``run`` on what ``ready`` loaded: its phases in turn on one step counter, each
    given what the one before handed on, with the run context's callbacks, clocks and checkpoints in
    each (resuming from what an earlier attempt left), then its finishers, each timed as
    ``finisher:<name>`` (the context's ``timed`` hook); the run's final metrics, once the checkpoints
    written in the background are on disk."""
    logger = run_logger(run.uri, run.run_id, synchronous=False, going_on=ctx.reopen is not None)
    store = PhaseStore.of(ctx, run)
    try:
        metrics = _execute(plan, ready, run, ctx, store, logger)
    except BaseException:
        store.close(failed=True)
        raise
    store.close()
    return metrics


def _execute(
    plan: RunPlan[M, H], ready: Prepared[M, H], run: ActiveRun, ctx: RunContext, store: PhaseStore, logger: RunLogger
) -> Metrics:
    done, partial = store.resume_point(len(plan.phases))
    materials, handed, cfg = ready.materials, ready.handed, ready.cfg
    step, metrics = 0, Metrics()
    for index, phase in enumerate(plan.phases):
        module, handed = phase.module(materials, handed, run)
        if index < done:  # ended in an earlier attempt: its state, not its training
            ended_at, got = store.restore(index, module)
        else:
            start = partial if index == done else None
            logger.offset = step
            fit = PhaseFit(phase, index, module, start)
            ended_at, got = _fit_phase(cfg, fit, ready.data, run, ctx, store, logger)
        metrics.update(got)
        if phase.ended is not None:  # what it hands on; what it returns is logged where it ended, once
            handed, said = phase.ended(materials, handed, module, metrics)
            if said and index >= done:
                run.log(said, step=step + ended_at)
            metrics.update(said)
        step += ended_at
    for finisher in plan.finishers:
        with ctx.timing(f"finisher:{finisher.name}"):
            metrics.update(finisher.work(materials, handed, run, step, metrics))
    return metrics


@dataclass(frozen=True)
class PhaseFit:
    """One phase about to be fitted: the phase, its index in the plan, its module and the ``last.ckpt``
    it goes on from (None: from its start)."""

    phase: Phase[Any, Any]
    index: int
    module: pl.LightningModule
    start: str | None


def _epoch_steps(data: pl.LightningDataModule) -> int:
    """The batches of one pass over ``data``'s training set."""
    return max(1, len(data.train_dataloader()))


def _fit_phase(
    cfg: ExperimentConfig,
    fit: PhaseFit,
    data: pl.LightningDataModule,
    run: ActiveRun,
    ctx: RunContext,
    store: PhaseStore,
    logger: RunLogger,
) -> tuple[int, Metrics]:
    """Fit one phase (from its ``last.ckpt``, when given); the steps it ended at and its final metrics,
    kept as its ``phase-<index>.ckpt``."""
    phase, index, module, start = fit.phase, fit.index, fit.module, fit.start
    saving = store.callbacks(index, phase.monitor, start)
    callbacks = [*phase.callbacks(), *ctx.callbacks, *ctx.clocks, *saving]
    val_every = phase.val_every
    if phase.within_epoch:
        val_every = min(val_every or cfg.trainer.val_every, _epoch_steps(data))
    trainer = build_trainer(
        cfg,
        logger,
        callbacks,
        max_steps=phase.steps,
        val_every=val_every,
        val_batches=phase.val_batches,
        writer=store.writer if saving else None,
    )
    resumed = f", from {start}" if start else ""
    run.phase(phase.name, f"{phase.detail}{', ' if phase.detail else ''}{phase.steps} steps{resumed}")
    got = _fit(trainer, module, data, start)
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
