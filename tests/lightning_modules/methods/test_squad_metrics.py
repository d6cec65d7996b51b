"""SQuAD's EM and F1 against the official evaluation scripts (their functions, verbatim below), to the
last digit, and the n-best post-processing on windows built by hand."""

from __future__ import annotations

import collections
import json
import random
import re
import string

import numpy as np
import pytest

from ablate.datamodules.span_dev import Reference, SpanDev, Windows
from ablate.lightning_modules.methods.squad_metrics import (
    V2_LOGGED,
    best_answers,
    evaluate_v1,
    evaluate_v2,
    span_metrics,
)
from tests.conftest import SHARED_DATA

SQUAD = SHARED_DATA / "squad"


# --- evaluate-v1.1.py (the official SQuAD 1.1 script's functions) -------------------------------------
def v1_normalize_answer(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def v1_f1_score(prediction, ground_truth):
    prediction_tokens = v1_normalize_answer(prediction).split()
    ground_truth_tokens = v1_normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def v1_exact_match_score(prediction, ground_truth):
    return v1_normalize_answer(prediction) == v1_normalize_answer(ground_truth)


def v1_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def v1_evaluate(dataset, predictions):
    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    continue
                ground_truths = list(map(lambda x: x["text"], qa["answers"]))
                prediction = predictions[qa["id"]]
                exact_match += v1_metric_max_over_ground_truths(v1_exact_match_score, prediction, ground_truths)
                f1 += v1_metric_max_over_ground_truths(v1_f1_score, prediction, ground_truths)
    exact_match = 100.0 * exact_match / total
    f1 = 100.0 * f1 / total
    return {"exact_match": exact_match, "f1": f1}


# --- evaluate-v2.0.py (the official SQuAD 2.0 script's functions) -------------------------------------
def make_qid_to_has_ans(dataset):
    qid_to_has_ans = {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qid_to_has_ans[qa["id"]] = bool(qa["answers"])
    return qid_to_has_ans


def normalize_answer(s):
    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def get_tokens(s):
    if not s:
        return []
    return normalize_answer(s).split()


def compute_exact(a_gold, a_pred):
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold, a_pred):
    gold_toks = get_tokens(a_gold)
    pred_toks = get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def get_raw_scores(dataset, preds):
    exact_scores = {}
    f1_scores = {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qid = qa["id"]
                gold_answers = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
                if not gold_answers:
                    gold_answers = [""]
                if qid not in preds:
                    continue
                a_pred = preds[qid]
                exact_scores[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
                f1_scores[qid] = max(compute_f1(a, a_pred) for a in gold_answers)
    return exact_scores, f1_scores


def apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    new_scores = {}
    for qid, s in scores.items():
        pred_na = na_probs[qid] > na_prob_thresh
        if pred_na:
            new_scores[qid] = float(not qid_to_has_ans[qid])
        else:
            new_scores[qid] = s
    return new_scores


def make_eval_dict(exact_scores, f1_scores, qid_list=None):
    if not qid_list:
        total = len(exact_scores)
        return collections.OrderedDict(
            [
                ("exact", 100.0 * sum(exact_scores.values()) / total),
                ("f1", 100.0 * sum(f1_scores.values()) / total),
                ("total", total),
            ]
        )
    else:
        total = len(qid_list)
        return collections.OrderedDict(
            [
                ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
                ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
                ("total", total),
            ]
        )


def merge_eval(main_eval, new_eval, prefix):
    for k in new_eval:
        main_eval[f"{prefix}_{k}"] = new_eval[k]


def find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for i, qid in enumerate(qid_list):  # noqa: B007 - the official script, verbatim
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            if preds[qid]:
                diff = -1
            else:
                diff = 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def find_all_best_thresh(main_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans):
    best_exact, exact_thresh = find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
    best_f1, f1_thresh = find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
    main_eval["best_exact"] = best_exact
    main_eval["best_exact_thresh"] = exact_thresh
    main_eval["best_f1"] = best_f1
    main_eval["best_f1_thresh"] = f1_thresh


def v2_main(dataset, preds, na_probs, na_prob_thresh=1.0):
    qid_to_has_ans = make_qid_to_has_ans(dataset)
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    exact_raw, f1_raw = get_raw_scores(dataset, preds)
    exact_thresh = apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    f1_thresh = apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    out_eval = make_eval_dict(exact_thresh, f1_thresh)
    if has_ans_qids:
        merge_eval(out_eval, make_eval_dict(exact_thresh, f1_thresh, qid_list=has_ans_qids), "HasAns")
    if no_ans_qids:
        merge_eval(out_eval, make_eval_dict(exact_thresh, f1_thresh, qid_list=no_ans_qids), "NoAns")
    find_all_best_thresh(out_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans)
    return out_eval


# --- fixed predictions ----------------------------------------------------------------------------------
def _dev(name: str, articles: int) -> list:
    path = SQUAD / name
    if not path.is_file():
        pytest.skip(f"shared SQuAD data not found at {path}")
    return json.loads(path.read_text(encoding="utf-8"))["data"][:articles]


def _references(dataset) -> list[Reference]:
    return [
        Reference(qa["id"], p["context"], tuple(a["text"] for a in qa["answers"]))
        for article in dataset
        for p in article["paragraphs"]
        for qa in p["qas"]
    ]


def _predictions(dataset, seed: int) -> dict[str, str]:
    """Every kind of prediction: a reference as is, with its case, punctuation or articles changed, a part of
    it, a longer span, another question's answer, words of the context, nothing."""
    rng = random.Random(seed)
    out = {}
    for article in dataset:
        for p in article["paragraphs"]:
            words = p["context"].split()
            for qa in p["qas"]:
                gold = rng.choice(qa["answers"])["text"] if qa["answers"] else rng.choice(words)
                kind = rng.randrange(8)
                a, b = sorted(rng.sample(range(len(words) + 1), 2))
                out[qa["id"]] = [
                    gold,
                    f"The {gold.upper()}!",
                    " ".join(gold.split()[: max(1, len(gold.split()) // 2)]),
                    f"{gold}, {rng.choice(words)} an {rng.choice(words)}",
                    " ".join(words[a : min(b, a + 6)]),
                    "",
                    gold.replace(" ", "  ").replace(".", ""),
                    rng.choice(words) + " " + gold,
                ][kind]
    return out


def test_squad_v1_em_and_f1_are_the_official_ones_to_the_last_digit():
    dataset = _dev("dev-v1.1.json", 6)
    refs = _references(dataset)
    assert len(refs) > 300
    for seed in range(3):
        preds = _predictions(dataset, seed)
        preds.pop(refs[seed].id)  # a question left unanswered scores 0 in both
        assert evaluate_v1(refs, preds) == v1_evaluate(dataset, preds)
    ours = evaluate_v1(refs, preds)
    assert 0 < ours["exact_match"] < ours["f1"] < 100  # the predictions are neither all right nor all wrong


def test_squad_v2_scores_and_thresholds_are_the_official_ones_to_the_last_digit():
    dataset = _dev("dev-v2.0.json", 4)
    refs = _references(dataset)
    assert any(not r.answers for r in refs) and any(r.answers for r in refs)
    for seed in range(3):
        preds = _predictions(dataset, seed)
        rng = random.Random(seed)
        na_probs = {k: round(rng.uniform(-3, 3), 1) for k in preds}  # ties, as real scores can have
        official = v2_main(dataset, preds, na_probs)
        assert evaluate_v2(refs, preds, na_probs) == dict(official)
        assert evaluate_v2(refs, preds, na_probs, 0.5) == dict(v2_main(dataset, preds, na_probs, 0.5))
    assert official["best_f1"] >= official["f1"] and official["NoAns_total"] > 0
    logged = span_metrics(SpanDev(refs, Windows(np.zeros(0), np.zeros(0), [], []), True), preds, na_probs)
    assert logged["f1"] == official["best_f1"] / 100 and logged["f1_thresh"] == official["best_f1_thresh"]
    assert logged["exact_at0"] == official["exact"] / 100 and set(logged) == set(V2_LOGGED.values())


def _windows() -> tuple[SpanDev, list[np.ndarray], list[np.ndarray]]:
    """One question, its context read in two overlapping windows of 4 context tokens after 3 question tokens."""
    context = "aa bb cc dd ee ff"
    spans = np.array([[0, 2], [3, 5], [6, 8], [9, 11], [12, 14], [15, 17]])
    windows = Windows(
        example=np.array([0, 0]),
        ctx_start=np.array([4, 4]),
        spans=[spans[0:4], spans[2:6]],
        max_context=[np.array([True, True, True, False]), np.array([False, True, True, True])],
    )
    dev = SpanDev([Reference("q", context, ("cc dd",))], windows, no_answer=True)
    return dev, [np.zeros(9), np.zeros(9)], [np.zeros(9), np.zeros(9)]


def test_the_best_span_of_all_windows_is_mapped_back_to_the_context():
    dev, starts, ends = _windows()
    starts[1][4 + 1], ends[1][4 + 2] = 5.0, 5.0  # window 2: "dd ee" (tokens 3..4), score 10
    starts[0][4 + 3], ends[0][4 + 3] = 9.0, 9.0  # window 1's "dd": score 18, but not its max-context token
    starts[0][0], ends[0][0] = 3.0, 3.0  # [CLS]: null score 6 (the least over windows: window 2's is 0)
    answers, diffs = best_answers(dev, starts, ends, n_best=5, max_answer=5)
    assert answers == {"q": "dd ee"} and diffs == {"q": 0.0 - 10.0}
    answers, _ = best_answers(dev, starts, ends, n_best=5, max_answer=1)  # 2 tokens are too long now
    assert answers["q"] == ""  # and no other span is among the 5 best starts and ends
    answers, _ = best_answers(dev, starts, ends, n_best=9, max_answer=1)
    assert answers["q"] in ("dd", "ee")  # score 5 + 0
    starts[1][0] = ends[1][0] = 8.0
    starts[0][0] = ends[0][0] = 8.0  # null 16 > 10: no answer
    answers, diffs = best_answers(dev, starts, ends, n_best=5, max_answer=5)
    assert answers == {"q": ""} and diffs["q"] == 6.0
    v1 = SpanDev(dev.references, dev.windows, no_answer=False)  # SQuAD 1.1 always answers
    assert best_answers(v1, starts, ends, n_best=5, max_answer=5)[0] == {"q": "dd ee"}
