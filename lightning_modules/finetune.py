"""``FinetuneModule``: GLUE-style classification on a pre-trained encoder.

The encoder comes from a pre-trained model; the head is BERT's (pooler dense + tanh on
[CLS], dropout, classifier), its pooler initialised from the pre-trained sentence head's
when there is one. Dev metrics (torchmetrics): accuracy, macro F1 and Matthews
correlation, logged as ``<task>/accuracy``, ``<task>/f1``, ``<task>/mcc`` and
``<task>/loss``; the best value of ``finetune.metric`` so far as ``<task>/best_<metric>``.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassMatthewsCorrCoef

from ablate.lightning_modules.classifier import build_classifier
from ablate.lightning_modules.config import ExperimentConfig
from ablate.lightning_modules.heads import PretrainingModel
from ablate.lightning_modules.pretrain import adamw, clip_gradients, param_groups, use_tensor_cores, warmup_linear_decay


class FinetuneModule(pl.LightningModule):
    """Fine-tuning regime: cross-entropy on the labels, dev metrics for early stopping.

    Args:
        cfg: the run's config (``finetune`` says the task and schedule).
        pretrained: the pre-trained model; its encoder is copied, so it stays unchanged.
    """

    loss_name = "fine-tuning loss"

    def __init__(self, cfg: ExperimentConfig, pretrained: PretrainingModel) -> None:
        super().__init__()
        self.cfg, f = cfg, cfg.finetune
        self.model = build_classifier(pretrained, f.num_labels, cfg.model.dropout, cfg.model.init_std)
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

    def restore_best(self) -> None:
        """Load the weights of the best validation so far (early stopping's choice) into the model."""
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self.model(batch).float(), batch["labels"])
        self.log("train/loss", loss, batch_size=batch["labels"].shape[0])
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        logits = self.model(batch)
        self.val_loss.update(F.cross_entropy(logits.float(), batch["labels"]), weight=batch["labels"].shape[0])
        for metric in self.metrics.values():
            metric.update(logits, batch["labels"])

    def on_validation_epoch_end(self) -> None:
        task, f = self.cfg.finetune.task, self.cfg.finetune
        values = {f"{task}/{name}": metric.compute() for name, metric in self.metrics.items()}
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
        for metric in (*self.metrics.values(), self.val_loss):
            metric.reset()

    def on_fit_start(self) -> None:
        use_tensor_cores(self.device)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        f = self.cfg.finetune
        optimizer = adamw(
            param_groups(self.model, self.cfg.optim.weight_decay),
            lr=f.lr,
            eps=self.cfg.optim.eps,
            precision=self.cfg.trainer.precision,
        )
        schedule = warmup_linear_decay(type(self.cfg.optim)(warmup_steps=max(1, f.max_steps // 10)), f.max_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
