"""An STS-B regression model, fine-tuned by ablate on real STS-B (``nyu-mll/glue:stsb`` through the data catalog;
one output, MSE, Pearson) and exported with ``ablate export``: a one-output ``*ForSequenceClassification`` with
``problem_type: regression`` whose text-classification pipeline (``function_to_apply`` none, as the card's
example says) scores the dev pairs with the Pearson correlation the run logged."""

from __future__ import annotations

import json

import pytest
import torch
from scipy.stats import pearsonr

transformers = pytest.importorskip("transformers")

from ablate.cli import main  # noqa: E402
from ablate.datamodules.tokenizer import train_tokenizer  # noqa: E402
from ablate.lightning_modules.config.load import build_config  # noqa: E402
from ablate.lightning_modules.interop.classifier import load_classifier  # noqa: E402
from ablate.lightning_modules.interop.export import export  # noqa: E402
from ablate.lightning_modules.model.heads import build_pretraining_model  # noqa: E402
from ablate.sweeps.engine import tracking  # noqa: E402
from ablate.sweeps.engine.runner import train  # noqa: E402
from tests.conftest import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

STSB = SHARED_DATA / "glue" / "stsb"
T = 63  # odd: an even budget for the two texts, split alike by ablate and transformers (test_weights_export_pairs.py)
DEV = 300  # the small dev set the run scores (finetune.validation_examples) and the pipeline scores


def _rows(split: str) -> list[list[str]]:
    return [line.split("\t") for line in (STSB / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]]


@pytest.fixture(scope="module")
def stsb_run(tmp_path_factory):
    """A tiny BERT (random weights, a WordPiece vocabulary trained on STS-B's texts, saved as an ablate export)
    fine-tuned on STS-B by ablate's own fine-tuning run."""
    if not (STSB / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {STSB}")
    tmp = tmp_path_factory.mktemp("stsb")
    rows = _rows("train")
    tok = train_tokenizer([r[0] for r in rows] + [r[1] for r in rows], vocab_size=1000, lowercase=True)
    tok.save(str(tmp / "tokenizer.json"))
    model = {"preset": "bert-tiny", "num_layers": 2, "vocab_size": 1000, "max_position": 64}
    model["dropout"] = 0.0  # 40 steps from random weights: scores that still differ row by row
    cfg = build_config({"model": model})
    torch.manual_seed(0)
    export(build_pretraining_model(cfg.model, cfg.objective), cfg, tmp / "source", tokenizer=tmp / "tokenizer.json")
    tree = {
        "model": model,
        "finetune": {
            "source": str(tmp / "source"),
            "task": "stsb",
            "kind": "regression",
            "num_labels": 1,
            "metric": "pearson",
            "train": "nyu-mll/glue:stsb",
            "text_fields": ["sentence1", "sentence2"],
            "validation_examples": DEV,
            "max_length": T,
            "batch_size": 32,
            "lr": 2e-3,
            "max_steps": 100,
            "val_every": 50,
        },
        "data": {"num_workers": 0},
        "trainer": {"measure": False, "progress": False},
        "tracking": {"root": str(tmp / "runs")},
    }
    return tmp, train(build_config(tree))


def test_the_pipeline_scores_stsb_pairs_with_the_logged_pearson(stsb_run, capsys):
    tmp, result = stsb_run
    uri, run_id = result.tracking_uri, result.run_id
    logged = tracking.connect(uri).get_run(run_id).data.metrics["stsb/final_pearson"]
    out = tmp / "stsb-export"
    assert main(["export", run_id, str(out), "--tracking-uri", uri]) == 0
    assert "(transformers format; a fine-tuned sequence classifier)" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"][0].endswith("ForSequenceClassification")
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "LABEL_0"}
    card = (out / "README.md").read_text()
    assert "sequence regressor fine-tuned with ablate on the task `stsb` (one output, a score" in card
    assert 'function_to_apply="none"' in card and "Dev pearson (`finetune.metric`): **" in card
    auto = transformers.AutoModelForSequenceClassification.from_pretrained(out)
    assert auto.num_labels == 1

    rows = _rows("validation")[:DEV]
    pairs = [{"text": r[0], "text_pair": r[1]} for r in rows]
    gold = [float(r[2]) for r in rows]
    score = transformers.pipeline("text-classification", model=str(out), truncation=True, function_to_apply="none")
    predicted = [r["score"] for r in score(pairs, batch_size=64)]
    assert max(predicted) - min(predicted) > 0.1  # a score per pair, not a constant
    assert abs(float(pearsonr(predicted, gold).statistic) - logged) < 1e-5, logged
    code = card.split("## Use", 1)[1].split("```python\n", 1)[1].split("\n```", 1)[0]
    namespace: dict[str, object] = {}
    exec(code.replace("PATH/TO/THIS/FOLDER", str(out)), namespace)  # noqa: S102 - the card's example, as written
    assert capsys.readouterr().out.count("'label': 'LABEL_0', 'score': ") == 2
    theirs = [r["score"] for r in namespace["classify"](pairs, batch_size=64)]  # type: ignore[operator]
    assert max(abs(a - b) for a, b in zip(theirs, predicted, strict=True)) < 1e-5
    _, back = load_classifier(out)  # the export reads back as a one-output model
    assert back.num_labels == 1
