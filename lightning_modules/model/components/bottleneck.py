"""MobileBERT's bottleneck: linear in (H -> intra) and out (intra -> H) around a block."""

from __future__ import annotations

import torch
from torch import nn


class Projection(nn.Module):
    """``norm(linear(x))``: a bottleneck's way in."""

    def __init__(self, linear: nn.Linear, norm: nn.Module) -> None:
        super().__init__()
        self.linear, self.norm = linear, norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.norm(self.linear(x))
        return y


class Bottleneck(nn.Module):
    """The linear in/out of one block; the residual between blocks stays at width H.

    Args:
        enter: H -> intra projection (with norm): the block's residual stream.
        exit: intra -> H linear.
        exit_norm: norm after adding the block input back at width H.
        dropout: dropout on the exit projection.
        shared_qk: optional second H -> intra projection that Q and K read from
            (released MobileBERT); V then reads the H-wide block input.
        wide_attention: Q, K and V read the H-wide block input (IB-BERT).
    """

    def __init__(
        self,
        enter: Projection,
        exit: nn.Linear,
        exit_norm: nn.Module,
        dropout: nn.Module,
        shared_qk: Projection | None = None,
        wide_attention: bool = False,
    ) -> None:
        super().__init__()
        self.enter, self.exit, self.exit_norm, self.dropout = enter, exit, exit_norm, dropout
        self.shared_qk, self.wide_attention = shared_qk, wide_attention

    def attention_inputs(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tensors Q/K and (if separate) V read: x is the block input (B, T, H), h = enter(x)."""
        if self.shared_qk is not None:
            return self.shared_qk(x), x  # (B, T, intra), (B, T, H)
        return (x, None) if self.wide_attention else (h, None)

    def leave(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """h: (B, T, intra) block output; x: (B, T, H) block input -> (B, T, H)."""
        y: torch.Tensor = self.exit_norm(x + self.dropout(self.exit(h)))
        return y
