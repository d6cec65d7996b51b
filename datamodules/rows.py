"""Rows stored flat (``ids[offsets[i]:offsets[i+1]]``, token type 1 from ``first[i]`` on), a batch of them
taken at once: what a DataLoader's batched fetch (``__getitems__``) hands a collate, which pads them with a
few array operations instead of a few per row (the fine-tuning loop's host time per step)."""

from __future__ import annotations

from typing import Generic, TypeVar

import numpy as np
import torch

S = TypeVar("S")


class Rows(Generic[S]):
    """Rows ``index`` of ``split`` (a split stored flat), taken together."""

    def __init__(self, split: S, index: list[int]) -> None:
        self.split, self.index = split, np.asarray(index, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.index)


def longest(offsets: np.ndarray, index: np.ndarray) -> int:
    """The longest of rows ``index``, in tokens."""
    return int((offsets[index + 1] - offsets[index]).max())


def padded(
    ids: np.ndarray, offsets: np.ndarray, first: np.ndarray, index: np.ndarray, width: int, pad_id: int
) -> dict[str, torch.Tensor]:
    """``input_ids``, ``token_type_ids`` (B, width) long and ``attention_mask`` (B, width) bool of rows
    ``index``, padded with ``pad_id``: gathered by row starts and lengths."""
    starts = offsets[index]
    lengths = offsets[index + 1] - starts  # (B,)
    positions = np.arange(width)[None, :]  # (1, T)
    mask = positions < lengths[:, None]  # (B, T)
    gathered = ids[np.minimum(starts[:, None] + positions, len(ids) - 1)]  # (B, T)
    types = (positions >= first[index][:, None]) & mask
    return {
        "input_ids": torch.from_numpy(np.where(mask, gathered, pad_id).astype(np.int64)),
        "token_type_ids": torch.from_numpy(types.astype(np.int64)),
        "attention_mask": torch.from_numpy(mask),
    }
