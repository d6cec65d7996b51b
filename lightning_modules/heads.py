"""Pre-training heads and the model that joins them to the encoder."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.components.norms import ACT2FN, NORM2FN
from lightning_modules.config import ModelConfig, ObjectiveConfig
from lightning_modules.encoder import Encoder, Trace, build_encoder, init_weights


class MLMHead(nn.Module):
    """Transform, activation, norm, then a decoder tied to the V x E word embedding.

    Args:
        transform: H -> D linear (D = E for the factorized head, H for MobileBERT's).
        activation: activation module.
        norm: norm over D.
        vocab_size: V, for the output bias.
        extra: MobileBERT's extra decoder columns V x (D - E), or None when D = E.
    """

    def __init__(self, transform: nn.Linear, activation: nn.Module, norm: nn.Module, vocab_size: int,
                 extra: nn.Parameter | None = None) -> None:
        super().__init__()
        self.transform, self.activation, self.norm = transform, activation, norm
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.extra = extra

    def forward(self, hidden: torch.Tensor, word_weight: torch.Tensor) -> torch.Tensor:
        """hidden: (N, H) at masked positions only; word_weight: (V, E) -> logits (N, V)."""
        h = self.norm(self.activation(self.transform(hidden)))  # (N, D)
        decoder = word_weight if self.extra is None else torch.cat([word_weight, self.extra], dim=1)  # (V, D)
        return F.linear(h, decoder, self.bias)  # (N, V)


MLM_HEADS = {
    "factorized": lambda cfg: MLMHead(nn.Linear(cfg.hidden_dim, cfg.embed_dim), ACT2FN[cfg.activation](),
                                      NORM2FN[cfg.norm](cfg.embed_dim, cfg.norm_eps), cfg.vocab_size),
    "mobilebert": lambda cfg: MLMHead(nn.Linear(cfg.hidden_dim, cfg.hidden_dim), ACT2FN[cfg.activation](),
                                      nn.LayerNorm(cfg.hidden_dim, eps=cfg.norm_eps), cfg.vocab_size,
                                      nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_dim - cfg.embed_dim).normal_(std=cfg.init_std))),
}


class SentenceHead(nn.Module):
    """BERT's pooler (dense + tanh on [CLS]) and a 2-way classifier, for SOP or NSP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.pooler = nn.Linear(cfg.hidden_dim, cfg.hidden_dim)
        self.classifier = nn.Linear(cfg.hidden_dim, 2)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        """cls: (B, H) -> logits (B, 2)."""
        return self.classifier(torch.tanh(self.pooler(cls)))


@dataclass
class PretrainOutput:
    """Losses and the logits the metrics need."""

    loss: torch.Tensor
    mlm_loss: torch.Tensor
    mlm_logits: torch.Tensor  # (N, V) at masked positions
    mlm_targets: torch.Tensor  # (N,)
    cls: torch.Tensor | None = None  # (B, H): the last layer's [CLS] vectors
    sentence_loss: torch.Tensor | None = None
    sentence_logits: torch.Tensor | None = None  # (B, 2)


def _first_column(rows: torch.Tensor) -> torch.Tensor:
    """(B, T) bool, True in column 0 only ([CLS])."""
    first = torch.zeros_like(rows)
    first[:, 0] = True
    return first


class PretrainingModel(nn.Module):
    """Encoder + MLM head + optional sentence head; the loss of one batch."""

    def __init__(self, encoder: Encoder, mlm_head: MLMHead, sentence_head: SentenceHead | None,
                 sentence_weight: float = 1.0) -> None:
        super().__init__()
        self.encoder, self.mlm_head, self.sentence_head = encoder, mlm_head, sentence_head
        self.sentence_weight = sentence_weight

    def forward(self, batch: dict[str, torch.Tensor], trace: Trace | None = None) -> PretrainOutput:
        """The losses of one batch; ``trace`` records the encoder's internals (distillation)."""
        labels = batch["mlm_labels"]  # (B, T), -100 where not selected
        selected = labels != -100
        targets = labels[selected]  # (N,)
        if trace is None:  # only the masked rows and [CLS] go through the last layer's FFN
            rows = selected.clone()
            rows[:, 0] = True
            out_rows = self.encoder(batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"),
                                    rows=rows)  # (M, H), M = N + the [CLS] rows not selected
            masked, cls = out_rows[selected[rows]], out_rows[_first_column(rows)[rows]]  # (N, H), (B, H)
        else:  # distillation reads every position of every layer
            hidden = self.encoder(batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask"),
                                  trace)  # (B, T, H)
            masked, cls = hidden[selected], hidden[:, 0]
        logits = self.mlm_head(masked, self.encoder.embeddings.word.weight)  # (N, V): only masked rows
        # a batch with nothing selected (possible for tiny batches) gives a zero loss, not NaN
        mlm_loss = F.cross_entropy(logits.float(), targets) if targets.numel() else logits.sum() * 0.0
        out = PretrainOutput(loss=mlm_loss, mlm_loss=mlm_loss, mlm_logits=logits, mlm_targets=targets, cls=cls)
        if self.sentence_head is not None:
            out.sentence_logits = self.sentence_head(cls)  # (B, 2)
            out.sentence_loss = F.cross_entropy(out.sentence_logits.float(), batch["sentence_label"], ignore_index=-100)
            out.loss = mlm_loss + self.sentence_weight * out.sentence_loss
        return out


def build_pretraining_model(model: ModelConfig, objective: ObjectiveConfig) -> PretrainingModel:
    """Encoder and heads for a pre-training objective."""
    encoder = build_encoder(model)
    mlm_head = MLM_HEADS[model.mlm_head](model)
    sentence_head = SentenceHead(model) if objective.sentence != "none" else None
    heads = nn.ModuleList([mlm_head] + ([sentence_head] if sentence_head else []))
    heads.apply(lambda m: init_weights(m, model.init_std))
    return PretrainingModel(encoder, mlm_head, sentence_head, objective.sentence_weight)
