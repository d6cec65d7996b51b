"""The encoder: embeddings and a stack of post-norm transformer blocks.

Cross-layer sharing is resolved in one place, :func:`layer_plan`: the encoder keeps only
the unique attention and feed-forward modules, and the plan says which of them layer i
runs. Shared layers are therefore the same tensors, and their gradients accumulate.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_modules.components.attention import attention
from lightning_modules.components.embeddings import Embeddings
from lightning_modules.components.ffn import feed_forward
from lightning_modules.components.norms import NORM2FN, dropout
from lightning_modules.config import ModelConfig

# sharing mode -> (share attention across layers, share feed-forward stacks across layers)
SHARES: dict[str, tuple[bool, bool]] = {
    "none": (False, False),
    "all": (True, True),
    "attn": (True, False),
    "ffn": (False, True),
}


def layer_plan(num_layers: int, sharing: str) -> list[tuple[int, int]]:
    """For each layer, the index of its attention and of its feed-forward stack."""
    share_attn, share_ffn = SHARES[sharing]
    return [(0 if share_attn else i, 0 if share_ffn else i) for i in range(num_layers)]


class Residual(nn.Module):
    """Post-norm residual sub-layer: ``norm(x + dropout(inner(x, ...)))`` (BERT/ALBERT)."""

    def __init__(self, inner: nn.Module, norm: nn.Module, drop: nn.Module) -> None:
        super().__init__()
        self.inner, self.norm, self.dropout = inner, norm, drop

    def forward(self, x: torch.Tensor, *args: torch.Tensor | None) -> torch.Tensor:
        return self.norm(x + self.dropout(self.inner(x, *args)))


class Encoder(nn.Module):
    """Embeddings, then L blocks of one attention and F feed-forward sub-layers each.

    Args:
        embeddings: the embedding module (output width H).
        attentions: the unique attention sub-layers.
        ffn_stacks: the unique stacks of F feed-forward sub-layers.
        plan: per layer, (attention index, feed-forward stack index).
    """

    def __init__(self, embeddings: Embeddings, attentions: nn.ModuleList, ffn_stacks: nn.ModuleList,
                 plan: list[tuple[int, int]]) -> None:
        super().__init__()
        self.embeddings, self.attentions, self.ffn_stacks = embeddings, attentions, ffn_stacks
        self.plan = plan

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: (B, T); attention_mask: (B, T) bool, True on real tokens -> (B, T, H)."""
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            mask = attention_mask[:, None, None, :]  # (B, 1, 1, T): padding keys are not attended
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        for a, f in self.plan:
            x = self.attentions[a](x, mask)
            for sublayer in self.ffn_stacks[f]:
                x = sublayer(x)
        return x


def init_weights(module: nn.Module, std: float) -> None:
    """BERT initialisation: normal(0, std) weights, zero biases, unit norms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def build_embeddings(cfg: ModelConfig) -> Embeddings:
    """Embeddings from the config's numbers."""
    E, H = cfg.embed_dim, cfg.hidden_dim
    return Embeddings(
        word=nn.Embedding(cfg.vocab_size, E, padding_idx=0),
        position=nn.Embedding(cfg.max_position, E) if cfg.position == "learned" else None,
        token_type=nn.Embedding(cfg.token_types, E) if cfg.token_types > 0 else None,
        norm=NORM2FN[cfg.norm](E, cfg.norm_eps) if cfg.embed_norm else nn.Identity(),
        dropout=dropout(cfg.dropout),
        projection=nn.Linear(E, H) if E != H else None,
    )


def build_encoder(cfg: ModelConfig) -> Encoder:
    """Build the encoder described by ``cfg``, with sharing resolved by :func:`layer_plan`."""
    H = cfg.hidden_dim
    plan = layer_plan(cfg.num_layers, cfg.sharing)

    def sublayer(inner: nn.Module) -> Residual:
        return Residual(inner, NORM2FN[cfg.norm](H, cfg.norm_eps), dropout(cfg.dropout))

    n_attn = 1 + max(a for a, _ in plan)
    n_ffn = 1 + max(f for _, f in plan)
    attentions = nn.ModuleList(
        sublayer(attention(H, cfg.num_heads, cfg.head_dim, cfg.head_dim, cfg.dropout)) for _ in range(n_attn)
    )
    ffn_stacks = nn.ModuleList(
        nn.ModuleList(sublayer(feed_forward(H, cfg.ffn_dim, cfg.activation)) for _ in range(cfg.num_ffn))
        for _ in range(n_ffn)
    )
    encoder = Encoder(build_embeddings(cfg), attentions, ffn_stacks, plan)
    encoder.apply(lambda m: init_weights(m, cfg.init_std))
    return encoder
