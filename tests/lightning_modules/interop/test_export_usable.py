"""Exports a user can use as they are: label names from the run's config (``--labels`` wins), a regression
model as a one-output ``problem_type: regression`` classifier whose pipeline returns ablate's scores, and a
pair model's tokenizer that gives the rows ablate's own encoding gives (ids and segment ids, truncated alike)."""

from __future__ import annotations

import json

import pytest
import torch
from scipy.stats import pearsonr

transformers = pytest.importorskip("transformers")

from ablate.datamodules.classification import collate, encode  # noqa: E402
from ablate.datamodules.tokenizer import train_tokenizer  # noqa: E402
from ablate.lightning_modules.config.errors import ConfigError  # noqa: E402
from ablate.lightning_modules.config.experiment import ExperimentConfig  # noqa: E402
from ablate.lightning_modules.config.load import build_config  # noqa: E402
from ablate.lightning_modules.interop.classifier import (  # noqa: E402
    export_labels,
    from_transformers_classifier,
    to_transformers_classifier,
)
from ablate.lightning_modules.interop.export import export  # noqa: E402
from ablate.lightning_modules.interop.hub import hf_tokenizer  # noqa: E402
from ablate.lightning_modules.model.classifier import Classifier, build_classifier  # noqa: E402
from ablate.lightning_modules.model.heads import build_pretraining_model  # noqa: E402
from tests.conftest import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

STSB = SHARED_DATA / "glue" / "stsb"
MRPC = SHARED_DATA / "glue" / "mrpc"
T = 48


def _config(num_labels: int = 2, **finetune: object) -> ExperimentConfig:
    model = {"preset": "bert-tiny", "num_layers": 2, "vocab_size": 1000, "max_position": 64}
    return build_config({"model": model, "finetune": {"source": "runs:/0123", "num_labels": num_labels, **finetune}})


def _classifier(cfg: ExperimentConfig, num_labels: int) -> Classifier:
    torch.manual_seed(0)
    return build_classifier(build_pretraining_model(cfg.model, cfg.objective), num_labels, 0.1, 0.02).eval()


def _rows(path, n: int) -> tuple[list[str], list[str], list[str]]:
    lines = path.read_text(encoding="utf-8").splitlines()[1 : n + 1]
    cols = [line.split("\t") for line in lines]
    return [c[0] for c in cols], [c[1] for c in cols], [c[2] for c in cols]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A WordPiece tokenizer trained as ablate trains a run's, on real sentence pairs (STS-B's and MRPC's)."""
    if not (STSB / "train.tsv").is_file() or not (MRPC / "validation.tsv").is_file():
        pytest.skip(f"shared test data not found at {SHARED_DATA / 'glue'}")
    a, b, _ = _rows(STSB / "train.tsv", 2000)
    tok = train_tokenizer(a + b, vocab_size=1000, lowercase=True)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return tok, path


def test_label_names_come_from_the_config_and_export_labels_win(tmp_path):
    cfg = _config(label_names=["negative", "positive"])
    assert export_labels(cfg.finetune, 2) == ["negative", "positive"]
    assert export_labels(cfg.finetune, 2, ["bad", "good"]) == ["bad", "good"]
    assert export_labels(_config().finetune, 2) is None
    with pytest.raises(ConfigError) as info:
        export_labels(cfg.finetune, 2, ["a", "b", "c"])
    assert (
        str(info.value)
        == "--labels: a, b, c: give 2 different names, one per class, in the order of the task's label ids"
    )
    with pytest.raises(ConfigError, match=r"^finetune.label_names: a, a: give 2 different names"):
        export_labels(_config(label_names=["a", "a"]).finetune, 2)

    model = _classifier(cfg, 2)
    export(model, cfg, tmp_path / "named")
    config = json.loads((tmp_path / "named" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"} and config["label2id"] == {
        "negative": 0,
        "positive": 1,
    }
    card = (tmp_path / "named" / "README.md").read_text()
    assert "(`id2label`: 0 `negative`, 1 `positive`)" in card and "labels: negative, positive" in card
    export(model, cfg, tmp_path / "given", labels=["bad", "good"])
    assert json.loads((tmp_path / "given" / "config.json").read_text())["id2label"] == {"0": "bad", "1": "good"}
    with pytest.raises(ConfigError, match="^--labels: x: give 2 different names"):
        export(model, cfg, tmp_path / "wrong", labels=["x"])
    assert not (tmp_path / "wrong").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["given", "named"]


def test_a_regression_model_exports_as_one_output_that_the_pipeline_returns_raw(tmp_path, tokenizer):
    """A one-output head trained a little with MSE on STS-B: exported with ``problem_type: regression``, the
    pipeline (``function_to_apply`` none, also its default for regression) returns ablate's outputs, so the
    Pearson correlation of its scores with the gold scores is ablate's."""
    tok, path = tokenizer
    cfg = _config(text_fields=["sentence1", "sentence2"], max_length=T)
    model = _classifier(cfg, 1)
    a, b, y = _rows(STSB / "train.tsv", 512)
    train = collate(list(encode(tok, [a, b], [0] * len(y), T)), pad_id=0)
    target = torch.tensor([float(v) for v in y])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(40):
        rows = torch.randint(0, len(y), (32,), generator=g)
        out = model({k: v[rows] for k, v in train.items() if k != "labels"}).squeeze(-1)
        loss = torch.nn.functional.mse_loss(out, target[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    da, db, dy = _rows(STSB / "validation.tsv", 200)
    dev = collate(list(encode(tok, [da, db], [0] * len(dy), T)), pad_id=0)
    with torch.no_grad():
        ours = model({k: v for k, v in dev.items() if k != "labels"}).squeeze(-1)
    gold = [float(v) for v in dy]
    ours_r = float(pearsonr(ours.numpy(), gold).statistic)

    hf = to_transformers_classifier(model, cfg.model, ["similarity"], kind="regression")
    assert hf.config.problem_type == "regression" and hf.config.num_labels == 1
    hf.save_pretrained(tmp_path / "stsb")
    hf_tokenizer(path, lowercase=True, max_length=T).save_pretrained(str(tmp_path / "stsb"))
    config = json.loads((tmp_path / "stsb" / "config.json").read_text())
    assert config["problem_type"] == "regression" and config["id2label"] == {"0": "similarity"}
    auto = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "stsb")
    assert auto.num_labels == 1
    score = transformers.pipeline("text-classification", model=str(tmp_path / "stsb"), function_to_apply="none")
    pairs = [{"text": p, "text_pair": q} for p, q in zip(da, db, strict=True)]
    theirs = [r["score"] for r in score(pairs, truncation=True, batch_size=50)]
    assert max(abs(t - o) for t, o in zip(theirs, ours.tolist(), strict=True)) < 1e-4
    assert abs(float(pearsonr(theirs, gold).statistic) - ours_r) < 1e-5 and abs(ours_r) > 0.05
    default = transformers.pipeline("text-classification", model=str(tmp_path / "stsb"))
    assert default(pairs[:1], truncation=True)[0]["score"] == pytest.approx(theirs[0], abs=1e-5)  # not a sigmoid

    _, back = from_transformers_classifier(auto.eval())  # a regression export reads back as a one-output model
    with torch.no_grad():
        assert (
            back.num_labels == 1
            and (back({k: v for k, v in dev.items() if k != "labels"}).squeeze(-1) - ours).abs().max() < 1e-4
        )
    with pytest.raises(ConfigError, match="finetune.kind: regression needs one output; the model has 2"):
        to_transformers_classifier(_classifier(cfg, 2), cfg.model, kind="regression")
    with pytest.raises(ConfigError, match="finetune.kind: span: not a sequence classifier"):
        to_transformers_classifier(model, cfg.model, kind="span")
    auto.config.problem_type = "single_label_classification"
    with pytest.raises(ConfigError, match="problem_type: single_label_classification, 1 outputs is not supported"):
        from_transformers_classifier(auto)


def _ablate_rows(tok, a: list[str], b: list[str], max_length: int) -> list[tuple[list[int], list[int]]]:
    batch = collate(list(encode(tok, [a, b], [0] * len(a), max_length)), pad_id=0)
    n = batch["attention_mask"].sum(-1).tolist()
    return [
        (ids[:k], types[:k])
        for ids, types, k in zip(batch["input_ids"].tolist(), batch["token_type_ids"].tolist(), n, strict=True)
    ]


def _hf_rows(hf, a: list[str], b: list[str]) -> list[tuple[list[int], list[int]]]:
    enc = hf(a, b, truncation=True)
    return list(zip(enc["input_ids"], enc["token_type_ids"], strict=True))


def test_a_pair_models_tokenizer_gives_ablates_rows_and_segment_ids(tokenizer):
    """Real MRPC pairs at a budget that truncates many of them (the longer text first): the exported
    tokenizer, as transformers' pipeline calls it, gives the token and segment ids ablate trained on, where
    both agree on who gets the odd token (an odd budget split between two long texts: the test below)."""
    tok, path = tokenizer
    hf = hf_tokenizer(path, lowercase=True, max_length=T + 1)  # budget T - 2: even, split alike
    a, b, _ = _rows(MRPC / "validation.tsv", 408)
    ours, theirs = _ablate_rows(tok, a, b, T + 1), _hf_rows(hf, a, b)
    assert ours == theirs
    assert sum(len(ids) == T + 1 for ids, _ in ours) > 100  # many truncated
    assert all(types == [0] * types.index(1) + [1] * (len(types) - types.index(1)) for _, types in ours)


def test_pairs_cut_to_an_odd_budget_are_split_as_transformers_splits_them(tokenizer):
    tok, path = tokenizer
    text = " ".join(_rows(MRPC / "validation.tsv", 3)[0])  # three sentences: both sides are cut
    hf = hf_tokenizer(path, lowercase=True, max_length=T)  # budget T - 3: odd
    assert _ablate_rows(tok, [text], [text], T) == _hf_rows(hf, [text], [text])
