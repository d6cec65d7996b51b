"""Position-wise feed-forward: blocks take modules, the builder takes numbers."""

from __future__ import annotations

import torch
from torch import nn

from ablate.lightning_modules.model.components.norms import ACT2FN


class FeedForward(nn.Module):
    """``down(activation(up(x)))``."""

    def __init__(self, up: nn.Linear, down: nn.Linear, activation: nn.Module) -> None:
        super().__init__()
        self.up, self.down, self.activation = up, down, activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.down(self.activation(self.up(x)))  # (B, T, H) -> (B, T, F) -> (B, T, H)
        return y


def feed_forward(dim: int, ffn_dim: int, activation: str) -> FeedForward:
    """Build a feed-forward sub-layer ``dim -> ffn_dim -> dim``."""
    return FeedForward(nn.Linear(dim, ffn_dim), nn.Linear(ffn_dim, dim), ACT2FN[activation]())
