"""Distillation losses and the maps between student and teacher layers and heads.

Pure functions on tensors; :mod:`ablate.lightning_modules.methods.distill` decides which apply when.
Each loss is exactly zero when the student's tensors equal the teacher's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """For each student layer, the teacher layer it learns from: spread evenly, the last
    student layer on the last teacher layer (4 from 8 -> [1, 3, 5, 7]; equal depths -> identity)."""
    return [(i + 1) * teacher_layers // student_layers - 1 for i in range(student_layers)]


def head_map(student_heads: int, teacher_heads: int) -> list[list[int]]:
    """For each student head, the teacher heads whose distributions it matches (averaged).

    More teacher heads: consecutive groups (2 from 4 -> [[0, 1], [2, 3]]). More student
    heads: each teacher head serves several student heads (4 from 2 -> [[0], [0], [1], [1]]).
    Raises ValueError when neither count divides the other.
    """
    if teacher_heads % student_heads == 0:
        g = teacher_heads // student_heads
        return [list(range(h * g, (h + 1) * g)) for h in range(student_heads)]
    if student_heads % teacher_heads == 0:
        r = student_heads // teacher_heads
        return [[h // r] for h in range(student_heads)]
    raise ValueError(
        f"attention transfer needs one head count to divide the other: the student has "
        f"{student_heads} heads, the teacher {teacher_heads}"
    )


def _real(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """(B, T) float weights, 1 on real tokens."""
    if mask is None:
        return torch.ones(like.shape[:2], dtype=torch.float32, device=like.device)
    return mask.float()


def feature_map_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """FMT: mean squared error between (B, T, D) feature maps, over real tokens and features."""
    w = _real(mask, student)  # (B, T)
    sq = (student.float() - teacher.float()).pow(2).mean(dim=-1)  # (B, T)
    return (sq * w).sum() / w.sum().clamp_min(1.0)


def attention_loss(
    student_scores: torch.Tensor, teacher_scores: torch.Tensor, heads: list[list[int]], mask: torch.Tensor | None = None
) -> torch.Tensor:
    """AT: KL(teacher || student) between per-head attention distributions.

    Args:
        student_scores: (B, A_s, T, T) pre-softmax scores, padding keys at a large negative value.
        teacher_scores: (B, A_t, T, T) likewise.
        heads: :func:`head_map`; a student head matches the mean distribution of its teacher heads.
        mask: (B, T) bool, True on real tokens; padded query rows do not count.

    Returns:
        The KL summed over keys, averaged over student heads and real query positions.
    """
    s_log = F.log_softmax(student_scores.float(), dim=-1)  # (B, A_s, T, T)
    t_scores = teacher_scores.float()
    if all(len(g) == 1 for g in heads):  # one teacher head per student head: exact log-probs
        t_log = F.log_softmax(t_scores[:, [g[0] for g in heads]], dim=-1)  # (B, A_s, T, T)
    else:
        probs = F.softmax(t_scores, dim=-1)  # (B, A_t, T, T)
        t_log = torch.stack([probs[:, g].mean(dim=1) for g in heads], dim=1).clamp_min(1e-30).log()
    kl = F.kl_div(s_log, t_log, reduction="none", log_target=True)  # (B, A_s, T, T)
    w = _real(mask, student_scores[:, 0])  # (B, T)
    kl = (kl * w[:, None, None, :]).sum(dim=-1)  # (B, A_s, T): padding keys carry no probability
    return (kl.mean(dim=1) * w).sum() / w.sum().clamp_min(1.0)


def kd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """KD: KL(teacher || student) of the temperature-softened (N, V) MLM distributions, times T^2,
    averaged over the rows where ``valid`` ((N,) bool; None = every row), 0 when there are none."""
    s_log = F.log_softmax(student_logits.float() / temperature, dim=-1)
    t_log = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    per_row = F.kl_div(s_log, t_log, reduction="none", log_target=True).sum(dim=-1)  # (N,)
    if valid is None:
        valid = torch.ones_like(per_row, dtype=torch.bool)
    return (per_row * valid).sum() / valid.sum().clamp_min(1) * temperature**2


def attention_mse_loss(
    student_scores: torch.Tensor, teacher_scores: torch.Tensor, heads: list[list[int]], mask: torch.Tensor | None = None
) -> torch.Tensor:
    """AT as TinyBERT does it: MSE between the raw (pre-softmax) attention scores.

    Args:
        student_scores: (B, A_s, T, T) pre-softmax scores (padding keys at a large negative value).
        teacher_scores: (B, A_t, T, T) likewise; a student head matches the mean score of its
            teacher heads (:func:`head_map`).
        heads: :func:`head_map`.
        mask: (B, T) bool, True on real tokens; only real query-key pairs count (the padding
            keys' large negative values would otherwise dominate).

    Returns:
        The squared error averaged over student heads and real query-key pairs.
    """
    w = _real(mask, student_scores[:, 0])  # (B, T)
    real = (w[:, None, :, None] * w[:, None, None, :]) > 0  # (B, 1, T, T): real query and real key
    # padding keys hold the dtype's lowest value: zeroed before any arithmetic (their sums overflow)
    s = torch.where(real, student_scores.float(), 0.0)  # (B, A_s, T, T)
    t_all = torch.where(real, teacher_scores.float(), 0.0)  # (B, A_t, T, T)
    t = torch.stack([t_all[:, g].mean(dim=1) for g in heads], dim=1)  # (B, A_s, T, T)
    sq = (s - t).pow(2)  # (B, A_s, T, T), 0 off the real pairs
    return sq.sum() / (real.sum() * s.shape[1]).clamp_min(1)


def cosine_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """DistilBERT's cosine embedding loss: 1 - cos(student, teacher) of (B, T, D) hidden states,
    averaged over real tokens (0 when they point the same way)."""
    w = _real(mask, student)  # (B, T)
    cos = F.cosine_similarity(student.float(), teacher.float(), dim=-1)  # (B, T)
    return ((1.0 - cos) * w).sum() / w.sum().clamp_min(1.0)
