"""What the training step, its loss terms and a teacher link see of a model (the student's or a
teacher's): a pre-training model, a classifier or a span model, each an ``nn.Module``."""

from __future__ import annotations

from typing import Protocol

import torch

from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.encoder import Encoder, Trace
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.lightning_modules.model.span import SpanModel

Batch = dict[str, torch.Tensor]


class TaskModel(Protocol):
    """What the step and its terms see of a model, the student's or a teacher's: a pre-training
    model, a classifier or a span model (each an ``nn.Module``)."""

    @property
    def encoder(self) -> Encoder: ...

    def __call__(self, batch: Batch, trace: Trace | None = None) -> object: ...

    def requires_grad_(self, requires_grad: bool = True) -> object: ...


TeacherModel = PretrainingModel | Classifier | SpanModel
"""A teacher a student learns from: a pre-trained model, or a fine-tuned classifier or span model."""
