"""Dynamic masking for masked-language modelling (pure, vectorised torch): positions selected by
``token``, ``whole_word`` or ALBERT's ``ngram`` strategy, then BERT's 80/10/10 rule; labels hold the
original ids there and -100 elsewhere, and special positions are never selected (docs/data.md,
"The pre-training pipeline")."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import torch

from ablate.lightning_modules.config.experiment import prediction_slots

Strategy = Literal["token", "whole_word", "ngram"]
IGNORE_INDEX = -100
NUM_SPECIAL = 5  # [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0..4


def ngram_probs(max_ngram: int) -> list[float]:
    """p(n) ∝ 1/n for n = 1..max_ngram (ALBERT's n-gram length distribution)."""
    weights = [1.0 / n for n in range(1, max_ngram + 1)]
    total = sum(weights)
    return [w / total for w in weights]


@lru_cache(maxsize=64)
def ngram_start_rate(prob: float, max_ngram: int) -> float:
    """Per-word span-start probability q giving expected word coverage ``prob``.

    A word is covered unless no span starting j words before it (j = 0..N-1) is long
    enough to reach it: coverage(q) = 1 - prod_j (1 - q * P(n > j)); solved by bisection.
    """
    probs = ngram_probs(max_ngram)
    survival = [sum(probs[j:]) for j in range(max_ngram)]  # P(n > j)

    def coverage(q: float) -> float:
        miss = 1.0
        for s in survival:
            miss *= 1.0 - q * s
        return 1.0 - miss

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if coverage(mid) < prob else (lo, mid)
    return (lo + hi) / 2


def _word_index(word_starts: torch.Tensor) -> torch.Tensor:
    """Index of the word each token belongs to (0 before the first word start)."""
    return (word_starts.long().cumsum(dim=1) - 1).clamp_(min=0)


def _select_ngrams(
    shape: torch.Size, prob: float, max_ngram: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Covered words (B, W): spans of n ~ p(n) words starting at rate q per word."""
    rate = ngram_start_rate(prob, max_ngram)
    starts = torch.rand(shape, generator=generator, device=device) < rate
    cdf = torch.tensor(ngram_probs(max_ngram), device=device).cumsum(0)
    cdf[-1] = 1.0
    u = torch.rand(shape, generator=generator, device=device)
    lengths = torch.searchsorted(cdf, u.contiguous()) + 1  # n in 1..max_ngram
    covered = torch.zeros(shape, dtype=torch.bool, device=device)
    width = shape[1]
    for j in range(min(max_ngram, width)):
        reach = starts & (lengths > j)
        covered[:, j:] |= reach[:, : width - j]
    return covered


def select_positions(
    special_mask: torch.Tensor,
    prob: float,
    strategy: Strategy,
    max_ngram: int,
    generator: torch.Generator,
    word_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Positions selected for prediction, (B, T) bool; never a special position.

    Args:
        special_mask: (B, T) bool, True at ``[CLS]``, ``[SEP]``, ``[PAD]``.
        prob: expected fraction of non-special tokens selected.
        strategy: ``token``, ``whole_word`` or ``ngram``.
        max_ngram: longest span in words for ``ngram``.
        generator: source of randomness.
        word_starts: (B, T) bool, True where a token is not a ``##`` continuation; None
            treats every token as a word.
    """
    candidates = ~special_mask
    shape, device = special_mask.shape, special_mask.device
    if strategy == "token":
        return (torch.rand(shape, generator=generator, device=device) < prob) & candidates
    if strategy not in ("whole_word", "ngram"):
        raise ValueError(f"objective.masking: unknown strategy {strategy!r}")
    starts = candidates.clone() if word_starts is None else candidates & word_starts
    after_special = torch.ones_like(special_mask)
    after_special[:, 1:] = special_mask[:, :-1]
    starts |= candidates & after_special  # a segment never begins mid-word
    if strategy == "whole_word":
        chosen_words = torch.rand(shape, generator=generator, device=device) < prob
    else:
        chosen_words = _select_ngrams(shape, prob, max_ngram, generator, device)
    return chosen_words.gather(1, _word_index(starts)) & candidates


def cap_selection(selected: torch.Tensor, limit: int, generator: torch.Generator) -> torch.Tensor:
    """``selected`` (B, T) with at most ``limit`` True positions in all: when there are more,
    a random ``limit`` of them are kept (the generator is not used otherwise)."""
    if int(selected.sum()) <= limit:
        return selected
    score = torch.rand(selected.shape, generator=generator, device=selected.device).masked_fill_(~selected, -1.0)
    keep = torch.zeros(selected.numel(), dtype=torch.bool, device=selected.device)
    keep[score.flatten().topk(limit).indices] = True
    return keep.view_as(selected)


def mask_tokens(
    input_ids: torch.Tensor,
    special_mask: torch.Tensor,
    vocab_size: int,
    mask_id: int,
    prob: float,
    strategy: Strategy,
    max_ngram: int,
    generator: torch.Generator,
    word_starts: torch.Tensor | None = None,
    *,
    num_special: int = NUM_SPECIAL,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamically mask a batch for MLM.

    Args:
        input_ids: (B, T) long token ids.
        special_mask: (B, T) bool, True where a token must never be masked.
        vocab_size: random replacement ids are drawn from [num_special, vocab_size).
        mask_id: id of ``[MASK]``.
        prob: expected fraction of non-special tokens selected for prediction.
        strategy: ``token``, ``whole_word`` or ``ngram``.
        max_ngram: longest n-gram (in words) for ``ngram``.
        generator: torch generator, the only source of randomness.
        word_starts: (B, T) bool, True at the first piece of each word (needed by
            ``whole_word`` and ``ngram``; None = every token is a word).
        num_special: special tokens occupy ids [0, num_special); never drawn at random.

    Returns:
        ``(masked_ids, labels)``: the corrupted ids, and labels equal to the original id
        at selected positions and -100 elsewhere. At most
        :func:`~ablate.lightning_modules.config.experiment.prediction_slots` positions are selected in the batch.
    """
    selected = select_positions(special_mask, prob, strategy, max_ngram, generator, word_starts)
    selected = cap_selection(selected, prediction_slots(selected.numel(), prob), generator)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    random_ids = torch.randint(
        num_special, vocab_size, input_ids.shape, generator=generator, device=input_ids.device, dtype=input_ids.dtype
    )
    masked = torch.where(selected & (action < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    masked = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, masked)
    return masked, labels
