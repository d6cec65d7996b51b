"""SQuAD's answers and scores: :func:`best_answers` (the best span of each question's windows mapped back to its
context's characters: BERT's n-best post-processing), :func:`evaluate_v1` and :func:`evaluate_v2` (the official
EM and F1, to the last digit) and :func:`span_metrics` (what a span task logs; :data:`V2_LOGGED`). The rules:
docs/guides/squad.md ("Windows and answers", "Metrics"). Torch-free: logits arrive as numpy arrays."""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Mapping, Sequence

import numpy as np

from ablate.datamodules.span_dev import Reference, SpanDev

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """The official normalization: lowercase, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def exact_score(gold: str, pred: str) -> int:
    """1 when the normalized texts are equal."""
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_v1(gold: str, pred: str) -> float:
    """``evaluate-v1.1.py``'s ``f1_score``: token F1 of the normalized texts (0 when none is shared)."""
    pred_toks, gold_toks = normalize_answer(pred).split(), normalize_answer(gold).split()
    same = sum((collections.Counter(pred_toks) & collections.Counter(gold_toks)).values())
    if same == 0:
        return 0
    precision, recall = 1.0 * same / len(pred_toks), 1.0 * same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def f1_v2(gold: str, pred: str) -> float:
    """``evaluate-v2.0.py``'s ``compute_f1``: as :func:`f1_v1`, but an empty side scores 1 when both are."""
    gold_toks, pred_toks = _tokens(gold), _tokens(pred)
    same = sum((collections.Counter(gold_toks) & collections.Counter(pred_toks)).values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if same == 0:
        return 0
    precision, recall = 1.0 * same / len(pred_toks), 1.0 * same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def evaluate_v1(references: Sequence[Reference], predictions: Mapping[str, str]) -> dict[str, float]:
    """``evaluate-v1.1.py``: ``exact_match`` and ``f1`` in percent, each question's best over its
    references; a question without a prediction scores 0."""
    exact = f1 = 0.0
    for ref in references:
        if ref.id not in predictions:
            continue
        pred = predictions[ref.id]
        exact += max(exact_score(g, pred) for g in ref.answers)
        f1 += max(f1_v1(g, pred) for g in ref.answers)
    total = len(references)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def _best_thresh(
    preds: Mapping[str, str], scores: Mapping[str, float], na_probs: Mapping[str, float], has_ans: Mapping[str, bool]
) -> tuple[float, float]:
    """``find_best_thresh``: the best score over no-answer thresholds, and that threshold."""
    cur = best = float(sum(1 for k in has_ans if not has_ans[k]))
    thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        diff = scores[qid] if has_ans[qid] else (-1 if preds[qid] else 0)
        cur += diff
        if cur > best:
            best, thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores), thresh


def _mean(scores: Mapping[str, float], ids: Sequence[str]) -> float:
    return 100.0 * sum(scores[k] for k in ids) / len(ids)


def evaluate_v2(
    references: Sequence[Reference],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """``evaluate-v2.0.py``: ``exact``, ``f1`` and ``total``; ``HasAns_*`` and ``NoAns_*`` where there are
    such questions; with ``na_probs``, ``best_exact``/``best_f1`` and their thresholds (a question is
    predicted unanswerable when its ``na_prob`` is above the threshold). Every question needs a prediction."""
    has_ans = {ref.id: any(normalize_answer(a) for a in ref.answers) for ref in references}
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    for ref in references:
        golds = [a for a in ref.answers if normalize_answer(a)] or [""]
        pred = predictions[ref.id]
        exact_raw[ref.id] = max(exact_score(a, pred) for a in golds)
        f1_raw[ref.id] = max(f1_v2(a, pred) for a in golds)
    probs = na_probs if na_probs is not None else dict.fromkeys(predictions, 0.0)

    def thresholded(scores: dict[str, float]) -> dict[str, float]:
        return {k: float(not has_ans[k]) if probs[k] > na_prob_thresh else s for k, s in scores.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    out: dict[str, float] = {
        "exact": 100.0 * sum(exact.values()) / len(exact),
        "f1": 100.0 * sum(f1.values()) / len(f1),
        "total": len(exact),
    }
    for name, answerable in (("HasAns", True), ("NoAns", False)):
        ids = [k for k in has_ans if has_ans[k] == answerable]
        if ids:
            out |= {f"{name}_exact": _mean(exact, ids), f"{name}_f1": _mean(f1, ids), f"{name}_total": len(ids)}
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _best_thresh(predictions, exact_raw, na_probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = _best_thresh(predictions, f1_raw, na_probs, has_ans)
    return out


V2_LOGGED = {
    "best_exact": "exact",
    "best_f1": "f1",
    "best_exact_thresh": "exact_thresh",
    "best_f1_thresh": "f1_thresh",
    "exact": "exact_at0",
    "f1": "f1_at0",
    "HasAns_exact": "HasAns_exact",
    "HasAns_f1": "HasAns_f1",
    "NoAns_exact": "NoAns_exact",
    "NoAns_f1": "NoAns_f1",
}
"""SQuAD 2.0: ``evaluate-v2.0.py``'s key -> the name logged under ``<task>/``. ``exact`` and ``f1`` are
its ``best_exact`` and ``best_f1`` (the no-answer threshold chosen on the dev set, as BERT reports
SQuAD 2.0), ``*_thresh`` those thresholds; ``*_at0`` and ``HasAns``/``NoAns`` are at threshold 0
(BERT's ``null_score_diff_threshold``). ``best_`` is not kept: ``<task>/best_f1`` is ablate's best validation."""
_THRESHOLDS = ("best_exact_thresh", "best_f1_thresh")


def best_answers(
    dev: SpanDev, start_logits: Sequence[np.ndarray], end_logits: Sequence[np.ndarray], n_best: int, max_answer: int
) -> tuple[dict[str, str], dict[str, float]]:
    """Each question's predicted answer text and its no-answer score difference (null score minus the
    best span's; ``inf`` where no span qualifies), from each window's (T,) start and end logits.

    With ``dev.no_answer`` a question whose difference is above 0 is predicted unanswerable (``""``);
    otherwise it always gets its best span (``""`` only where no span qualifies)."""
    w = dev.windows
    best: list[tuple[float, int, int, int]] = [(-np.inf, -1, 0, 0)] * len(dev.references)
    null = np.full(len(dev.references), np.inf)
    for f, (s, e) in enumerate(zip(start_logits, end_logits, strict=True)):
        q, c, n = int(w.example[f]), int(w.ctx_start[f]), len(w.spans[f])
        null[q] = min(null[q], float(s[0] + e[0]))
        k = min(n_best, len(s))
        starts, ends = np.argsort(-s, kind="stable")[:k], np.argsort(-e, kind="stable")[:k]
        i, j = starts[:, None] - c, ends[None, :] - c  # context token indices
        ok = (i >= 0) & (i < n) & (j >= 0) & (j < n) & (j >= i) & (j - i + 1 <= max_answer)
        ok &= w.max_context[f][np.clip(i, 0, max(n - 1, 0))] if n else False
        if not ok.any():
            continue
        score = np.where(ok, s[starts][:, None] + e[ends][None, :], -np.inf)
        a, b = np.unravel_index(int(np.argmax(score)), score.shape)
        if float(score[a, b]) > best[q][0]:
            best[q] = (float(score[a, b]), f, int(i[a, 0]), int(j[0, b]))
    answers: dict[str, str] = {}
    diffs: dict[str, float] = {}
    for q, ref in enumerate(dev.references):
        top, window, first, last = best[q]
        text = "" if window < 0 else ref.context[int(w.spans[window][first, 0]) : int(w.spans[window][last, 1])]
        diffs[ref.id] = float(null[q] - top) if window >= 0 else float("inf")
        answers[ref.id] = "" if dev.no_answer and diffs[ref.id] > 0.0 else text
    return answers, diffs


def span_metrics(dev: SpanDev, answers: Mapping[str, str], diffs: Mapping[str, float]) -> dict[str, float]:
    """A span task's dev metrics by name (under ``<task>/``), fractions as ablate logs them: SQuAD 1.1
    ``exact`` and ``f1``; SQuAD 2.0 (``dev.no_answer``) :data:`V2_LOGGED`'s, thresholds as they are."""
    if not dev.no_answer:
        v1 = evaluate_v1(dev.references, answers)
        return {"exact": v1["exact_match"] / 100.0, "f1": v1["f1"] / 100.0}
    finite = {k: min(v, 1e30) for k, v in diffs.items()}  # no span at all: never answered at any threshold
    v2 = evaluate_v2(dev.references, answers, finite)
    return {name: v2[k] if k in _THRESHOLDS else v2[k] / 100.0 for k, name in V2_LOGGED.items() if k in v2}
