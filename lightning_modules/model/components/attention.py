"""Multi-head self-attention on ``scaled_dot_product_attention``.

Q and K may read from a different tensor than V (the released MobileBERT reads Q and K
from a narrow shared bottleneck and V from the wide block input). When all three read
from one tensor the projection is fused into one matrix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _explicit_is_faster(q: torch.Tensor) -> bool:
    """bf16 on CPU: PyTorch's flash-attention kernel for CPU is 3x slower in bf16 than two
    batched matmuls and a softmax (B=16, A=4, T=128, k=64: 18.8 ms against 6.1 ms forward
    and backward on 2 AVX-512-BF16 cores; in fp32 the kernel is the faster, 11.1 against 14.9)."""
    return q.dtype == torch.bfloat16 and q.device.type == "cpu"


class MultiHeadAttention(nn.Module):
    """Self-attention over ``num_heads`` heads of query/key width ``qk_dim`` and value width ``v_dim``.

    Args:
        qkv: fused projection ``in -> A * (2k + v)`` when Q, K, V share their input; else
            the ``in -> A * 2k`` projection of Q and K.
        v: the separate value projection ``in_v -> A * v``, or None when fused.
        out: output projection ``A * v -> out``.
        num_heads: heads A.
        qk_dim: per-head query/key width k.
        v_dim: per-head value width v (schuBERT lets k != v).
        dropout_p: dropout on attention probabilities (training only).
    """

    def __init__(
        self,
        qkv: nn.Linear,
        v: nn.Linear | None,
        out: nn.Linear,
        num_heads: int,
        qk_dim: int,
        v_dim: int,
        dropout_p: float = 0.0,
    ) -> None:
        super().__init__()
        self.qkv, self.v, self.out = qkv, v, out
        self.num_heads, self.qk_dim, self.v_dim = num_heads, qk_dim, v_dim
        self.dropout_p = dropout_p

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        x_v: torch.Tensor | None = None,
        keep: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x: (B, T, D) for Q and K (and V when fused); x_v: (B, T, D_v) for a separate V;
        mask: (B, 1, 1, T) bool, True = attend, or None for no padding -> (B, T, out).

        With ``keep`` (attention transfer needs the distributions), attention is computed
        explicitly and its scores (B, A, T, T), padding keys at the dtype's minimum, are
        appended to ``keep``; otherwise it runs on ``scaled_dot_product_attention``."""
        B, T, _ = x.shape
        A, k, v = self.num_heads, self.qk_dim, self.v_dim
        if self.v is None:
            q, key, val = self.qkv(x).split([A * k, A * k, A * v], dim=-1)  # (B, T, A*k) x2, (B, T, A*v)
        else:
            q, key = self.qkv(x).split([A * k, A * k], dim=-1)  # (B, T, A*k) x2
            val = self.v(x if x_v is None else x_v)  # (B, T, A*v)
        q = q.view(B, T, A, k).transpose(1, 2)  # (B, A, T, k)
        key = key.view(B, T, A, k).transpose(1, 2)  # (B, A, T, k)
        val = val.view(B, T, A, v).transpose(1, 2)  # (B, A, T, v)
        p = self.dropout_p if self.training else 0.0
        if keep is None and not _explicit_is_faster(q):
            y = F.scaled_dot_product_attention(q, key, val, attn_mask=mask, dropout_p=p)  # (B, A, T, v)
        else:
            scores = q @ key.transpose(-2, -1) / math.sqrt(k)  # (B, A, T, T)
            if mask is not None:
                scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            if keep is not None:
                keep.append(scores)
            y = F.dropout(scores.softmax(dim=-1), p) @ val  # (B, A, T, v)
        result: torch.Tensor = self.out(y.transpose(1, 2).reshape(B, T, A * v))  # (B, T, out)
        return result


def attention(
    dim: int,
    num_heads: int,
    qk_dim: int,
    v_dim: int,
    dropout_p: float,
    out_dim: int | None = None,
    v_in_dim: int | None = None,
) -> MultiHeadAttention:
    """Build attention from numbers: Q, K (and V) read ``dim``-wide input; a separate V
    projection reads ``v_in_dim``-wide input when given; the output is ``out_dim`` (= dim)."""
    out = nn.Linear(num_heads * v_dim, out_dim or dim)
    if v_in_dim is None:
        return MultiHeadAttention(
            nn.Linear(dim, num_heads * (2 * qk_dim + v_dim)), None, out, num_heads, qk_dim, v_dim, dropout_p
        )
    return MultiHeadAttention(
        nn.Linear(dim, num_heads * 2 * qk_dim),
        nn.Linear(v_in_dim, num_heads * v_dim),
        out,
        num_heads,
        qk_dim,
        v_dim,
        dropout_p,
    )
