"""Pre-training heads and the model that joins them to the encoder."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ablate.lightning_modules.config.experiment import ObjectiveConfig, prediction_slots
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.model.components.norms import ACT2FN, NORM2FN
from ablate.lightning_modules.model.encoder import Encoder, Trace, build_encoder, init_weights


class MLMHead(nn.Module):
    """Transform, activation, norm, then a decoder tied to the V x E word embedding.

    Args:
        transform: H -> D linear (D = E for the factorized head, H for MobileBERT's).
        activation: activation module.
        norm: norm over D.
        vocab_size: V, for the output bias.
        extra: MobileBERT's extra decoder columns V x (D - E), or None when D = E.
    """

    def __init__(
        self,
        transform: nn.Linear,
        activation: nn.Module,
        norm: nn.Module,
        vocab_size: int,
        extra: nn.Parameter | None = None,
    ) -> None:
        super().__init__()
        self.transform, self.activation, self.norm = transform, activation, norm
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.extra = extra

    def transformed(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (N, H) -> (N, D): what the decoder reads (transform, activation, norm)."""
        h: torch.Tensor = self.norm(self.activation(self.transform(hidden)))
        return h

    def forward(self, hidden: torch.Tensor, word_weight: torch.Tensor) -> torch.Tensor:
        """hidden: (N, H) at masked positions only; word_weight: (V, E) -> logits (N, V)."""
        h = self.transformed(hidden)  # (N, D)
        decoder = word_weight if self.extra is None else torch.cat([word_weight, self.extra], dim=1)  # (V, D)
        return F.linear(h, decoder, self.bias)  # (N, V)


MLM_HEADS = {
    "factorized": lambda cfg: MLMHead(
        nn.Linear(cfg.hidden_dim, cfg.embed_dim),
        ACT2FN[cfg.activation](),
        NORM2FN[cfg.norm](cfg.embed_dim, cfg.norm_eps),
        cfg.vocab_size,
    ),
    "mobilebert": lambda cfg: MLMHead(
        nn.Linear(cfg.hidden_dim, cfg.hidden_dim),
        ACT2FN[cfg.activation](),
        nn.LayerNorm(cfg.hidden_dim, eps=cfg.norm_eps),
        cfg.vocab_size,
        nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_dim - cfg.embed_dim).normal_(std=cfg.init_std)),
    ),
}


class SentenceHead(nn.Module):
    """BERT's pooler (dense + tanh on [CLS]) and a 2-way classifier, for SOP or NSP."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.pooler = nn.Linear(cfg.hidden_dim, cfg.hidden_dim)
        self.classifier = nn.Linear(cfg.hidden_dim, 2)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        """cls: (B, H) -> logits (B, 2)."""
        logits: torch.Tensor = self.classifier(torch.tanh(self.pooler(cls)))
        return logits


@dataclass
class PretrainOutput:
    """Losses and the logits the metrics need.

    The MLM tensors have one row per prediction slot (:func:`prediction_slots`): the masked
    positions in row-major order, then padding slots whose target is -100 (``IGNORE``).
    """

    loss: torch.Tensor
    mlm_loss: torch.Tensor
    mlm_logits: torch.Tensor  # (K, V) at the K prediction slots
    mlm_targets: torch.Tensor  # (K,), -100 on padding slots
    cls: torch.Tensor | None = None  # (B, H): the last layer's [CLS] vectors
    sentence_loss: torch.Tensor | None = None
    sentence_logits: torch.Tensor | None = None  # (B, 2)

    @property
    def mlm_valid(self) -> torch.Tensor:
        """(K,) bool: the slots that hold a masked position."""
        return self.mlm_targets != IGNORE


IGNORE = -100


def masked_positions(labels: torch.Tensor, mask_prob: float) -> torch.Tensor:
    """labels (B, T), -100 where not selected -> (K,) indices into the flattened (B*T) positions:
    the selected ones in row-major order, then unselected ones as padding (K =
    :func:`prediction_slots`). A static shape for a given batch shape: no host sync, one graph."""
    slots = prediction_slots(labels.numel(), mask_prob)
    unselected = (labels.flatten() == IGNORE).to(torch.uint8)  # 0 first: the selected positions
    return torch.sort(unselected, stable=True).indices[:slots]


def mean_over_valid(losses: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of ``losses`` where ``valid``; 0 (not NaN) when nothing is valid."""
    return (losses * valid).sum() / valid.sum().clamp_min(1)


class PretrainingModel(nn.Module):
    """Encoder + MLM head + optional sentence head; the loss of one batch.

    Args:
        mask_prob: ``objective.mask_prob``, which sets the number of prediction slots.
    """

    def __init__(
        self,
        encoder: Encoder,
        mlm_head: MLMHead,
        sentence_head: SentenceHead | None,
        sentence_weight: float = 1.0,
        mask_prob: float = 0.15,
    ) -> None:
        super().__init__()
        self.encoder, self.mlm_head, self.sentence_head = encoder, mlm_head, sentence_head
        self.sentence_weight, self.mask_prob = sentence_weight, mask_prob

    @property
    def vocab_size(self) -> int:
        """V: the ids the MLM head predicts (the word embedding's rows)."""
        return self.encoder.embeddings.word.num_embeddings

    @property
    def max_tokens(self) -> int | None:
        """The longest input it reads: the position embedding's rows (None without position embeddings)."""
        position = self.encoder.embeddings.position
        return None if position is None else position.num_embeddings

    def masked_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The MLM head's logits at some positions of a batch: ``input_ids`` (B, T), token types 0,
        ``attention_mask`` (B, T) bool, ``rows`` (N,) indices into the flattened (B*T) positions ->
        (N, V) float32, on the model's device (the inputs are moved there)."""
        device = self.encoder.embeddings.word.weight.device
        ids, mask, rows = input_ids.to(device), attention_mask.to(device), rows.to(device)
        hidden = self.encoder(ids, torch.zeros_like(ids), mask, rows=rows)  # (N, H)
        return self.mlm_head(hidden, self.encoder.embeddings.word.weight).float()  # type: ignore[no-any-return]

    def forward(self, batch: dict[str, torch.Tensor], trace: Trace | None = None) -> PretrainOutput:
        """The losses of one batch; ``trace`` records the encoder's internals (distillation).

        Every shape is fixed by the batch shape (no boolean indexing): compiled, the forward and
        backward are one graph."""
        labels = batch["mlm_labels"]  # (B, T), -100 where not selected
        B, T = labels.shape
        positions = masked_positions(labels, self.mask_prob)  # (K,)
        targets = labels.flatten()[positions]  # (K,), -100 on padding slots
        inputs = batch["input_ids"], batch.get("token_type_ids"), batch.get("attention_mask")
        if trace is None:  # only the prediction slots and [CLS] go through the last layer's FFN
            first = torch.arange(B, device=labels.device) * T  # (B,) [CLS] of each row
            out_rows = self.encoder(*inputs, rows=torch.cat([positions, first]))  # (K + B, H)
            masked, cls = out_rows[: positions.numel()], out_rows[positions.numel() :]  # (K, H), (B, H)
        else:  # distillation reads every position of every layer
            hidden = self.encoder(*inputs, trace)  # (B, T, H)
            masked, cls = hidden.flatten(0, 1)[positions], hidden[:, 0]
        logits = self.mlm_head(masked, self.encoder.embeddings.word.weight)  # (K, V)
        per_slot = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="none")  # (K,)
        mlm_loss = mean_over_valid(per_slot, targets != IGNORE)
        out = PretrainOutput(loss=mlm_loss, mlm_loss=mlm_loss, mlm_logits=logits, mlm_targets=targets, cls=cls)
        if self.sentence_head is not None:
            out.sentence_logits = self.sentence_head(cls)  # (B, 2)
            out.sentence_loss = F.cross_entropy(
                out.sentence_logits.float(), batch["sentence_label"], ignore_index=IGNORE
            )
            out.loss = mlm_loss + self.sentence_weight * out.sentence_loss
        return out


def build_pretraining_model(model: ModelConfig, objective: ObjectiveConfig) -> PretrainingModel:
    """Encoder and heads for a pre-training objective."""
    encoder = build_encoder(model)
    mlm_head = MLM_HEADS[model.mlm_head](model)
    sentence_head = SentenceHead(model) if objective.sentence != "none" else None
    heads = nn.ModuleList([mlm_head] + ([sentence_head] if sentence_head else []))
    heads.apply(lambda m: init_weights(m, model.init_std))
    return PretrainingModel(encoder, mlm_head, sentence_head, objective.sentence_weight, objective.mask_prob)
