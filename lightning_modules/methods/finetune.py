"""``FinetuneModule``: the classification task (GLUE-style) on a pre-trained encoder, trained by
the one step of :class:`~lightning_modules.train_module.TrainModule`.

The same step serves every fine-tuning method:

- plain fine-tuning: the ``label`` term (cross-entropy on the task's labels);
- task distillation (TinyBERT's task-specific stage, DistilBERT's): a fine-tuned teacher joined
  by a :class:`~lightning_modules.distill.TeacherLink`, the prediction layer's ``kd`` on the task
  logits beside ``label`` (``distill.label_weight``), and optionally the intermediate terms,
  scheduled by ``distill.strategy`` (``joint``: intermediate layers first, then the prediction layer);
- FastBERT: after fine-tuning, a second fit whose one stage trains only the exits, by
  self-distillation from the final classifier (the ``exit`` term; :meth:`FinetuneModule.self_distillation`).

Dev metrics (torchmetrics): accuracy, macro F1 and Matthews correlation, logged as
``<task>/accuracy``, ``<task>/f1``, ``<task>/mcc`` and ``<task>/loss``; the best value of
``finetune.metric`` so far as ``<task>/best_<metric>``. While an intermediate stage trains (the
classifier is not yet trained) the dev set is not scored.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassMatthewsCorrCoef

from ablate.lightning_modules.config.distill import Stage, schedule
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.methods.distill import TeacherLink
from ablate.lightning_modules.methods.quantization.apply import Plan, prepare_weight_qat
from ablate.lightning_modules.methods.train_module import OptimPlan, TaskOutput, TrainModule
from ablate.lightning_modules.model.classifier import Classifier, build_classifier, hidden_width
from ablate.lightning_modules.model.early_exit import build_exits, exit_logits, self_distillation_loss
from ablate.lightning_modules.model.heads import PretrainingModel

SELF_DISTILLATION = "self-distillation"
QUANTIZATION_AWARE = "quantization-aware"


def finetune_weights(cfg: ExperimentConfig) -> dict[str, float]:
    """The fine-tuning terms' weights: the labels' ``distill.label_weight`` (1 without a teacher),
    KD and the intermediate terms as ``distill`` says, FastBERT's ``exit`` 1."""
    d = cfg.distill
    return {
        "label": d.label_weight,
        "kd": d.kd_weight,
        "exit": 1.0,
        **{k: getattr(d, f"{k}_weight") for k in ("fmt", "at", "embed", "cos")},
    }


class FinetuneModule(TrainModule):
    """Fine-tuning: cross-entropy on the labels (and what a teacher or exits add), dev metrics
    for early stopping.

    Args:
        cfg: the run's config (``finetune`` says the task and schedule, ``distill`` the teacher's terms).
        pretrained: the pre-trained model; its encoder is copied, so it stays unchanged.
        link: a fine-tuned teacher (task distillation), or None.
    """

    loss_name = "fine-tuning loss"

    def __init__(self, cfg: ExperimentConfig, pretrained: PretrainingModel, link: TeacherLink | None = None) -> None:
        f = cfg.finetune
        model = build_classifier(pretrained, f.num_labels, cfg.model.dropout, cfg.model.init_std)
        layers = len(model.encoder.plan)
        if f.exits:
            width = hidden_width(model.encoder)
            model.exits = build_exits(width, layers, f.num_labels, cfg.model.dropout, cfg.model.init_std)
        if link is None:
            stages = [Stage("train", 0, f.max_steps, ("pd",))]
        else:
            stages = schedule(cfg.distill, layers, f.max_steps, steps_field="finetune.max_steps")
        o = cfg.optim
        plan = OptimPlan(f.lr, f.max_steps, max(1, f.max_steps // 10), o.weight_decay, o.eps)
        super().__init__(cfg, model, link, stages, finetune_weights(cfg), plan)
        C = f.num_labels
        self.val_loss = MeanMetric()
        self.metrics = nn.ModuleDict(
            {
                "accuracy": MulticlassAccuracy(num_classes=C, average="micro"),
                "f1": MulticlassF1Score(num_classes=C, average="macro"),
                "mcc": MulticlassMatthewsCorrCoef(num_classes=C),
            }
        )
        self.best: float | None = None
        self.best_state: dict[str, torch.Tensor] | None = None

    def dev_metrics(self) -> dict[str, Metric]:
        """The dev metrics by name (held in a ModuleDict, so that they move with the module)."""
        out: dict[str, Metric] = {}
        for name, metric in self.metrics.items():
            assert isinstance(metric, Metric), "self.metrics holds torchmetrics metrics only"
            out[name] = metric
        return out

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The best validation so far and its weights go with the checkpoint: a resumed fit leaves the same model."""
        checkpoint["ablate_best"] = {"value": self.best, "state": self.best_state}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        best = checkpoint.get("ablate_best")
        if best is not None:
            self.best, self.best_state = best["value"], best["state"]

    def restore_best(self) -> None:
        """Load the weights of the best validation so far (early stopping's choice) into the model."""
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)

    # -- the task ----------------------------------------------------------------------------
    def task_output(self, model: nn.Module, batch: dict[str, torch.Tensor], trace: Any) -> TaskOutput:
        """The final head's logits and the cross-entropy on the labels."""
        logits = model(batch, trace)  # (B, C)
        return TaskOutput(logits, None, {"label": F.cross_entropy(logits.float(), batch["labels"])})

    def extra_terms(self, batch: dict[str, torch.Tensor], stage: Stage) -> dict[str, torch.Tensor]:
        """FastBERT's self-distillation: the exits learn the final classifier's distribution."""
        if "exit" not in stage.losses:
            return {}
        *exits, final = exit_logits(self.model, batch)
        return {"exit": self_distillation_loss(exits, final.detach())}

    def self_distillation(self) -> None:
        """Switch to FastBERT's second phase: ``finetune.exit_steps`` steps in which only the exits
        train, from the final classifier (the best validation's weights, frozen)."""
        f = self.cfg.finetune
        if self.model.exits is None:
            raise ConfigError("finetune.exits: the classifier has no exits to train")
        self.restore_best()
        stage = Stage(SELF_DISTILLATION, 0, f.exit_steps, ("exit",), trainable=(), embeddings=False, extra=("exits",))
        o = self.optim
        self.set_stages([stage], OptimPlan(f.lr, f.exit_steps, max(1, f.exit_steps // 10), o.weight_decay, o.eps))

    def quantization_aware(self, plan: Plan) -> None:
        """Switch to Q-BERT's phase: from the best validation's weights, ``quant.qat_steps`` steps of the
        task's loss with the layers ``plan`` names (and the embedding tables when ``quant.embeddings``
        says) fake-quantized at their bits, group-wise. The best validation is then that of this phase."""
        q, f, o = self.cfg.quant, self.cfg.finetune, self.optim
        self.restore_best()
        self.model.requires_grad_(True)  # the whole classifier trains, after a phase that froze it (FastBERT's exits)
        prepare_weight_qat(self.model, plan, q)
        self.best, self.best_state = None, None
        stage = Stage(QUANTIZATION_AWARE, 0, q.qat_steps, ("pd",))
        self.set_stages([stage], OptimPlan(f.lr, q.qat_steps, max(1, q.qat_steps // 10), o.weight_decay, o.eps))

    # -- validation --------------------------------------------------------------------------
    def scoring(self) -> bool:
        """Whether the dev set is scored now: not while an intermediate stage trains the layers
        (the classifier has not learnt yet), nor during self-distillation (the final classifier is frozen)."""
        stage = self.stage_at(max(0, self.global_step - 1))  # the stage of the step just trained
        return "pd" in stage.losses

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        if not self.scoring():
            return
        logits = self.model(batch)
        self.val_loss.update(F.cross_entropy(logits.float(), batch["labels"]), weight=batch["labels"].shape[0])
        for metric in self.dev_metrics().values():
            metric.update(logits, batch["labels"])

    def on_validation_epoch_end(self) -> None:
        if not self.scoring():
            return
        task, f = self.cfg.finetune.task, self.cfg.finetune
        values = {f"{task}/{name}": metric.compute() for name, metric in self.dev_metrics().items()}
        values[f"{task}/loss"] = self.val_loss.compute()
        current = float(values[f"{task}/{f.metric}"])
        fitting = self.trainer.state.fn == "fit"  # not a later validation (of the quantized classifier)
        if fitting and not self.trainer.sanity_checking and (self.best is None or current > self.best):
            # the best validation's weights, which the run leaves (restore_best): kept on the CPU
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        self.best = current if self.best is None else max(self.best, current)
        values[f"{task}/best_{f.metric}"] = torch.tensor(self.best)
        for name, value in values.items():
            self.log(name, value, prog_bar=name == f"{task}/{f.metric}")
        for metric in (*self.dev_metrics().values(), self.val_loss):
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
    link = TeacherLink(d, teacher, teacher_cfg, student_cfg, at_needed=d.at_weight > 0)
    return FinetuneModule(cfg, pretrained, link)
