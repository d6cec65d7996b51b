"""``SpanModule``: the span task (SQuAD) on a pre-trained encoder, trained by the one step of
:class:`~ablate.lightning_modules.methods.train_module.TrainModule` as the other fine-tuning tasks are (BERT's
start and end loss, task distillation from a span teacher, Q-BERT's phase); its validation logs the official EM
and F1 and keeps the best validation's window logits for the ``predictions/`` files (docs/guides/squad.md)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torchmetrics import MeanMetric

from ablate.datamodules.span_dev import SpanDev
from ablate.lightning_modules.config.distill import PD, Stage, schedule
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.methods.distill import TeacherLink
from ablate.lightning_modules.methods.finetune import FinetuneModule
from ablate.lightning_modules.methods.squad_metrics import best_answers, span_metrics
from ablate.lightning_modules.methods.task_model import Batch, TaskModel
from ablate.lightning_modules.methods.terms import TaskOutput
from ablate.lightning_modules.methods.train_module import OptimSetup, TrainModule
from ablate.lightning_modules.model.encoder import Trace
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.lightning_modules.model.span import SpanModel, build_span_model, span_logits

SCORE = "score"  # <task>/score: the mean of finetune.score_metrics (the metric alone by default), as every task logs


def span_loss_of(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """BERT's SQuAD loss of (B, T, 2) logits: the mean of the start's and the end's cross-entropy."""
    start, end = span_logits(logits, batch["attention_mask"])
    return (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2


def span_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The span loss of a model on one batch: what a quantization plan is ranked by."""
    return span_loss_of(model(batch), batch)


class SpanModule(FinetuneModule):
    """Fine-tuning on a span task: the start/end loss (and what a teacher adds), SQuAD's dev scores.

    A :class:`FinetuneModule` for the run that drives it (the best validation's weights, checkpoints,
    the quantization-aware phase), with a span model and its own task and validation.

    Args:
        cfg: the run's config (``finetune.kind`` span).
        pretrained: the pre-trained model, whose encoder is copied; or a span model as it is (to score it).
        link: a fine-tuned span teacher (task distillation), or None.
    """

    def __init__(
        self, cfg: ExperimentConfig, pretrained: PretrainingModel | SpanModel, link: TeacherLink | None = None
    ) -> None:
        f = cfg.finetune
        model = pretrained if isinstance(pretrained, SpanModel) else build_span_model(pretrained, cfg.model.init_std)
        if link is None:
            stages = [Stage("train", 0, f.max_steps, (PD,))]
        else:
            stages = schedule(cfg.distill, len(model.encoder.plan), f.max_steps, steps_field="finetune.max_steps")
        TrainModule.__init__(
            self, cfg, model, link, stages, OptimSetup.task(cfg, f.max_steps)
        )  # not a classifier's metrics
        self.val_loss = MeanMetric()
        self.best: float | None = None
        self.best_state: dict[str, torch.Tensor] | None = None
        self.best_values: dict[str, float] = {}
        self.window_logits: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        """Each dev window's (T,) start and end logits of this validation, by the window's index."""
        self.best_predictions: dict[str, torch.Tensor] | None = None
        """Every dev window's start and end logits at the best validation, packed (the run's ``predictions/``)."""
        self.compile_encoder()

    def task_output(self, model: TaskModel, batch: Batch, trace: Trace | None) -> TaskOutput:
        """The start and end logits as (2B, T) rows (what KD compares: distributions over positions) and the loss."""
        logits = model(batch, trace)  # (B, T, 2)
        assert isinstance(logits, torch.Tensor), "a span model gives its logits"
        start, end = span_logits(logits, batch["attention_mask"])
        return TaskOutput(torch.cat([start, end]), None, span_loss_of(logits, batch))

    def span_dev(self) -> SpanDev | None:
        """The dev questions and windows: the data module's ``dev`` (None outside a fit or a validate)."""
        data = getattr(self._trainer, "datamodule", None)  # the fit's or the validate's
        dev = getattr(data, "dev", None)
        return dev if isinstance(dev, SpanDev) else None

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self.scoring():
            return
        with torch.compiler.set_stance("force_eager"):  # as a classifier's dev batches: no graphs of its own
            logits = self.model(batch)
        self.val_loss.update(span_loss_of(logits, batch), weight=batch["input_ids"].shape[0])
        start, end = span_logits(logits, batch["attention_mask"])
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        start_np, end_np = start.cpu().numpy(), end.cpu().numpy()
        for row, (feature, n) in enumerate(zip(batch["feature"].tolist(), lengths, strict=True)):
            self.window_logits[feature] = (start_np[row, :n], end_np[row, :n])

    def on_validation_epoch_end(self) -> None:
        if not self.scoring():
            return
        f = self.cfg.finetune
        dev, logits = self.span_dev(), self.window_logits
        self.window_logits = {}
        if dev is None or len(logits) != len(dev.windows.example):  # a partial look (a sanity check)
            self.val_loss.reset()
            return
        starts, ends = zip(*(logits[i] for i in range(len(logits))), strict=True)
        answers, diffs = best_answers(dev, starts, ends, f.n_best, f.max_answer_length)
        values = {f"{f.task}/{k}": v for k, v in span_metrics(dev, answers, diffs).items()}
        values[f"{f.task}/loss"] = float(self.val_loss.compute())
        self.val_loss.reset()
        values[f"{f.task}/{SCORE}"] = float(np.mean([values[f"{f.task}/{m}"] for m in f.score_metrics or (f.metric,)]))
        current = values[f"{f.task}/{f.metric}"]
        fitting = self.trainer.state.fn == "fit"  # not a later validation (of the quantized model)
        if fitting and not self.trainer.sanity_checking and (self.best is None or current > self.best):
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            self.best_values = dict(values)
            self.best_predictions = {
                "start": torch.from_numpy(np.concatenate(starts)),
                "end": torch.from_numpy(np.concatenate(ends)),
                "length": torch.tensor([len(s) for s in starts]),
            }
        self.best = current if self.best is None else max(self.best, current)
        values[f"{f.task}/best_{f.metric}"] = self.best
        for name, value in values.items():
            self.log(name, value, prog_bar=name == f"{f.task}/{f.metric}")


def window_logits(kept: dict[str, torch.Tensor]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each dev window's (T,) start and end logits, from a span module's ``best_predictions``."""
    cuts = np.cumsum(kept["length"].numpy())[:-1]
    return np.split(kept["start"].numpy(), cuts), np.split(kept["end"].numpy(), cuts)


def span_distill_module(
    cfg: ExperimentConfig, pretrained: PretrainingModel, teacher: SpanModel, teacher_cfg: ModelConfig
) -> SpanModule:
    """Span fine-tuning distilled from a fine-tuned span ``teacher`` (task distillation)."""
    link = TeacherLink(cfg.distill, teacher, teacher_cfg, cfg.model)
    return SpanModule(cfg, pretrained, link)
