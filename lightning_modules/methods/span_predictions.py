"""A span task's predictions in the official SQuAD files (``predictions.json``, ``nbest_predictions.json``,
``null_odds.json``: what a run logs under ``predictions/`` and ``ablate predict`` writes), read from each dev
window's start and end logits. The formats: docs/guides/squad.md ("Predictions"). Torch-free: logits arrive as
numpy arrays."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ablate.datamodules.span_dev import SpanDev
from ablate.lightning_modules.config.yamlio import Json
from ablate.lightning_modules.methods.squad_metrics import best_answers

NO_SPAN = 1e30
"""A question's no-answer odds where no span qualifies (never answered at any threshold), as scored."""

Candidate = tuple[float, float, float, int, int, int]
"""(start + end logit, start logit, end logit, window, first context token, last context token)."""


@dataclass(frozen=True)
class SpanPredictions:
    """One dev pass's predictions, as the official files hold them."""

    answers: dict[str, str]
    nbest: dict[str, list[dict[str, Json]]]
    null_odds: dict[str, float] | None

    def files(self) -> dict[str, object]:
        """File name -> content: ``predictions.json``, ``nbest_predictions.json`` and (SQuAD 2.0) ``null_odds.json``."""
        out: dict[str, object] = {"predictions.json": self.answers, "nbest_predictions.json": self.nbest}
        if self.null_odds is not None:
            out["null_odds.json"] = self.null_odds
        return out

    def write(self, folder: Path) -> list[Path]:
        """The files written into ``folder`` (UTF-8 JSON, indented as BERT's ``run_squad.py`` writes them)."""
        written = []
        for name, content in self.files().items():
            path = folder / name
            path.write_text(json.dumps(content, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")
            written.append(path)
        return written


def _window_candidates(
    s: np.ndarray, e: np.ndarray, c: int, n: int, most: np.ndarray, n_best: int, max_answer: int
) -> list[tuple[float, float, int, int]]:
    """A window's ``n_best`` best (start, end) pairs that :func:`best_answers` would accept, best first."""
    k = min(n_best, len(s))
    starts, ends = np.argsort(-s, kind="stable")[:k], np.argsort(-e, kind="stable")[:k]
    i, j = starts[:, None] - c, ends[None, :] - c
    ok = (i >= 0) & (i < n) & (j >= 0) & (j < n) & (j >= i) & (j - i + 1 <= max_answer)
    ok &= most[np.clip(i, 0, max(n - 1, 0))] if n else False
    a, b = np.nonzero(ok)
    score = s[starts[a]] + e[ends[b]]
    order = np.argsort(-score, kind="stable")[:n_best]
    return [(float(s[starts[a[x]]]), float(e[ends[b[x]]]), int(i[a[x], 0]), int(j[0, b[x]])) for x in order]


def _entries(cands: list[Candidate], dev: SpanDev, q: int, n_best: int) -> list[dict[str, Json]]:
    """The ``n_best`` distinct texts of a question's candidates, best first, with their probabilities."""
    ref, spans = dev.references[q], dev.windows.spans
    seen: dict[str, tuple[float, float]] = {}
    for _, start, end, f, first, last in sorted(cands, key=lambda x: -x[0]):
        text = ref.context[int(spans[f][first, 0]) : int(spans[f][last, 1])] if f >= 0 else ""
        if text not in seen:
            seen[text] = (start, end)
        if len(seen) == n_best:
            break
    if not seen:  # no span qualifies (BERT's "empty")
        seen[""] = (0.0, 0.0)
    totals = [a + b for a, b in seen.values()]
    top = max(totals)
    weights = [math.exp(t - top) for t in totals]
    norm = sum(weights)
    return [
        {"text": text, "probability": w / norm, "start_logit": a, "end_logit": b}
        for (text, (a, b)), w in zip(seen.items(), weights, strict=True)
    ]


def span_predictions(
    dev: SpanDev, start_logits: Sequence[np.ndarray], end_logits: Sequence[np.ndarray], n_best: int, max_answer: int
) -> SpanPredictions:
    """The predictions of one pass over ``dev``'s windows (each window's (T,) start and end logits)."""
    w = dev.windows
    answers, diffs = best_answers(dev, start_logits, end_logits, n_best, max_answer)
    cands: list[list[Candidate]] = [[] for _ in dev.references]
    null: list[tuple[float, float, float]] = [(math.inf, 0.0, 0.0)] * len(dev.references)
    for f, (s, e) in enumerate(zip(start_logits, end_logits, strict=True)):
        q, c, n = int(w.example[f]), int(w.ctx_start[f]), len(w.spans[f])
        if float(s[0] + e[0]) < null[q][0]:
            null[q] = (float(s[0] + e[0]), float(s[0]), float(e[0]))
        for start, end, first, last in _window_candidates(s, e, c, n, w.max_context[f], n_best, max_answer):
            cands[q].append((start + end, start, end, f, first, last))
    nbest = {}
    for q, ref in enumerate(dev.references):
        if dev.no_answer and math.isfinite(null[q][0]):  # the no-answer candidate, among the others
            cands[q].append((null[q][0], null[q][1], null[q][2], -1, 0, 0))
        nbest[ref.id] = _entries(cands[q], dev, q, n_best)
    odds = {k: min(v, NO_SPAN) for k, v in diffs.items()} if dev.no_answer else None
    return SpanPredictions(answers, nbest, odds)
