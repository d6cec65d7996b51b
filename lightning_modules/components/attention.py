"""Multi-head self-attention with a fused QKV projection and ``scaled_dot_product_attention``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    """Self-attention over ``num_heads`` heads of query/key width ``qk_dim`` and value width ``v_dim``.

    Args:
        qkv: fused projection ``in -> num_heads * (2 * qk_dim + v_dim)``.
        out: output projection ``num_heads * v_dim -> out``.
        num_heads: heads A.
        qk_dim: per-head query/key width k.
        v_dim: per-head value width v (schuBERT lets k != v).
        dropout_p: dropout on attention probabilities (training only).
    """

    def __init__(self, qkv: nn.Linear, out: nn.Linear, num_heads: int, qk_dim: int, v_dim: int,
                 dropout_p: float = 0.0) -> None:
        super().__init__()
        self.qkv, self.out = qkv, out
        self.num_heads, self.qk_dim, self.v_dim = num_heads, qk_dim, v_dim
        self.dropout_p = dropout_p

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, H); mask: (B, 1, 1, T) bool, True = attend, or None for no padding."""
        B, T, _ = x.shape
        A, k, v = self.num_heads, self.qk_dim, self.v_dim
        q, key, val = self.qkv(x).split([A * k, A * k, A * v], dim=-1)  # (B, T, A*k) x2, (B, T, A*v)
        q = q.view(B, T, A, k).transpose(1, 2)  # (B, A, T, k)
        key = key.view(B, T, A, k).transpose(1, 2)  # (B, A, T, k)
        val = val.view(B, T, A, v).transpose(1, 2)  # (B, A, T, v)
        p = self.dropout_p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, key, val, attn_mask=mask, dropout_p=p)  # (B, A, T, v)
        return self.out(y.transpose(1, 2).reshape(B, T, A * v))  # (B, T, H)


def attention(dim: int, num_heads: int, qk_dim: int, v_dim: int, dropout_p: float) -> MultiHeadAttention:
    """Build attention from numbers: ``dim`` in and out."""
    qkv = nn.Linear(dim, num_heads * (2 * qk_dim + v_dim))
    out = nn.Linear(num_heads * v_dim, dim)
    return MultiHeadAttention(qkv, out, num_heads, qk_dim, v_dim, dropout_p)
