"""Where a run's phases keep their checkpoints, and what a retry finds there (:class:`PhaseStore`): the phase in
progress keeps ``last.ckpt`` (and ``best.ckpt``), tagged with its index; each ended phase leaves
``phase-<k>.ckpt`` (its module's state, the random generators, the step it ended at, its fit's final metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.cloud_io import _load as load_checkpoint
from lightning.pytorch.callbacks import Callback

from ablate.sweeps.engine import checkpoints, tracking
from ablate.sweeps.engine.context import ActiveRun, RunContext, say
from ablate.sweeps.engine.trainer import RunLogger

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
        if self.ended is not None:
            checkpoint[ENDED] = {"step": self.ended[0], "metrics": self.ended[1]}


@dataclass
class PhaseStore:
    """One run's phase checkpoints.

    Attributes:
        run: the run they belong to.
        plan: where its checkpoints are written (None: none kept).
        resume: the context's ``resume``: True (what an earlier attempt at the config left), a
            ``last.ckpt`` (``ablate train --resume``: its folder holds the ended phases), or False.
    """

    run: ActiveRun
    plan: checkpoints.CheckpointPlace | None
    resume: str | bool
    mark: PhaseMark | None = None

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
        return checkpoints.download(self.run.client, self.run.run_id, str(PurePosixPath(self.resume).parent), name)

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
        trainer.save_checkpoint(path, weights_only=False)  # whole, as a resume reads it (and no note that it was unset)
        self.mark.ended = None
        if self.plan.mirror:
            self.run.client.log_artifact(self.run.run_id, path, checkpoints.ARTIFACTS)

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
