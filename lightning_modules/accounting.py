"""Parameters and FLOPs of a model, counted the same way for every architecture.

Counting rule:
- ``backbone`` = embeddings (word, position, token type, embedding norm, E->H projection)
  + encoder blocks; no pooler, no pre-training heads. Shared modules count once.
- ``heads`` = the MLM head (transform, norm, output bias; its decoder is tied to the word
  embedding and not counted again) + the sentence head (pooler + classifier).
- ``paper_count`` = backbone + pooler: the rule behind the ALBERT paper's and Hugging
  Face's published counts (both keep the pooler in the model).
- ``flops_per_token``: forward multiply-adds x 2 of the backbone's matrix products for one
  token in a sequence of ``seq_len`` tokens (every Linear, bottlenecks and the trigram
  projection included, plus attention scores QK^T and AV); a shared layer costs as much
  as an unshared one, since it still runs L times. Element-wise work is not counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch import nn

from lightning_modules.config import ModelConfig, ObjectiveConfig
from lightning_modules.encoder import Encoder
from lightning_modules.heads import PretrainingModel, build_pretraining_model


def count(module: nn.Module | None) -> int:
    """Unique parameters of a module (shared tensors once)."""
    return 0 if module is None else sum(p.numel() for p in module.parameters())


@dataclass(frozen=True)
class ParamReport:
    """What ``ablate params`` prints."""

    backbone: int
    embedding: int
    encoder: int
    heads: int
    mlm_head: int
    sentence_head: int
    pooler: int  # the pooler's size, counted in heads only when the sentence head exists
    paper_count: int
    flops_per_token: int
    seq_len: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def linear_flops(module: nn.Module) -> int:
    """FLOPs per token of every Linear inside ``module`` (2 per multiply-add)."""
    return sum(2 * m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def flops_per_token(encoder: Encoder, seq_len: int) -> int:
    """Forward FLOPs per token of the backbone, walking the layer plan (shared layers run L times)."""
    total = linear_flops(encoder.embeddings)
    for step in encoder.plan:
        attn = encoder.attentions[step.attention]
        heads = attn.inner
        total += linear_flops(attn) + 2 * seq_len * heads.num_heads * (heads.qk_dim + heads.v_dim)  # + QK^T, AV
        total += linear_flops(encoder.ffn_stacks[step.ffn])
        if len(encoder.bottlenecks):
            total += linear_flops(encoder.bottlenecks[step.bottleneck])
    return total


def param_report(model: PretrainingModel, cfg: ModelConfig, seq_len: int = 128) -> ParamReport:
    """Count a built model's parameters by part."""
    embedding = count(model.encoder.embeddings)
    backbone = count(model.encoder)
    pooler = cfg.hidden_dim * cfg.hidden_dim + cfg.hidden_dim  # dense H -> H (+ bias), present or not
    mlm = count(model.mlm_head)
    sentence = count(model.sentence_head)
    return ParamReport(
        backbone=backbone,
        embedding=embedding,
        encoder=backbone - embedding,
        heads=mlm + sentence,
        mlm_head=mlm,
        sentence_head=sentence,
        pooler=pooler,
        paper_count=backbone + pooler,
        flops_per_token=flops_per_token(model.encoder, seq_len),
        seq_len=seq_len,
    )


def report_for(cfg: ModelConfig, objective: ObjectiveConfig | None = None, seq_len: int = 128) -> ParamReport:
    """Build the model on the meta device (no memory, instant even for xxlarge) and count it."""
    import torch

    with torch.device("meta"):
        model = build_pretraining_model(cfg, objective or ObjectiveConfig())
    return param_report(model, cfg, seq_len)
