"""Token + position + token-type embeddings at width E, then the E -> H projection (ALBERT)."""

from __future__ import annotations

import torch
from torch import nn


class Embeddings(nn.Module):
    """Sum of the optional embeddings, norm, dropout, optional projection to the hidden width.

    Args:
        word: V x E word embedding (the MLM decoder is tied to it).
        position: learned position embedding, or None.
        token_type: token-type embedding, or None.
        norm: norm over E (Identity when the embedding norm is off).
        dropout: dropout module (Identity when off).
        projection: E -> H linear when E != H, else None.
    """

    def __init__(self, word: nn.Embedding, position: nn.Embedding | None, token_type: nn.Embedding | None,
                 norm: nn.Module, dropout: nn.Module, projection: nn.Linear | None) -> None:
        super().__init__()
        self.word, self.position, self.token_type = word, position, token_type
        self.norm, self.dropout, self.projection = norm, dropout, projection

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, token_type_ids: (B, T) -> (B, T, H)."""
        x = self.word(input_ids)  # (B, T, E)
        if self.position is not None:
            x = x + self.position.weight[: input_ids.shape[1]]  # (T, E) broadcast over B
        if self.token_type is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x = x + self.token_type(types)
        x = self.dropout(self.norm(x))
        return x if self.projection is None else self.projection(x)  # (B, T, H)
