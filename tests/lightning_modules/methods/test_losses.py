"""Distillation losses and the student/teacher layer and head maps."""

from __future__ import annotations

import pytest
import torch

from ablate.lightning_modules.methods.losses import (
    attention_loss,
    attention_mse_loss,
    cosine_loss,
    feature_map_loss,
    head_map,
    kd_loss,
    layer_map,
)


@pytest.mark.parametrize(
    ("student", "teacher", "expected"),
    [
        (4, 4, [0, 1, 2, 3]),
        (4, 8, [1, 3, 5, 7]),
        (3, 12, [3, 7, 11]),
        (2, 24, [11, 23]),
        (1, 5, [4]),
    ],
)
def test_layer_map_spreads_evenly_and_ends_on_the_last_layer(student, teacher, expected):
    assert layer_map(student, teacher) == expected


@pytest.mark.parametrize(
    ("student", "teacher", "expected"),
    [
        (4, 4, [[0], [1], [2], [3]]),
        (2, 4, [[0, 1], [2, 3]]),
        (1, 3, [[0, 1, 2]]),
        (4, 2, [[0], [0], [1], [1]]),
    ],
)
def test_head_map_groups_or_shares_teacher_heads(student, teacher, expected):
    assert head_map(student, teacher) == expected


def test_head_map_refuses_counts_that_do_not_divide():
    with pytest.raises(ValueError, match="3 heads, the teacher 4"):
        head_map(3, 4)


def _mask(B: int = 2, T: int = 6) -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4:] = False
    return mask


def _scores(B: int, A: int, T: int, mask: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, A, T, T, generator=g)
    return scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)


def test_feature_map_loss_is_zero_for_equal_maps_and_ignores_padding():
    mask = _mask()
    x = torch.randn(2, 6, 8)
    assert feature_map_loss(x, x.clone(), mask).item() == 0.0
    y = x.clone()
    y[1, 5] += 100.0  # a padded position: does not count
    assert feature_map_loss(x, y, mask).item() == 0.0
    y[0, 0, 0] += 2.0  # one feature of one real token: squared error 4, averaged over 8 features and 10 tokens
    assert feature_map_loss(x, y, mask).item() == pytest.approx(4.0 / 8 / mask.sum().item())


def test_attention_loss_zero_for_equal_distributions_positive_otherwise():
    mask = _mask()
    t = _scores(2, 4, 6, mask, 0)
    assert attention_loss(t.clone(), t, head_map(4, 4), mask).item() == 0.0
    s = _scores(2, 4, 6, mask, 1)
    loss = attention_loss(s, t, head_map(4, 4), mask)
    assert torch.isfinite(loss) and loss.item() > 0


def test_attention_loss_matches_the_mean_of_grouped_teacher_heads():
    mask = _mask()
    t = _scores(2, 4, 6, mask, 0)  # 4 teacher heads, 2 student heads
    probs = t.softmax(-1)
    mean = torch.stack([probs[:, [0, 1]].mean(1), probs[:, [2, 3]].mean(1)], dim=1)  # (B, 2, T, T)
    student = mean.clamp_min(1e-30).log().masked_fill(~mask[:, None, None, :], torch.finfo(t.dtype).min)
    assert attention_loss(student, t, head_map(2, 4), mask).item() == pytest.approx(0.0, abs=1e-6)
    # matching only the first head of each group is not the same distribution
    wrong = t[:, [0, 2]]
    assert attention_loss(wrong, t, head_map(2, 4), mask).item() > 1e-3


def test_attention_loss_with_more_student_heads_repeats_teacher_heads():
    mask = _mask()
    t = _scores(2, 2, 6, mask, 3)
    student = t[:, [0, 0, 1, 1]]
    assert attention_loss(student, t, head_map(4, 2), mask).item() == 0.0
    assert attention_loss(t[:, [0, 1, 0, 1]], t, head_map(4, 2), mask).item() > 0


def test_kd_loss_zero_for_equal_logits_positive_otherwise_and_scaled_by_t_squared():
    t = torch.randn(5, 30)
    assert kd_loss(t.clone(), t, 2.0).item() == 0.0
    s = torch.randn(5, 30)
    at1 = kd_loss(s, t, 1.0)
    assert at1.item() > 0
    manual = (t.softmax(-1) * (t.log_softmax(-1) - s.log_softmax(-1))).sum(-1).mean()
    assert at1.item() == pytest.approx(manual.item(), rel=1e-5)
    assert kd_loss(s[:0], t[:0]).item() == 0.0  # no masked positions in the batch


def test_attention_mse_compares_raw_scores_on_real_pairs_only():
    torch.manual_seed(0)
    t = torch.randn(2, 4, 5, 5)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    heads = head_map(2, 4)
    grouped = torch.stack([t[:, [0, 1]].mean(1), t[:, [2, 3]].mean(1)], dim=1)
    assert attention_mse_loss(grouped, t, heads, mask).item() == pytest.approx(0.0, abs=1e-12)
    noisy = grouped.clone()
    noisy[1, :, 3:, :] += 100.0  # padded queries: not counted
    noisy[1, :, :, 3:] += 100.0  # padded keys: not counted
    assert attention_mse_loss(noisy, t, heads, mask).item() == pytest.approx(0.0, abs=1e-12)
    shifted = grouped + 1.0
    assert attention_mse_loss(shifted, t, heads, mask).item() == pytest.approx(1.0, rel=1e-6)
    # as the attention records them: padding keys at the dtype's lowest value, in student and teacher
    low = torch.finfo(torch.float32).min
    keys = mask[:, None, None, :]
    masked_t, masked_s = t.masked_fill(~keys, low), shifted.masked_fill(~keys, low)
    assert attention_mse_loss(masked_s, masked_t, heads, mask).item() == pytest.approx(1.0, rel=1e-6)


def test_cosine_loss_is_zero_for_parallel_states_and_two_for_opposite_ones():
    torch.manual_seed(0)
    h = torch.randn(2, 3, 8)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert cosine_loss(2.0 * h, h, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert cosine_loss(-h, h, mask).item() == pytest.approx(2.0, rel=1e-6)
    wild = h.clone()
    wild[1, 1:] = -h[1, 1:]  # padding: not counted
    assert cosine_loss(wild, h, mask).item() == pytest.approx(0.0, abs=1e-6)
