"""THE REFERENCE: the official SQuAD evaluation scripts' command lines, ``evaluate-v1.1.py`` and
``evaluate-v2.0.py`` (rajpurkar.github.io/SQuAD-explorer), as they read their files and print their scores.

The scripts are not on these machines and cannot be downloaded; their scoring functions are copied verbatim
in :mod:`tests.lightning_modules.methods.test_squad_metrics` (``v1_evaluate``; ``v2_main``, the body of
``evaluate-v2.0.py``'s ``main``), and their ``main``s below, as released:

    python -m tests.sweeps.squad_official v1.1 dev-v1.1.json predictions.json
    python -m tests.sweeps.squad_official v2.0 dev-v2.0.json predictions.json -n null_odds.json

print what ``python evaluate-v1.1.py dev-v1.1.json predictions.json`` and
``python evaluate-v2.0.py dev-v2.0.json predictions.json -n null_odds.json`` print (one JSON object).
Nothing of ablate is imported here.
"""

from __future__ import annotations

import argparse
import json
import sys

from tests.lightning_modules.methods.test_squad_metrics import v1_evaluate, v2_main


def main_v1(argv: list[str]) -> None:
    """``evaluate-v1.1.py``'s ``__main__``."""
    expected_version = "1.1"
    parser = argparse.ArgumentParser(description="Evaluation for SQuAD " + expected_version)
    parser.add_argument("dataset_file", help="Dataset file")
    parser.add_argument("prediction_file", help="Prediction File")
    args = parser.parse_args(argv)
    with open(args.dataset_file) as dataset_file:
        dataset_json = json.load(dataset_file)
        if dataset_json["version"] != expected_version:
            print(
                "Evaluation expects v-" + expected_version + ", but got dataset with v-" + dataset_json["version"],
                file=sys.stderr,
            )
        dataset = dataset_json["data"]
    with open(args.prediction_file) as prediction_file:
        predictions = json.load(prediction_file)
    print(json.dumps(v1_evaluate(dataset, predictions)))


def main_v2(argv: list[str]) -> None:
    """``evaluate-v2.0.py``'s ``parse_args`` and ``main`` (without its plots: ``--out-image-dir``)."""
    parser = argparse.ArgumentParser("Official evaluation script for SQuAD version 2.0.")
    parser.add_argument("data_file", metavar="data.json", help="Input data JSON file.")
    parser.add_argument("pred_file", metavar="pred.json", help="Model predictions.")
    parser.add_argument(
        "--out-file", "-o", metavar="eval.json", help="Write accuracy metrics to file (default is stdout)."
    )
    parser.add_argument(
        "--na-prob-file", "-n", metavar="na_prob.json", help="Model estimates of probability of no answer."
    )
    parser.add_argument("--na-prob-thresh", "-t", type=float, default=1.0)
    opts = parser.parse_args(argv)
    with open(opts.data_file) as f:
        dataset_json = json.load(f)
        dataset = dataset_json["data"]
    with open(opts.pred_file) as f:
        preds = json.load(f)
    if opts.na_prob_file:
        with open(opts.na_prob_file) as f:
            na_probs = json.load(f)
    else:
        na_probs = {k: 0.0 for k in preds}
    out_eval = v2_main(dataset, preds, na_probs, opts.na_prob_thresh)
    if opts.out_file:
        with open(opts.out_file, "w") as f:
            json.dump(out_eval, f)
    else:
        print(json.dumps(out_eval, indent=2))


if __name__ == "__main__":
    version, *rest = sys.argv[1:]
    (main_v1 if version == "v1.1" else main_v2)(rest)
