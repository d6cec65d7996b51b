"""Norms and activations, picked from dicts by config name (as transformers' NORM2FN)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class NoNorm(nn.Module):
    """MobileBERT's NoNorm: an element-wise affine ``h * gamma + beta``, no statistics."""

    def __init__(self, dim: int, eps: float = 0.0) -> None:  # eps kept for a LayerNorm-like signature
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias


NORM2FN: dict[str, Callable[[int, float], nn.Module]] = {
    "layer_norm": lambda dim, eps: nn.LayerNorm(dim, eps=eps),
    "no_norm": lambda dim, eps: NoNorm(dim),
}

ACT2FN: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "relu": nn.ReLU,
}


def dropout(p: float) -> nn.Module:
    """A dropout module, or Identity when ``p == 0`` (no module, no mask memory)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()
