"""``TrainModule``: the one way ablate trains a model, whatever the method: a model, an optional frozen teacher
(:class:`~ablate.lightning_modules.methods.distill.TeacherLink`), weighted loss terms from the registry
(:mod:`ablate.lightning_modules.methods.terms`) and a schedule of stages. A subclass says only what its task is
(:meth:`TrainModule.task_output`), what its run provides (:meth:`TrainModule.provides`) and how it validates;
docs/guides/distillation.md ("One training path")."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.types import OptimizerLRScheduler
from torch import nn

from ablate.lightning_modules.config.distill import Stage
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.run import OptimConfig
from ablate.lightning_modules.methods import terms as registry
from ablate.lightning_modules.methods.distill import TeacherLink
from ablate.lightning_modules.methods.precision import resolved
from ablate.lightning_modules.methods.task_model import Batch, TaskModel
from ablate.lightning_modules.methods.terms import Need, Provided, TaskOutput, Term, TermInputs
from ablate.lightning_modules.model.encoder import Trace
from ablate.lightning_modules.model.heads import PretrainingModel


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay matrices, not biases, norms or embeddings' 1-d parameters."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(groups: list[dict[str, Any]], lr: float, eps: float = 1e-8, precision: str = "32-true") -> torch.optim.AdamW:
    """AdamW over ``groups``, fused (one kernel for every parameter) where PyTorch has the fused
    kernel for their device (CUDA, CPU), else the multi-tensor implementation. Not fused under
    ``16-mixed``: its gradient scaler must unscale before clipping (see :func:`clip_gradients`)."""
    params = [p for group in groups for p in group["params"]]
    fused = (
        precision != "16-mixed"
        and bool(params)
        and all(p.device.type in ("cuda", "cpu") and p.is_floating_point() for p in params)
    )
    return torch.optim.AdamW(groups, lr=lr, eps=eps, fused=fused, foreach=None if fused else True)


def clip_gradients(
    module: pl.LightningModule, optimizer: torch.optim.Optimizer, value: float | None, algorithm: str | None
) -> None:
    """Gradient clipping by norm, done here rather than by Lightning's mixed-precision plugin,
    which refuses a fused optimizer even in bf16, where there is no scaler to unscale first."""
    if not value:
        return
    if module.trainer.precision == "16-mixed":  # the scaler unscales first: Lightning's own path
        pl.LightningModule.configure_gradient_clipping(module, optimizer, value, algorithm)
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    torch.nn.utils.clip_grad_norm_(params, value, foreach=True)


def use_tensor_cores(device: torch.device) -> None:
    """fp32 matmuls on TF32 tensor cores on a CUDA device (Ampere and later; bf16 autocast is
    unaffected); nothing elsewhere."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")


def warmup_linear_decay(optim: OptimConfig, max_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warmup to 1, then linear decay to 0 at ``max_steps``."""
    warmup = max(optim.warmup_steps, 0)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup))

    return factor


@dataclass(frozen=True)
class OptimSetup:
    """What the optimizer of one fit does: AdamW at ``lr``, warmup then linear decay over ``max_steps``."""

    lr: float
    max_steps: int
    warmup_steps: int
    weight_decay: float = 0.01
    eps: float = 1e-8

    @classmethod
    def pretraining(cls, cfg: ExperimentConfig, steps: int) -> OptimSetup:
        """Pre-training's (and distillation's): ``optim.lr`` after ``optim.warmup_steps``, over ``steps``."""
        o = cfg.optim
        return cls(o.lr, steps, o.warmup_steps, o.weight_decay, o.eps)

    @classmethod
    def task(cls, cfg: ExperimentConfig, steps: int) -> OptimSetup:
        """A fine-tuning phase's: ``finetune.lr``, a tenth of its ``steps`` of warm-up."""
        o = cfg.optim
        return cls(cfg.finetune.lr, steps, max(1, steps // 10), o.weight_decay, o.eps)

    def describe(self) -> str:
        """``AdamW lr 0.001, warm-up 10``: what ``--print-plan`` shows of a phase's optimizer."""
        return f"AdamW lr {self.lr:g}, warm-up {self.warmup_steps}"


@runtime_checkable
class DeviceLogger(Protocol):
    """A logger that takes a log step's values on the device and reads them when it sends them
    (:class:`ablate.sweeps.engine.trainer.RunLogger`): a GPU's queue is not drained at every log step."""

    def log_tensor(self, names: Sequence[str], values: torch.Tensor, step: int) -> None: ...


class TrainModule(pl.LightningModule, abc.ABC):
    """One training step for every method: model, optional teacher, weighted terms, stages.

    Args:
        cfg: the run's resolved config.
        model: the model that trains.
        link: the frozen teacher and its maps to the student (None: no teacher).
        stages: the schedule (at least one stage; the last runs to the end of training).
        optim: the optimizer's plan.

    The loss terms are the registry's that the run provides for (:meth:`provides`), weighted as
    the config says: ConfigError (naming the weight field) for a term weighted above 0 whose needs
    the run lacks.
    """

    loss_name = "training loss"
    model: TaskModel

    def __init__(
        self,
        cfg: ExperimentConfig,
        model: TaskModel,
        link: TeacherLink | None,
        stages: list[Stage],
        optim: OptimSetup,
    ) -> None:
        super().__init__()
        self.cfg, self.link = cfg, link
        self.model = model
        self.stages, self.optim = list(stages), optim
        self._stage: Stage | None = None
        self.selected = registry.select(cfg, self.provides())
        self.terms: tuple[Term, ...] = self.selected.terms
        """The terms this run sums (in the registry's order), where its stages turn them on."""
        self.weights: dict[str, float] = self.selected.weights
        """Each term's weight by name (every term the run can compute, those weighted 0 included)."""

    # -- what a task says ----------------------------------------------------------------
    @abc.abstractmethod
    def task_output(self, model: TaskModel, batch: Batch, trace: Trace | None) -> TaskOutput:
        """The task's forward of ``model`` (the student or the teacher) on ``batch``: each task's own
        (pre-training, fine-tuning); a TrainModule without one cannot be built."""

    def provides(self) -> Provided:
        """What this run provides its terms (a subclass adds its task's): the teacher's, when it has
        one (hidden states and embeddings; attention where the heads pair; a student's own vocabulary)."""
        link = self.link
        have = {Need.PREDICTION, Need.HIDDEN, Need.EMBEDDING}
        if link is None:
            return Provided(frozenset(have))
        have |= {Need.TEACHER} | ({Need.VOCABULARY} if link.vocab is not None else set())
        if link.heads_error is None:
            return Provided(frozenset(have | {Need.ATTENTION}))
        return Provided(frozenset(have), {Need.ATTENTION: link.heads_error})

    def __setattr__(self, name: str, value: object) -> None:
        # Lightning names the hook it is in around each of some 40 hook calls a step: a plain attribute,
        # not through nn.Module's checks for parameters, buffers and submodules (5 us each on a CPU)
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)  # type: ignore[arg-type]  # nn.Module takes any value, typed narrower

    # -- the step --------------------------------------------------------------------------
    def new_step(self) -> None:
        """Compiled with CUDA graphs, a step's graph outputs are overwritten by the next replay:
        say where a step begins (nothing from an earlier step is read after this)."""
        if self.cfg.trainer.compile and self.cfg.trainer.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]  # torch leaves it unannotated

    def logs_this_step(self) -> bool:
        """Whether the logger writes this step's training metrics (every ``trainer.log_every``
        steps, and the last step, whose values are the run's final ones): only then are they
        handed to Lightning, whose bookkeeping costs host time."""
        trainer = self._trainer
        if trainer is None:
            return True
        step = trainer.global_step + 1
        every: int = trainer.log_every_n_steps  # type: ignore[attr-defined]  # Lightning sets it, undeclared
        return step % every == 0 or 0 < trainer.max_steps <= step

    def losses(self, batch: Batch, stage: Stage) -> dict[str, torch.Tensor]:
        """Every term ``stage`` turns on, unweighted, by name (in the registry's order)."""
        on = registry.stage_terms(self.terms, stage.losses)
        inputs = self.term_inputs(batch, stage, on)
        return {term.name: term.compute(inputs) for term in on}

    def term_inputs(self, batch: Batch, stage: Stage, on: tuple[Term, ...]) -> TermInputs:
        """Run what the terms ``on`` need: the student's task forward (PREDICTION), the frozen teacher
        (TEACHER), traces of both (hidden states, attention scores, embeddings) on the stage's layers.
        Without a teacher term, the model alone runs its own fast forward."""
        needs = [need for need in Need if any(need in term.needs for term in on)]
        link, predict = self.link, Need.PREDICTION in needs
        if link is None or Need.TEACHER not in needs:  # the model alone: its own fast forward
            student = self.task_output(self.model, batch, None) if predict else None
            return TermInputs(batch, self.model, student)
        layers = stage.layers if stage.layers is not None else tuple(range(len(link.layer_map)))
        traced = any(need in registry.TRACED for need in needs)
        s_trace, t_trace = link.traces(layers, Need.ATTENTION in needs, full=predict) if traced else (None, None)
        teacher = self.teacher_output(batch, t_trace, predict, Need.VOCABULARY in needs)
        student = None
        if predict:
            student = self.task_output(self.model, batch, s_trace)
        else:  # the layers only: the transfer stages
            self.model.encoder(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"], trace=s_trace)
        return TermInputs(batch, self.model, student, teacher, link, s_trace, t_trace, layers)

    def teacher_output(self, batch: Batch, trace: Trace | None, pd: bool, dual: bool = False) -> TaskOutput | None:
        """The frozen teacher on ``batch``, recording ``trace``: its task output when ``pd`` (else
        only its encoder runs). A student with its own vocabulary (``link.vocab``) has the teacher
        read Zhao et al.'s mixed sequence and predict over the student's vocabulary (the losses:
        ``dual``); with ``dual`` that term trains, its gradient flowing through the teacher into
        the student's word table and the bridge. Otherwise nothing here builds a graph."""
        link = self.link
        assert link is not None
        if link.vocab is not None:
            with contextlib.nullcontext() if dual else torch.no_grad():
                word = self.model.encoder.embeddings.word.weight  # (V_s, E_s)
                assert isinstance(link.teacher, PretrainingModel), (
                    "dual training reads a pre-trained teacher's MLM head"
                )
                mixed = link.vocab.teach(link.teacher, word, batch, trace, predict=pd, dual=dual)
            return None if mixed is None else TaskOutput(mixed.logits, mixed.valid, mixed.loss)
        with torch.no_grad():
            if pd:
                return self.task_output(link.teacher, batch, trace)
            link.teacher.encoder(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"], trace=trace)
        return None

    def weighted(self, losses: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The total loss: each term times its weight."""
        total: torch.Tensor = sum(self.weights[k] * v for k, v in losses.items())  # type: ignore[assignment]
        return total

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """One step's loss; on log steps only, the total, the tokens and each term are logged (read by the
        logger later, :meth:`log_training`)."""
        self.new_step()
        stage = self._stage or self.stage_at(self.global_step)
        losses = self.losses(batch, stage)
        loss = self.weighted(losses)
        if self.logs_this_step():
            self.log_training(loss, batch, losses)
        return loss

    def log_training(self, loss: torch.Tensor, batch: Batch, losses: Mapping[str, torch.Tensor]) -> None:
        """A log step's ``train/loss``, ``train/tokens`` and ``train/<term>_loss``, as one tensor on the
        device: a :class:`DeviceLogger` reads it when it sends (the step does not wait for the device),
        another logger at once; a term that is off in this stage is not logged (no repeat of its last value).
        The same values stand in ``trainer.callback_metrics`` (the fit's result, the progress bar), unread."""
        names = ["train/loss", "train/tokens", *(f"train/{k}_loss" for k in losses)]
        parts = [loss, batch["attention_mask"].sum(), *losses.values()]
        values = torch.stack([v.detach().float() for v in parts])  # (2 + terms,)
        logger = self.logger
        if isinstance(logger, DeviceLogger):
            logger.log_tensor(names, values, step=self.global_step)
        elif logger is not None:
            logger.log_metrics(dict(zip(names, values.tolist(), strict=True)), step=self.global_step)
        if self._trainer is not None:
            self._trainer.callback_metrics.update({"train/loss": values[0], "train/tokens": values[1]})

    # -- stages ----------------------------------------------------------------------------
    def set_stages(self, stages: list[Stage], optim: OptimSetup | None = None) -> None:
        """A new schedule (and optimizer plan) for the next fit (FastBERT's self-distillation)."""
        self.stages, self._stage = list(stages), None
        self.optim = optim or self.optim
        self._enter(self.stages[0])

    def describe_step(self, step: int) -> str:
        """What the NaN guard adds to its message: the stage at ``step`` (nothing for a plain one-stage run)."""
        return f"stage {self.stage_at(step).name}" if self.staged else ""

    @property
    def staged(self) -> bool:
        """Whether the run's stages are worth telling (a teacher, or more than one stage): tagged
        ``ablate.stages``, each boundary a ``distill/stage`` metric step."""
        return self.link is not None or len(self.stages) > 1

    def stage_at(self, step: int) -> Stage:
        """The stage that covers optimizer step ``step``."""
        return next((s for s in self.stages if s.start <= step < s.end), self.stages[-1])

    def _enter(self, stage: Stage) -> None:
        """Freeze everything of the model that ``stage`` does not train (a one-stage schedule that
        trains the whole model leaves what trains as the module set it: pruning's gates)."""
        self._stage = stage
        # the boundary, at its exact step (not again where a resumed fit enters the stage it was in)
        if self.staged and self.global_step == stage.start and isinstance(self.logger, MLFlowLogger):
            self.logger.log_metrics({"distill/stage": float(self.stages.index(stage))}, step=self.global_step)
        if len(self.stages) == 1 and stage.trainable is None and not stage.extra:
            return
        model = self.model
        model.requires_grad_(stage.trainable is None and not stage.extra)
        for i in stage.trainable or ():
            for module in model.encoder.layer_modules(i):
                module.requires_grad_(True)
        model.encoder.embeddings.requires_grad_(stage.embeddings and not stage.extra)
        for name in stage.extra:
            getattr(model, name).requires_grad_(True)

    def on_fit_start(self) -> None:
        # the model trains in train mode (its dropout on), whatever mode it came in: Lightning keeps each
        # module's mode, and a model read from a run or a folder (a fine-tuning or pruning source) is in eval mode
        self.train()
        if self.global_rank > 0:  # a spawned DDP rank starts at torch's default; rank 0's run set its own
            torch.set_float32_matmul_precision(resolved(self.cfg.trainer.matmul_precision, self.device.type))
        if self.staged and isinstance(self.logger, MLFlowLogger):  # the boundaries, in the run's tags
            text = "; ".join(f"{s.name} [{s.start}, {s.end}): {'+'.join(s.losses)}" for s in self.stages)
            self.logger.experiment.set_tag(self.logger.run_id, "ablate.stages", text)

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        stage = self.stage_at(self.global_step)
        if stage is not self._stage:
            self._enter(stage)

    # -- the teacher stays frozen ------------------------------------------------------
    def train(self, mode: bool = True) -> TrainModule:
        super().train(mode)
        if self.link is not None:  # the whole module in train mode (on_fit_start); the teacher's dropout stays off
            self.link.teacher.eval()
        return self

    # -- the optimizer -------------------------------------------------------------------
    def trainable_modules(self) -> nn.Module:
        """What the optimizer trains: the model, and what a teacher link learns (projections, the
        vocabulary bridge)."""
        learned = self.link.learned() if self.link is not None else []
        assert isinstance(self.model, nn.Module), "a model is an nn.Module"
        return self.model if not learned else nn.ModuleList([self.model, *learned])

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def optimizer_and_schedule(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR | None]:
        """The optimizer of :meth:`trainable_modules` and its learning-rate schedule, stepped every
        step (None: a constant rate), what :meth:`configure_optimizers` hands Lightning; a
        benchmark steps them itself."""
        o = self.optim
        optimizer = adamw(
            param_groups(self.trainable_modules(), o.weight_decay),
            lr=o.lr,
            eps=o.eps,
            precision=self.cfg.trainer.precision,
        )
        schedule = warmup_linear_decay(OptimConfig(warmup_steps=o.warmup_steps), o.max_steps)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    def configure_optimizers(self) -> OptimizerLRScheduler:
        optimizer, scheduler = self.optimizer_and_schedule()
        if scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
