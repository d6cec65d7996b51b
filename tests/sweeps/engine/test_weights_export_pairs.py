"""A sentence-pair model, fine-tuned by ablate on real MRPC (``nyu-mll/glue:mrpc`` through the data catalog) and
exported with ``ablate export``: transformers' text-classification pipeline, fed the card's
``{"text", "text_pair"}`` inputs, scores the dev pairs as ablate did: the same accuracy as the run logged."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ablate.cli import main  # noqa: E402
from ablate.datamodules.classification import collate, encode  # noqa: E402
from ablate.datamodules.tokenizer import train_tokenizer  # noqa: E402
from ablate.lightning_modules.config.load import build_config  # noqa: E402
from ablate.lightning_modules.interop.export import export  # noqa: E402
from ablate.lightning_modules.interop.hub import load_tokenizer  # noqa: E402
from ablate.lightning_modules.model.heads import build_pretraining_model  # noqa: E402
from ablate.sweeps.engine import tracking  # noqa: E402
from ablate.sweeps.engine.runner import train  # noqa: E402
from ablate.sweeps.engine.weights import load_run_classifier, run_tokenizer  # noqa: E402
from tests.conftest import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MRPC = SHARED_DATA / "glue" / "mrpc"
# an odd length leaves an even budget for the two texts (T - 3), which ablate and transformers' longest_first
# split alike; an odd budget's extra token they give to different texts (the strict xfail in
# tests/lightning_modules/interop/test_export_usable.py)
T = 63


def _dev() -> tuple[list[str], list[str], list[int]]:
    rows = [line.split("\t") for line in (MRPC / "validation.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    return [r[0] for r in rows], [r[1] for r in rows], [int(r[2]) for r in rows]


@pytest.fixture(scope="module")
def mrpc_run(tmp_path_factory):
    """A tiny BERT (random weights, a WordPiece vocabulary trained on MRPC's texts, saved as an ablate export)
    fine-tuned on MRPC by ablate's own fine-tuning run, whose config names the labels."""
    if not (MRPC / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {MRPC}")
    tmp = tmp_path_factory.mktemp("mrpc")
    rows = [line.split("\t") for line in (MRPC / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    tok = train_tokenizer([r[0] for r in rows] + [r[1] for r in rows], vocab_size=1000, lowercase=True)
    tok.save(str(tmp / "tokenizer.json"))
    model = {"preset": "bert-tiny", "num_layers": 2, "vocab_size": 1000, "max_position": 64, "hidden_dim": 64}
    model |= {"num_heads": 2, "ffn_dim": 128}
    model["dropout"] = 0.0  # 40 steps from random weights: scores that still differ row by row
    cfg = build_config({"model": model})
    torch.manual_seed(0)
    export(build_pretraining_model(cfg.model, cfg.objective), cfg, tmp / "source", tokenizer=tmp / "tokenizer.json")
    tree = {
        "model": model,
        "finetune": {
            "source": str(tmp / "source"),
            "task": "mrpc",
            "train": "nyu-mll/glue:mrpc",
            "text_fields": ["sentence1", "sentence2"],
            "label_names": ["not_equivalent", "equivalent"],
            "max_length": T,
            "batch_size": 32,
            "lr": 1e-3,
            "max_steps": 40,
            "val_every": 20,
            "metric": "accuracy",  # MRPC's own is F1 (the GLUE table's): here the pipeline's accuracy is compared
        },
        "data": {"num_workers": 0},
        "trainer": {"measure": False, "progress": False},
        "tracking": {"root": str(tmp / "runs")},
    }
    return tmp, train(build_config(tree))


def test_the_pipeline_scores_mrpc_pairs_as_ablate_logged_them(mrpc_run):
    tmp, result = mrpc_run
    uri, run_id = result.tracking_uri, result.run_id
    logged = tracking.connect(uri).get_run(run_id).data.metrics["mrpc/final_accuracy"]
    out = tmp / "mrpc-export"
    assert main(["export", run_id, str(out), "--tracking-uri", uri]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "not_equivalent", "1": "equivalent"}
    card = (out / "README.md").read_text()
    assert "sentence pairs (`sentence1`, `sentence2`)" in card and "'text_pair': " in card

    a, b, gold = _dev()
    classify = transformers.pipeline("text-classification", model=str(out), truncation=True)
    pairs = [{"text": p, "text_pair": q} for p, q in zip(a, b, strict=True)]
    results = classify(pairs, batch_size=64)
    predicted = [config["label2id"][r["label"]] for r in results]
    accuracy = sum(p == g for p, g in zip(predicted, gold, strict=True)) / len(gold)
    assert abs(accuracy - logged) < 1e-6, (accuracy, logged)

    # row by row, the classes ablate's own classifier gives the rows ablate encodes (truncated: many are)
    _, model = load_run_classifier(uri, run_id)
    tok = load_tokenizer(run_tokenizer(tracking.connect(uri), run_id, tmp))
    split = encode(tok, [a, b], gold, T)
    assert sum(len(split[i][0]) == T for i in range(len(split))) > 20
    batch = collate(list(split), pad_id=tok.token_to_id("[PAD]"))
    with torch.no_grad():
        logits = model({k: v for k, v in batch.items() if k != "labels"})
    assert predicted == logits.argmax(-1).tolist()
    # ... and the same scores, row by row (a tiny model may guess one class: its scores still differ by both
    # texts, their segment ids and where they were cut, far more than by float rounding)
    ours = logits.softmax(-1)[:, 1]
    scored = classify(pairs, batch_size=64, top_k=None)
    theirs = torch.tensor([next(c["score"] for c in row if c["label"] == "equivalent") for row in scored])
    assert (theirs - ours).abs().max() < 1e-6 and ours.std() > 1e-4
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = hf_tok(a[:50], b[:50], truncation=True, padding=True, return_tensors="pt")
    width = enc["input_ids"].shape[1]
    assert torch.equal(enc["token_type_ids"], batch["token_type_ids"][:50, :width])
