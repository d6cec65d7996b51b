"""SQuAD's prediction files from windows built by hand: the scored answers, BERT's n-best (distinct texts
over every window, best first, softmax probabilities, SQuAD 2.0's no-answer among them) and the null odds."""

from __future__ import annotations

import json
import math

import numpy as np

from ablate.datamodules.span_dev import Reference, SpanDev, Windows
from ablate.lightning_modules.methods.span_predictions import NO_SPAN, span_predictions
from ablate.lightning_modules.methods.squad_metrics import best_answers


def _dev(no_answer: bool) -> SpanDev:
    """Two questions: "q" reads "aa bb cc dd ee ff" in two overlapping windows; "r" reads "xx" in one."""
    spans = np.array([[0, 2], [3, 5], [6, 8], [9, 11], [12, 14], [15, 17]])
    windows = Windows(
        example=np.array([0, 0, 1]),
        ctx_start=np.array([4, 4, 4]),
        spans=[spans[0:4], spans[2:6], spans[0:1]],
        max_context=[np.array([True, True, True, False]), np.array([False, True, True, True]), np.array([True])],
    )
    refs = [Reference("q", "aa bb cc dd ee ff", ("cc dd",)), Reference("r", "xx", ())]
    return SpanDev(refs, windows, no_answer)


def _logits() -> tuple[list[np.ndarray], list[np.ndarray]]:
    starts, ends = [np.zeros(9), np.zeros(9), np.zeros(6)], [np.zeros(9), np.zeros(9), np.zeros(6)]
    starts[1][4 + 1], ends[1][4 + 2] = 5.0, 5.0  # window 2: "dd ee", 10
    starts[0][4 + 2], ends[0][4 + 2] = 4.0, 4.0  # window 1: "cc", 8; "cc dd" 4 + 0 ...
    starts[0][0], ends[0][0] = 3.0, 3.0  # [CLS] of window 1: 6 (window 2's: 0, the least)
    starts[2][0], ends[2][0] = 2.0, 1.0  # "r": [CLS] 3
    starts[2][4], ends[2][4] = 1.0, 1.0  # its one token: 2
    return starts, ends


def test_the_files_hold_the_scored_answers_the_n_best_and_the_null_odds(tmp_path):
    dev = _dev(no_answer=True)
    starts, ends = _logits()
    out = span_predictions(dev, starts, ends, n_best=4, max_answer=5)
    answers, diffs = best_answers(dev, starts, ends, 4, 5)
    assert out.answers == answers == {"q": "dd ee", "r": ""}  # "r": no answer wins (3 > 2)
    assert out.null_odds == {"q": 0.0 - 10.0, "r": 3.0 - 2.0} == diffs
    q = out.nbest["q"]
    # the spans among each window's 4 best starts and ends, best first, then the no-answer (window 2's [CLS]: 0 + 0)
    assert [e["text"] for e in q] == ["dd ee", "cc", ""] and (q[2]["start_logit"], q[2]["end_logit"]) == (0.0, 0.0)
    assert [e["text"] for e in span_predictions(dev, starts, ends, n_best=2, max_answer=5).nbest["q"]] == [
        "dd ee",
        "cc",
    ]
    assert (q[0]["start_logit"], q[0]["end_logit"]) == (5.0, 5.0)
    totals = [e["start_logit"] + e["end_logit"] for e in q]
    assert totals == sorted(totals, reverse=True)
    expected = [math.exp(t - totals[0]) / sum(math.exp(u - totals[0]) for u in totals) for t in totals]
    assert [e["probability"] for e in q] == expected
    assert [e["text"] for e in out.nbest["r"]] == ["", "xx"]
    written = out.write(tmp_path)
    assert [p.name for p in written] == ["predictions.json", "nbest_predictions.json", "null_odds.json"]
    assert json.loads((tmp_path / "null_odds.json").read_text(encoding="utf-8")) == out.null_odds


def test_squad_v1_has_no_null_odds_and_always_answers():
    dev = _dev(no_answer=False)
    starts, ends = _logits()
    out = span_predictions(dev, starts, ends, n_best=20, max_answer=5)
    assert out.answers == {"q": "dd ee", "r": "xx"} and out.null_odds is None
    assert "" not in {e["text"] for e in out.nbest["q"]} and set(out.files()) == {
        "predictions.json",
        "nbest_predictions.json",
    }


def test_a_question_without_any_span_gets_the_empty_answer_and_never_answers():
    dev = _dev(no_answer=True)
    starts, ends = _logits()
    out = span_predictions(dev, starts, ends, n_best=1, max_answer=1)  # "r": its token is no start among 1 best
    assert out.answers["r"] == "" and out.nbest["r"][0]["text"] == ""
    assert out.null_odds is not None and out.null_odds["r"] == NO_SPAN
