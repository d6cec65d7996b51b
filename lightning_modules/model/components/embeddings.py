"""Embeddings: word (+ trigram projection), position and token type, norm, dropout, E -> H.

``plain`` (BERT/ALBERT): the sum is taken at width E, normed, then projected to H when
E != H. ``trigram`` (MobileBERT): the word embeddings of t+1, t and t-1 are concatenated
(3E) and projected to H first; position and token type are then added at H.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Trigram(nn.Module):
    """``linear([e(t+1), e(t), e(t-1)])``: 3E -> H (zero beyond the sequence ends)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        """e: (B, T, E) -> (B, T, H)."""
        nxt = F.pad(e[:, 1:], (0, 0, 0, 1))  # e(t+1), zero at the end
        prev = F.pad(e[:, :-1], (0, 0, 1, 0))  # e(t-1), zero at the start
        y: torch.Tensor = self.linear(torch.cat([nxt, e, prev], dim=-1))  # (B, T, 3E) -> (B, T, H)
        return y


class Embeddings(nn.Module):
    """Sum of the optional embeddings, norm, dropout, optional projection to the hidden width.

    Args:
        word: V x E word embedding (the MLM decoder is tied to it).
        trigram: trigram projection applied to the word embeddings, or None.
        position: learned position embedding (at the width of the sum), or None.
        token_type: token-type embedding (at the width of the sum), or None.
        norm: norm over the sum (Identity when the embedding norm is off).
        dropout: dropout module (Identity when off).
        projection: E -> H linear for a plain embedding with E != H, else None.
    """

    def __init__(
        self,
        word: nn.Embedding,
        trigram: Trigram | None,
        position: nn.Embedding | None,
        token_type: nn.Embedding | None,
        norm: nn.Module,
        dropout: nn.Module,
        projection: nn.Linear | None,
    ) -> None:
        super().__init__()
        self.word, self.trigram = word, trigram
        self.position, self.token_type = position, token_type
        self.norm, self.dropout, self.projection = norm, dropout, projection

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None, words: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids, token_type_ids: (B, T) -> (B, T, H).

        ``words`` (B, T, E), when given, are the word vectors in place of ``word(input_ids)`` (a
        distillation teacher reading a student's vocabulary through a bridge); ``input_ids`` then
        only gives the shape."""
        x: torch.Tensor = self.word(input_ids) if words is None else words  # (B, T, E)
        if self.trigram is not None:
            x = self.trigram(x)  # (B, T, H)
        if self.position is not None:
            x = x + self.position.weight[: input_ids.shape[1]]  # (T, D) broadcast over B
        if self.token_type is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            x = x + self.token_type(types)
        x = self.dropout(self.norm(x))
        if self.projection is not None:
            x = self.projection(x)  # (B, T, H)
        return x
