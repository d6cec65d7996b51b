"""FastBERT's early exit (Liu et al. 2020), the model side: an exit classifier (BERT's pooler head,
:func:`build_exits`) after every layer but the last, trained from the final classifier by
self-distillation (:func:`self_distillation_loss`); at inference an example leaves at the first layer
whose normalized entropy is below the ``speed`` threshold (:func:`predict_early_exit`). Measuring it:
:mod:`ablate.lightning_modules.measure.exit_speed` (docs/guides/fastbert.md)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ablate.lightning_modules.model.classifier import Classifier, new_head
from ablate.lightning_modules.model.encoder import Trace

Batch = dict[str, torch.Tensor]


def build_exits(width: int, num_layers: int, num_labels: int, dropout: float, init_std: float) -> nn.ModuleList:
    """L-1 exit heads, one per layer but the last, each a fresh pooler (H -> H, tanh) and classifier
    (H -> C) on its layer's [CLS] vector: (B, H) -> (B, C)."""
    return nn.ModuleList(new_head(width, num_labels, dropout, init_std) for _ in range(num_layers - 1))


def _exits(model: Classifier) -> nn.ModuleList:
    L = len(model.encoder.plan)
    if model.exits is None or len(model.exits) != L - 1:
        have = "none" if model.exits is None else str(len(model.exits))
        raise ValueError(f"the model needs {L - 1} exits (one per layer but the last), has {have}")
    return model.exits


def exit_logits(model: Classifier, batch: Batch) -> list[torch.Tensor]:
    """Every layer's logits in one forward: ``[exit_0(h_0), ..., exit_{L-2}(h_{L-2}), head(h_{L-1})]``,
    each (B, C), h_i = layer i's [CLS] vector (B, H). The last equals ``model(batch)``."""
    exits = _exits(model)
    trace = Trace(attention=frozenset())  # no attention scores: the same kernels as a plain forward
    model(batch, trace)
    cls = [h[:, 0] for h in trace.hidden]  # L x (B, H)
    out = [exit_head(c) for exit_head, c in zip(exits, cls[:-1], strict=True)]
    return [*out, model.head(cls[-1])]


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """FastBERT's uncertainty: the entropy of ``softmax(logits)`` over log C, in [0, 1]:
    logits (B, C) -> (B,); 0 = one-hot, 1 = uniform."""
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, C)
    entropy = -(logp.exp() * logp).sum(dim=-1)  # (B,)
    return (entropy / math.log(logits.shape[-1])).clamp(0.0, 1.0)


def row_entropy(logits: torch.Tensor) -> float:
    """:func:`normalized_entropy` of one row (1, C), computed on the host from one read of its C
    values: at batch 1 the dozen small tensor operations cost more than the arithmetic."""
    values = logits[0].tolist()
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    entropy = -sum(e / total * math.log(e / total) for e in exps if e > 0.0)
    return min(max(entropy / math.log(len(values)), 0.0), 1.0)


def self_distillation_loss(student_logits: list[torch.Tensor], teacher_logits: torch.Tensor) -> torch.Tensor:
    """FastBERT's self-distillation loss: the sum over exits of KL(teacher || student) between the
    softmax distributions, each averaged over the batch (``batchmean``); the teacher is detached.

    (The paper writes the KL with the student first; its released code, like this, computes
    ``KLDivLoss(log p_student, p_teacher)`` = KL(p_teacher || p_student).)

    Args:
        student_logits: the exits' logits, each (B, C).
        teacher_logits: the final classifier's logits (B, C).

    Returns:
        A scalar, 0 when every exit equals the teacher. No host sync.
    """
    teacher = F.log_softmax(teacher_logits.detach().float(), dim=-1)  # (B, C)
    losses = [
        F.kl_div(F.log_softmax(s.float(), dim=-1), teacher, reduction="batchmean", log_target=True)
        for s in student_logits
    ]
    return torch.stack(losses).sum() if losses else teacher.new_zeros(())


def predict_early_exit(model: Classifier, batch_one: Batch, speed: float) -> tuple[torch.Tensor, int]:
    """Early exit for one example (batch of 1): embeddings, then layer by layer; after layer i < L-1
    its exit's logits, and the example leaves if their normalized entropy is below ``speed``.

    The attention mask and token types are used as :meth:`Encoder.forward` uses them; the layers
    after the exit are not run. At ``speed`` <= 0 no exit is evaluated: every layer runs and the
    logits are the final head's, exactly ``model(batch_one)``'s. Runs under inference mode; put
    the model in eval mode first (dropout).

    Args:
        model: the classifier (with ``exits`` unless ``speed`` <= 0).
        batch_one: ``input_ids`` (1, T), optional ``token_type_ids`` (1, T), ``attention_mask`` (1, T).
        speed: the entropy threshold in [0, 1].

    Returns:
        The logits (1, C) of the layer it left at and the number of layers run (1..L).
    """
    ids = batch_one["input_ids"]  # (1, T)
    if ids.shape[0] != 1:
        raise ValueError(f"predict_early_exit takes one example (batch of 1), got batch {ids.shape[0]}")
    encoder = model.encoder
    exits = _exits(model) if speed > 0 else None
    attention_mask = batch_one.get("attention_mask")
    mask = None if attention_mask is None else attention_mask[:, None, None, :]  # (1, 1, 1, T), once
    last = len(encoder.plan) - 1
    with torch.inference_mode():
        x = encoder.embeddings(ids, batch_one.get("token_type_ids"))  # (1, T, H)
        for i, step in enumerate(encoder.plan):
            x = encoder.block(x, step, mask)  # (1, T, H)
            if exits is not None and i < last:
                logits: torch.Tensor = exits[i](x[:, 0])  # (1, C), the [CLS] row only
                if row_entropy(logits) < speed:  # the one host read per layer
                    return logits, i + 1
        final: torch.Tensor = model.head(x[:, 0])  # (1, C)
    return final, last + 1
