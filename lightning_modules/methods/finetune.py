"""``FinetuneModule``: a classification or regression task (GLUE's) on a pre-trained encoder, trained by the one
step of :class:`~ablate.lightning_modules.methods.train_module.TrainModule`: plain fine-tuning (the ``label``
term), task distillation from a fine-tuned teacher, FastBERT's self-distillation of the exits and Q-BERT's
quantization-aware phase. Its dev metrics: docs/guides/finetuning.md and docs/guides/glue.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import (
    BinaryF1Score,
    MulticlassAccuracy,
    MulticlassF1Score,
    MulticlassMatthewsCorrCoef,
)
from torchmetrics.regression import PearsonCorrCoef, SpearmanCorrCoef
from torchmetrics.utilities.data import dim_zero_cat

from ablate.lightning_modules.config.distill import PD, Stage, schedule
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.metric_names import SCORE
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.config.task_kinds import KIND_METRICS
from ablate.lightning_modules.methods.distill import TeacherLink
from ablate.lightning_modules.methods.quantization.apply import LayerBits, prepare_weight_qat
from ablate.lightning_modules.methods.task_model import Batch, TaskModel
from ablate.lightning_modules.methods.terms import EXIT, Need, Provided, TaskOutput, require
from ablate.lightning_modules.methods.train_module import OptimSetup, TrainModule
from ablate.lightning_modules.model.classifier import Classifier, build_classifier, hidden_width
from ablate.lightning_modules.model.early_exit import build_exits
from ablate.lightning_modules.model.encoder import Trace
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.lightning_modules.model.span import SpanModel

SELF_DISTILLATION = "self-distillation"
QUANTIZATION_AWARE = "quantization-aware"


class MatthewsCorrCoef(MulticlassMatthewsCorrCoef):
    """torchmetrics' confusion matrix, its coefficient computed as scikit-learn computes it (what GLUE's
    scorer runs), in float64: 0 where the predictions or the labels hold a single class (torchmetrics
    returns a small nonzero value there: a majority-class CoLA model would score above 0)."""

    def compute(self) -> torch.Tensor:
        c = self.confmat.double()  # (C, C): rows true, columns predicted
        truth, predicted, n = c.sum(1), c.sum(0), c.sum()
        covariance = c.trace() * n - truth @ predicted
        spread = (n * n - truth @ truth) * (n * n - predicted @ predicted)
        return torch.where(spread > 0, covariance / spread.clamp_min(1e-300).sqrt(), torch.zeros_like(spread))


class SpearmanCorr(SpearmanCorrCoef):
    """torchmetrics' kept outputs and targets, the coefficient computed as scipy computes it: Pearson's
    over average ranks (ties share their mean rank), in float64, with no epsilon in the denominator
    (torchmetrics adds 1e-6); 0 where either side is constant."""

    def compute(self) -> torch.Tensor:
        a = average_ranks(dim_zero_cat(self.preds).double())
        b = average_ranks(dim_zero_cat(self.target).double())
        a, b = a - a.mean(), b - b.mean()
        spread = (a @ a) * (b @ b)
        return torch.where(spread > 0, (a @ b) / spread.clamp_min(1e-300).sqrt(), torch.zeros_like(spread))


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Each value's rank from 1, tied values sharing the mean of their ranks (scipy's ``rankdata``)."""
    unique: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = torch.unique(x, return_inverse=True, return_counts=True)
    _, inverse, counts = unique
    last = counts.cumsum(0).to(torch.float64)  # the last rank of each distinct value, in sorted order
    ranks: torch.Tensor = (last - (counts.to(torch.float64) - 1) / 2)[inverse]
    return ranks


METRICS: dict[str, Callable[[int], Metric]] = {  # arguments unchecked: labels are checked when read
    "accuracy": lambda c: MulticlassAccuracy(num_classes=c, average="micro", validate_args=False),
    "f1": lambda c: (
        BinaryF1Score(validate_args=False)
        if c == 2
        else MulticlassF1Score(num_classes=c, average="macro", validate_args=False)
    ),
    "mcc": lambda c: MatthewsCorrCoef(num_classes=c, validate_args=False),
    "pearson": lambda c: PearsonCorrCoef().set_dtype(torch.float64),
    "spearman": lambda c: SpearmanCorr().set_dtype(torch.float64),
}
"""Each dev metric's torchmetrics metric for ``num_labels`` outputs; updated with (predictions, labels):
classes (:func:`predictions`) for classification, the one output and the targets in float64 for
regression (as scipy computes the correlations)."""


def task_metrics(f: FinetuneConfig) -> dict[str, Metric]:
    """The dev metrics of the task ``f`` by name (its kind's)."""
    return {name: METRICS[name](f.num_labels) for name in KIND_METRICS[f.kind]}


def predictions(logits: torch.Tensor, regression: bool) -> torch.Tensor:
    """What the dev metrics score: the class with the largest logit, or the one output (float64)."""
    return logits.squeeze(-1).double() if regression else logits.argmax(dim=-1)


def computed(metric: Metric) -> torch.Tensor:
    """A dev metric's value; a correlation of constant predictions (undefined: NaN) counts 0, as a
    prediction that follows nothing."""
    value = metric.compute()
    return torch.nan_to_num(value, nan=0.0) if isinstance(metric, PearsonCorrCoef | SpearmanCorrCoef) else value


def task_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The task's loss: cross-entropy on classes (long labels), or the mean squared error of the one
    output against float targets (regression)."""
    if labels.is_floating_point():
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


class FinetuneModule(TrainModule):
    """Fine-tuning: cross-entropy on the labels or the squared error of a regression (and what a
    teacher or exits add), dev metrics for early stopping.

    Args:
        cfg: the run's config (``finetune`` says the task and schedule, ``distill`` the teacher's terms).
        pretrained: the pre-trained model, whose encoder is copied (it stays unchanged) under a new
            classifier; or a classifier as it is (a quantized one, to score it as the run scores its own).
        link: a fine-tuned teacher (task distillation), or None.
    """

    loss_name = "fine-tuning loss"
    model: Classifier | SpanModel
    """The task model: a classifier, or a span task's span model (a :class:`SpanModule`'s)."""

    def __init__(
        self, cfg: ExperimentConfig, pretrained: PretrainingModel | Classifier, link: TeacherLink | None = None
    ) -> None:
        f = cfg.finetune
        if isinstance(pretrained, Classifier):
            model = pretrained
        else:
            model = build_classifier(pretrained, f.num_labels, cfg.model.dropout, cfg.model.init_std)
        layers = len(model.encoder.plan)
        if f.exits and model.exits is None:
            width = hidden_width(model.encoder)
            model.exits = build_exits(width, layers, f.num_labels, cfg.model.dropout, cfg.model.init_std)
        if link is None:
            stages = [Stage("train", 0, f.max_steps, (PD,))]
        else:
            stages = schedule(cfg.distill, layers, f.max_steps, steps_field="finetune.max_steps")
        plan = OptimSetup.task(cfg, f.max_steps)
        super().__init__(cfg, model, link, stages, plan)
        self.regression = f.kind == "regression"
        self.dev_names = [f.task, *(d.name for d in f.extra_validation)]
        # per dev set (by its index: a name may hold a dot), its metrics and loss, moving with the module
        self.dev = nn.ModuleList(nn.ModuleDict({**task_metrics(f), "loss": MeanMetric()}) for _ in self.dev_names)
        self.best: float | None = None
        self.best_state: dict[str, torch.Tensor] | None = None
        self.best_values: dict[str, float] = {}
        """Every dev metric (and the score) at the best validation: what the kept weights score."""
        self.dev_predictions: list[list[torch.Tensor]] = [[] for _ in self.dev_names]
        """This validation's predictions per dev set, batch by batch (on the module's device)."""
        self.best_predictions: dict[str, torch.Tensor] | None = None
        """The best validation's predictions (CPU tensors, as a checkpoint holds them): per dev set name, each
        row's (:func:`predictions`), in file order; a span task's, every dev window's start and end logits
        (:func:`~ablate.lightning_modules.methods.span.window_logits` reads them): the run's ``predictions/``."""
        self.compile_encoder()

    def compile_encoder(self) -> None:
        """When the run compiles: the encoder's layer block, one graph per layer shape for every width the
        loader's batches take (bucketed widths; a span task's windows). Validation runs eager."""
        if self.cfg.trainer.compile:
            self.model.encoder.compile_layers(self.cfg.trainer.compile_mode, any_length=True)

    def dev_metrics(self, dev: int = 0) -> dict[str, Metric]:
        """The metrics of dev set ``dev`` (0: the task's own) by name, its loss as ``loss``."""
        out: dict[str, Metric] = {}
        metrics = self.dev[dev]
        assert isinstance(metrics, nn.ModuleDict)
        for name, metric in metrics.items():
            assert isinstance(metric, Metric), "self.dev holds torchmetrics metrics only"
            out[name] = metric
        return out

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The best validation so far and its weights go with the checkpoint: a resumed fit leaves the same model."""
        checkpoint["ablate_best"] = {"value": self.best, "state": self.best_state, "values": self.best_values}
        checkpoint["ablate_best"]["predictions"] = self.best_predictions

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        best = checkpoint.get("ablate_best")
        if best is not None:
            self.best, self.best_state = best["value"], best["state"]
            self.best_values = best.get("values", {})
            self.best_predictions = best.get("predictions")

    def restore_best(self) -> None:
        """Load the weights of the best validation so far (early stopping's choice) into the model."""
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)

    # -- the task ----------------------------------------------------------------------------
    def provides(self) -> Provided:
        """The task's labels, class distributions (not a regression's one output) and FastBERT's
        exits where the classifier has them, beside a teacher's."""
        base = super().provides()
        have = base.have | {Need.LABELS} | ({Need.EXITS} if getattr(self.model, "exits", None) is not None else set())
        if self.cfg.finetune.kind == "regression":
            why = "a regression task (finetune.kind regression) has one output (the intermediate terms still apply)"
            return Provided(have, {**base.why_not, Need.DISTRIBUTIONS: why})
        return Provided(have | {Need.DISTRIBUTIONS}, base.why_not)

    def task_output(self, model: TaskModel, batch: Batch, trace: Trace | None) -> TaskOutput:
        """The final head's logits and the task's loss on the labels (:func:`task_loss`)."""
        logits = model(batch, trace)  # (B, C); (B, 1) for regression
        assert isinstance(logits, torch.Tensor), "a classifier gives its logits"
        return TaskOutput(logits, None, task_loss(logits, batch["labels"]))

    def self_distillation(self) -> None:
        """Switch to FastBERT's second phase: ``finetune.exit_steps`` steps in which only the exits
        train, from the final classifier (the best validation's weights, frozen)."""
        f = self.cfg.finetune
        require(EXIT, self.selected, self.provides())
        self.restore_best()
        stage = Stage(SELF_DISTILLATION, 0, f.exit_steps, ("exit",), trainable=(), embeddings=False, extra=("exits",))
        self.set_stages([stage], OptimSetup.task(self.cfg, f.exit_steps))

    def quantization_aware(self, plan: LayerBits) -> None:
        """Switch to Q-BERT's phase: from the best validation's weights, ``quant.qat_steps`` steps of the
        task's loss with the layers ``plan`` names (and the embedding tables when ``quant.embeddings``
        says) fake-quantized at their bits, group-wise. The best validation is then that of this phase."""
        q = self.cfg.quant
        self.restore_best()
        self.model.requires_grad_(True)  # the whole classifier trains, after a phase that froze it (FastBERT's exits)
        prepare_weight_qat(self.model, plan, q)
        self.best, self.best_state, self.best_values, self.best_predictions = None, None, {}, None
        stage = Stage(QUANTIZATION_AWARE, 0, q.qat_steps, (PD,))
        self.set_stages([stage], OptimSetup.task(self.cfg, q.qat_steps))

    # -- validation --------------------------------------------------------------------------
    def scoring(self) -> bool:
        """Whether the dev set is scored now: not while an intermediate stage trains the layers
        (the classifier has not learnt yet), nor during self-distillation (the final classifier is frozen)."""
        stage = self.stage_at(max(0, self.global_step - 1))  # the stage of the step just trained
        return PD in stage.losses

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self.scoring():
            return
        # eager when compiled: dev batches are padded to their longest row, and a few of them would
        # each compile (and capture) a graph of their own
        with torch.compiler.set_stance("force_eager"):
            logits = self.model(batch)
        labels = batch["labels"]
        metrics = self.dev_metrics(dataloader_idx)
        metrics.pop("loss").update(task_loss(logits, labels), weight=labels.shape[0])
        preds = predictions(logits, self.regression)
        self.dev_predictions[dataloader_idx].append(preds.detach())  # to the CPU at the end: no sync per batch
        targets = labels.double() if self.regression else labels
        for metric in metrics.values():
            metric.update(preds, targets)

    def on_validation_epoch_end(self) -> None:
        if not self.scoring():
            self.dev_predictions = [[] for _ in self.dev_names]
            return
        task, f = self.cfg.finetune.task, self.cfg.finetune
        values: dict[str, torch.Tensor] = {}
        for i, dev in enumerate(self.dev_names):
            values.update({f"{dev}/{name}": computed(metric) for name, metric in self.dev_metrics(i).items()})
        scored = [values[f"{dev}/{m}"].float() for dev in self.dev_names for m in f.score_metrics or (f.metric,)]
        values[f"{task}/{SCORE}"] = torch.stack(scored).mean()
        current = float(values[f"{task}/{f.metric}"])
        fitting = self.trainer.state.fn == "fit"  # not a later validation (of the quantized classifier)
        if fitting and not self.trainer.sanity_checking and (self.best is None or current > self.best):
            # the best validation's weights, which the run leaves (restore_best): kept on the CPU
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            self.best_values = {name: float(value) for name, value in values.items()}
            rows = (torch.cat(p).cpu() if p else torch.zeros(0) for p in self.dev_predictions)
            self.best_predictions = dict(zip(self.dev_names, rows, strict=True))
        self.dev_predictions = [[] for _ in self.dev_names]
        self.best = current if self.best is None else max(self.best, current)
        values[f"{task}/best_{f.metric}"] = torch.tensor(self.best)
        for name, value in values.items():
            self.log(name, value, prog_bar=name == f"{task}/{f.metric}")
        for i in range(len(self.dev_names)):
            for metric in self.dev_metrics(i).values():
                metric.reset()


def task_distill_module(
    cfg: ExperimentConfig, pretrained: PretrainingModel, teacher: Classifier, teacher_cfg: ModelConfig
) -> FinetuneModule:
    """Fine-tuning distilled from a fine-tuned ``teacher`` (task distillation). ConfigError (naming the
    field) when the teacher does not fit: other labels, a layer or head map that does not exist."""
    f, d = cfg.finetune, cfg.distill
    if teacher.num_labels != f.num_labels:
        raise ConfigError(
            f"distill.teacher: the teacher classifies into {teacher.num_labels} labels, the task "
            f"(finetune.num_labels) has {f.num_labels}"
        )
    student_cfg = cfg.model
    link = TeacherLink(d, teacher, teacher_cfg, student_cfg)
    return FinetuneModule(cfg, pretrained, link)
