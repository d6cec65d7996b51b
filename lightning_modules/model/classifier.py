"""The classifier a fine-tuning run trains and keeps: an encoder, BERT's classification head and,
for FastBERT, an exit head after every layer but the last.

``Classifier(batch)`` gives the final head's logits; ``Classifier(batch, trace)`` records the
encoder's internals (task distillation reads them, the exits read ``trace.hidden``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ablate.lightning_modules.model.encoder import Encoder, Trace
from ablate.lightning_modules.model.heads import PretrainingModel


class ClassificationHead(nn.Module):
    """``classifier(dropout(tanh(pooler(h_cls))))``."""

    def __init__(self, pooler: nn.Linear, classifier: nn.Linear, dropout: float) -> None:
        super().__init__()
        self.pooler, self.classifier, self.dropout = pooler, classifier, nn.Dropout(dropout)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        """cls: (B, H) -> logits (B, C)."""
        logits: torch.Tensor = self.classifier(self.dropout(torch.tanh(self.pooler(cls))))
        return logits


class Classifier(nn.Module):
    """A pre-trained encoder with a classification head (and, optionally, FastBERT's exits).

    Args:
        encoder: the encoder (output width H).
        head: the final classification head.
        exits: one head per layer but the last (layer i's exit reads layer i's [CLS]), or None.
    """

    def __init__(self, encoder: Encoder, head: ClassificationHead, exits: nn.ModuleList | None = None) -> None:
        super().__init__()
        self.encoder, self.head, self.exits = encoder, head, exits

    @property
    def num_labels(self) -> int:
        return int(self.head.classifier.out_features)

    def forward(self, batch: dict[str, torch.Tensor], trace: Trace | None = None) -> torch.Tensor:
        """batch -> logits (B, C) of the final head; ``trace`` records the encoder's internals."""
        inputs = batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask")
        hidden = self.encoder(*inputs, trace)  # (B, T, H)
        logits: torch.Tensor = self.head(hidden[:, 0])  # (B, C)
        return logits


def hidden_width(encoder: Encoder) -> int:
    """H, read off the encoder (the width of its output)."""
    emb = encoder.embeddings
    if emb.projection is not None:
        return int(emb.projection.out_features)
    return int(emb.trigram.linear.out_features if emb.trigram is not None else emb.word.embedding_dim)


def new_head(
    width: int, num_labels: int, dropout: float, init_std: float, pooler: nn.Linear | None = None
) -> ClassificationHead:
    """A classification head on H-wide [CLS] vectors: ``pooler`` (a fresh one when None) and a fresh classifier."""
    if pooler is None:
        pooler = nn.Linear(width, width)
        nn.init.normal_(pooler.weight, std=init_std)
        nn.init.zeros_(pooler.bias)
    classifier = nn.Linear(pooler.out_features, num_labels)
    nn.init.normal_(classifier.weight, std=init_std)
    nn.init.zeros_(classifier.bias)
    return ClassificationHead(pooler, classifier, dropout)


def build_classifier(pretrained: PretrainingModel, num_labels: int, dropout: float, init_std: float) -> Classifier:
    """A copy of ``pretrained``'s encoder with a fresh classifier (and its pooler, when it has one)."""
    sentence = pretrained.sentence_head
    pooler = copy.deepcopy(sentence.pooler) if sentence is not None else None
    encoder = copy.deepcopy(pretrained.encoder)
    return Classifier(encoder, new_head(hidden_width(encoder), num_labels, dropout, init_std, pooler))
