"""Masking statistics: fraction selected, 80/10/10, specials, whole words, n-gram spans."""

from __future__ import annotations

import pytest
import torch

from ablate.datamodules.masking import cap_selection, mask_tokens, ngram_probs, ngram_start_rate
from ablate.lightning_modules.config.experiment import prediction_slots

VOCAB, MASK, PAD, CLS, SEP = 1000, 4, 0, 2, 3


def _batch(seed: int = 0, rows: int = 256, width: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ids with [CLS] A [SEP] B [SEP] [PAD]..., and random word starts."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, width), generator=g)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=g)
    for i, n in enumerate(lengths.tolist()):
        ids[i, 0], ids[i, n // 2], ids[i, n - 1] = CLS, SEP, SEP
        ids[i, n:] = PAD
    special = (ids == PAD) | (ids == CLS) | (ids == SEP)
    word_starts = torch.rand((rows, width), generator=g) < 0.6  # ~1.7 pieces per word
    return ids, special, word_starts


def _mask(strategy: str, seed: int = 1, prob: float = 0.15, **kw):  # type: ignore[no-untyped-def]
    ids, special, starts = _batch(**kw)
    g = torch.Generator().manual_seed(seed)
    masked, labels = mask_tokens(ids, special, VOCAB, MASK, prob, strategy, 3, g, starts)  # type: ignore[arg-type]
    return ids, special, starts, masked, labels


def _words(starts: torch.Tensor, special: torch.Tensor) -> list[list[list[int]]]:
    """Per row, the token positions of each word (pieces up to the next start/special)."""
    out = []
    for row_start, row_special in zip(starts.tolist(), special.tolist(), strict=True):
        words: list[list[int]] = []
        for t, (s, sp) in enumerate(zip(row_start, row_special, strict=True)):
            if sp:
                continue
            if s or not words or row_special[t - 1]:
                words.append([t])
            else:
                words[-1].append(t)
        out.append(words)
    return out


@pytest.mark.parametrize("strategy", ["token", "whole_word", "ngram"])
def test_fraction_and_80_10_10(strategy: str) -> None:
    ids, special, _, masked, labels = _mask(strategy)
    selected = labels != -100
    fraction = selected.sum().item() / (~special).sum().item()
    assert abs(fraction - 0.15) < 0.01, fraction
    assert torch.equal(labels[selected], ids[selected])
    n = selected.sum().item()
    as_mask = (masked[selected] == MASK).sum().item() / n
    kept = (masked[selected] == ids[selected]).sum().item() / n
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.02  # random ids may equal the original
    random_ids = masked[selected & (masked != MASK) & (masked != ids)]
    assert abs(random_ids.numel() / n - 0.1) < 0.02
    assert (random_ids >= 5).all() and (random_ids < VOCAB).all()
    assert torch.equal(masked[~selected], ids[~selected])


@pytest.mark.parametrize("strategy", ["token", "whole_word", "ngram"])
def test_specials_never_masked(strategy: str) -> None:
    ids, special, _, masked, labels = _mask(strategy, prob=0.9)
    assert (labels[special] == -100).all()
    assert torch.equal(masked[special], ids[special])


@pytest.mark.parametrize("strategy", ["whole_word", "ngram"])
def test_whole_words_only(strategy: str) -> None:
    _, special, starts, _, labels = _mask(strategy, rows=64)
    selected = (labels != -100).tolist()
    words = _words(starts, special)
    pieces = 0
    for row, row_words in zip(selected, words, strict=True):
        for word in row_words:
            flags = {row[t] for t in word}
            assert len(flags) == 1, "a word is partly masked"
            pieces += len(word) > 1 and row[word[0]]
    assert pieces > 0  # multi-piece words were masked whole


def _run_lengths(strategy: str) -> list[int]:
    """Lengths (in words) of maximal runs of consecutive masked words."""
    _, special, starts, _, labels = _mask(strategy, rows=256)
    runs: list[int] = []
    for row_sel, row_words in zip((labels != -100).tolist(), _words(starts, special), strict=True):
        run = 0
        for word in row_words + [[None]]:  # sentinel ends the last run
            if word[0] is not None and row_sel[word[0]]:
                run += 1
            elif run:
                runs.append(run)
                run = 0
    return runs


def test_ngram_span_lengths() -> None:
    ngram, single = _run_lengths("ngram"), _run_lengths("whole_word")
    counts = [sum(r == n for r in ngram) for n in (1, 2, 3)]
    assert counts[0] > counts[1] > counts[2] > 0  # p(n) ∝ 1/n, longer runs rarer
    mean_ngram, mean_single = sum(ngram) / len(ngram), sum(single) / len(single)
    assert mean_ngram > 1.4 > mean_single  # spans of 1..3 words vs independent words (~1.18)


def test_ngram_rate_solves_coverage() -> None:
    assert ngram_probs(3) == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    q = ngram_start_rate(0.15, 3)
    miss = 1.0
    for j in range(3):
        miss *= 1 - q * sum(ngram_probs(3)[j:])
    assert 1 - miss == pytest.approx(0.15, abs=1e-9)
    assert ngram_start_rate(0.15, 1) == pytest.approx(0.15)


def test_same_generator_seed_same_masks() -> None:
    a, b = _mask("ngram", seed=7), _mask("ngram", seed=7)
    assert torch.equal(a[3], b[3]) and torch.equal(a[4], b[4])
    c = _mask("ngram", seed=8)
    assert not torch.equal(a[4], c[4])


def test_cap_keeps_a_random_subset_of_the_selection():
    """The model's MLM head has a static number of rows (prediction_slots); a batch that selects
    more keeps a random subset of that size."""
    assert prediction_slots(16 * 128, 0.15) == 384 and prediction_slots(32, 0.5) == 24
    g = torch.Generator().manual_seed(0)
    selected = torch.rand(8, 64, generator=g) < 0.5
    capped = cap_selection(selected, 40, g)
    assert int(capped.sum()) == 40 and not (capped & ~selected).any()
    assert cap_selection(selected, 1000, g) is selected  # under the cap: untouched, no draw
    again = cap_selection(selected, 40, torch.Generator().manual_seed(1))
    assert not torch.equal(again, capped)  # which ones are dropped is random, not the first ones
