"""The model a span task (SQuAD) fine-tunes and keeps: an encoder and BERT's question-answering head,
one linear layer H -> 2 over every token (``qa_outputs``: start and end logits, the name
transformers' ``BertForQuestionAnswering`` gives it). ``SpanModel(batch)`` gives (B, T, 2) logits;
``SpanModel(batch, trace)`` records the encoder's internals (task distillation reads them)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ablate.lightning_modules.model.classifier import hidden_width
from ablate.lightning_modules.model.encoder import Encoder, Trace
from ablate.lightning_modules.model.heads import PretrainingModel


class SpanModel(nn.Module):
    """A pre-trained encoder with a start/end head.

    Args:
        encoder: the encoder (output width H).
        qa_outputs: Linear(H, 2): each token's start and end logit.
    """

    exits = None  # FastBERT's exits classify [CLS]: a span model has none

    def __init__(self, encoder: Encoder, qa_outputs: nn.Linear) -> None:
        super().__init__()
        self.encoder, self.qa_outputs = encoder, qa_outputs

    def forward(self, batch: dict[str, torch.Tensor], trace: Trace | None = None) -> torch.Tensor:
        """batch -> (B, T, 2) start and end logits; ``trace`` records the encoder's internals."""
        inputs = batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask")
        logits: torch.Tensor = self.qa_outputs(self.encoder(*inputs, trace))
        return logits


def new_span_head(width: int, init_std: float) -> nn.Linear:
    """A fresh ``qa_outputs``: Linear(H, 2), BERT's initialization."""
    head = nn.Linear(width, 2)
    nn.init.normal_(head.weight, std=init_std)
    nn.init.zeros_(head.bias)
    return head


def build_span_model(pretrained: PretrainingModel, init_std: float) -> SpanModel:
    """A copy of ``pretrained``'s encoder with a fresh start/end head (the pooler is not used)."""
    encoder = copy.deepcopy(pretrained.encoder)
    return SpanModel(encoder, new_span_head(hidden_width(encoder), init_std))


def span_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, 2) logits -> start and end logits (B, T) each, float, padding positions at -1e4 (no
    probability, yet finite, so that a distribution over positions compares with another's)."""
    start, end = logits.float().unbind(-1)
    if mask is not None:
        start, end = start.masked_fill(~mask, -1e4), end.masked_fill(~mask, -1e4)
    return start, end
