"""An ONNX export is usable as it stands: its ``README.md`` names the model, its inputs and outputs, its labels
(a score, start and end logits), its max length and how it was checked, and its ``## Use`` snippet, run as
written with the venv's python from the export folder (onnxruntime + tokenizers, no torch), prints what ablate's
own model predicts for the same inputs. One tiny model per kind, fine-tuned a few steps by ablate's own run on
real data in a real MLflow store: a single sentence (SST-2), a sentence pair (MRPC), regression (STS-B), a span
(SQuAD)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

pytest.importorskip("onnxruntime")

from ablate.cli import main  # noqa: E402
from ablate.datamodules import classification, squad  # noqa: E402
from ablate.datamodules.tokenizer import special_ids, train_tokenizer  # noqa: E402
from ablate.lightning_modules.config.load import build_config  # noqa: E402
from ablate.lightning_modules.interop.export import export  # noqa: E402
from ablate.lightning_modules.interop.onnx_card import CONTEXT, PAIRS, QUESTION, SENTENCES, snippet  # noqa: E402
from ablate.lightning_modules.interop.onnx_check import inputs  # noqa: E402
from ablate.lightning_modules.interop.onnx_export import ONNX_META  # noqa: E402
from ablate.lightning_modules.methods.squad_metrics import best_answers  # noqa: E402
from ablate.lightning_modules.model.heads import build_pretraining_model  # noqa: E402
from ablate.lightning_modules.model.span import span_logits  # noqa: E402
from ablate.sweeps.engine import tracking  # noqa: E402
from ablate.sweeps.engine.runner import train  # noqa: E402
from ablate.sweeps.engine.weights import load_run_classifier, load_run_span, run_tokenizer  # noqa: E402
from tests.conftest import ROOT, SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

GLUE, SQUAD = SHARED_DATA / "glue", SHARED_DATA / "squad" / "dev-v1.1.json"
MODEL = {"preset": "bert-tiny", "num_layers": 2, "vocab_size": 1000, "max_position": 64, "hidden_dim": 64}
MODEL |= {"num_heads": 2, "ffn_dim": 128}
STEPS = 60  # enough for outputs that differ from input to input by more than TOL
TOL = 1.5e-4  # printed to 4 decimals (one unit apart at most: ONNX Runtime is within 1e-6 of PyTorch here)
# kind -> (its data, the fine-tuning section beyond source and the steps)
CASES: dict[str, tuple[Path, dict[str, object]]] = {
    "single": (SHARED_DATA / "sst2", {"task": "sst2", "train": "nyu-mll/glue:sst2", "max_length": 48}),
    "pair": (
        GLUE / "mrpc",
        {
            "task": "mrpc",
            "train": "nyu-mll/glue:mrpc",
            "text_fields": ["sentence1", "sentence2"],
            "label_names": ["not_equivalent", "equivalent"],
            "max_length": 63,
        },
    ),
    "regression": (
        GLUE / "stsb",
        {
            "task": "stsb",
            "kind": "regression",
            "num_labels": 1,
            "metric": "pearson",
            "train": "nyu-mll/glue:stsb",
            "text_fields": ["sentence1", "sentence2"],
            "max_length": 63,
        },
    ),
    "span": (
        SQUAD,
        {"task": "squad", "kind": "span", "metric": "f1", "max_length": 64, "max_query_length": 20, "doc_stride": 24},
    ),
}


def _texts(data: Path) -> list[str]:
    """Real text of a task to train the run's WordPiece vocabulary on."""
    if data.suffix == ".json":
        tree = json.loads(data.read_text(encoding="utf-8"))
        return [p["context"] for a in tree["data"][:20] for p in a["paragraphs"]] + [QUESTION, CONTEXT]
    rows = [line.split("\t") for line in (data / "train.tsv").read_text(encoding="utf-8").splitlines()[1:3000]]
    return [cell for row in rows for cell in row[:2]]


def _squad_parts(tmp: Path) -> tuple[str, str]:
    """Two small official-JSON files of dev-v1.1's articles: 0-1 to train on, 10 to score."""
    tree = json.loads(SQUAD.read_text(encoding="utf-8"))
    out = []
    for part, articles in (("train", slice(0, 2)), ("dev", slice(10, 11))):
        file = tmp / f"squad-{part}.json"
        file.write_text(json.dumps({"version": tree["version"], "data": tree["data"][articles]}), encoding="utf-8")
        out.append(str(file))
    return out[0], out[1]


def _fine_tuned(tmp: Path, kind: str) -> tuple[str, str]:
    """A tiny BERT (random weights, a vocabulary trained on the task's texts) fine-tuned a few steps by
    ablate's own run; the MLflow store's URI and the run's id."""
    data, task = CASES[kind]
    if not data.exists():
        pytest.skip(f"shared test data not found at {data}")
    tok = train_tokenizer(_texts(data), vocab_size=1000, lowercase=True)
    tok.save(str(tmp / "tokenizer.json"))
    cfg = build_config({"model": MODEL})
    torch.manual_seed(0)
    export(build_pretraining_model(cfg.model, cfg.objective), cfg, tmp / "source", tokenizer=tmp / "tokenizer.json")
    finetune = {**task, "source": str(tmp / "source"), "batch_size": 32, "lr": 2e-3, "max_steps": STEPS}
    finetune |= {"val_every": STEPS, "validation_examples": 64}
    if kind == "span":
        train_file, dev_file = _squad_parts(tmp)
        finetune |= {"train": train_file, "validation": dev_file, "train_examples": 200}
    tree = {
        "model": MODEL,
        "finetune": finetune,
        "data": {"num_workers": 0},
        "trainer": {"measure": False, "progress": False},
        "tracking": {"root": str(tmp / "runs")},
    }
    result = train(build_config(tree))
    return result.tracking_uri, result.run_id


def _classifier_lines(uri: str, run_id: str, tok: Tokenizer, kind: str, segments: bool = True) -> list[list[str]]:
    """What ablate's own classifier (or regressor) says of the card's inputs, encoded as ablate encodes them:
    ``[label, probability, texts...]`` or ``[score, texts...]`` per input (``segments`` False: every token of
    type 0, a pair encoded wrong)."""
    cfg, model = load_run_classifier(uri, run_id)
    columns = [list(SENTENCES)] if kind == "single" else [[a for a, _ in PAIRS], [b for _, b in PAIRS]]
    n = len(columns[0])
    split = classification.encode(tok, columns, [0.0 if kind == "regression" else 0] * n, cfg.finetune.max_length)
    batch = classification.collate([split[i] for i in range(n)], pad_id=special_ids(tok).pad)
    if not segments:
        batch["token_type_ids"] = torch.zeros_like(batch["token_type_ids"])
    with torch.no_grad():
        out = model.eval()(inputs(batch)).float()
    texts = [[row] for row in SENTENCES] if kind == "single" else [list(p) for p in PAIRS]
    if kind == "regression":
        return [[f"{float(s):.4f}", *t] for s, t in zip(out[:, 0], texts, strict=True)]
    names = cfg.finetune.label_names or [f"LABEL_{i}" for i in range(out.shape[-1])]
    probs = out.softmax(-1)
    return [[names[int(p.argmax())], f"{float(p.max()):.4f}", *t] for p, t in zip(probs, texts, strict=True)]


def _span_answer(uri: str, run_id: str, tok: Tokenizer) -> str:
    """ablate's own span model's answer to the card's question (one window), read as its dev scores read it."""
    cfg, model = load_run_span(uri, run_id)
    split = squad.encode(tok, [squad.Question("q", QUESTION, CONTEXT, (), ())], cfg.finetune)
    assert len(split) == 1  # one window: the snippet reads the first
    batch = squad.collate([split[0]], pad_id=special_ids(tok).pad)
    with torch.no_grad():
        start, end = span_logits(model.eval()(inputs(batch)), batch["attention_mask"].bool())
    width = int(start.shape[1])
    answers, _ = best_answers(split.dev, [start[0].numpy()], [end[0].numpy()], width, cfg.finetune.max_answer_length)
    return answers["q"]


def _same(printed: list[str], want: list[list[str]]) -> None:
    got = [line.split("\t") for line in printed]
    assert len(got) == len(want), printed
    for g, w in zip(got, want, strict=True):
        if _number(w[0]):  # regression: the score within TOL, the texts
            assert abs(float(g[0]) - float(w[0])) <= TOL and g[1:] == w[1:], (g, w)
        else:  # the label, its probability within TOL, the texts
            assert g[0] == w[0] and abs(float(g[1]) - float(w[1])) <= TOL and g[2:] == w[2:], (g, w)


def _value(line: list[str]) -> float:
    """A line's score, or its label's probability."""
    return float(line[0]) if _number(line[0]) else float(line[1])


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("kind", list(CASES))
def test_the_cards_snippet_runs_as_written_and_predicts_as_ablate(kind, tmp_path):
    uri, run_id = _fine_tuned(tmp_path, kind)
    out = tmp_path / "onnx"
    assert main(["export", run_id, str(out), "--format", "onnx", "--tracking-uri", uri]) == 0
    card = (out / "README.md").read_text(encoding="utf-8")
    meta = json.loads((out / ONNX_META).read_text(encoding="utf-8"))
    max_length = meta["max_length"]
    assert f"runs:/{run_id}" in card and f"{max_length} tokens (`finetune.max_length`" in card
    assert f"largest difference of any output was {meta['checks']['parity']['max_abs_diff']:.1e}" in card
    assert "## Inputs and outputs" in card and "| input | `token_type_ids` | int64 | `(batch, sequence)` |" in card
    if kind == "span":
        assert "| output | `start_logits` | float32 | `(batch, sequence)` |" in card
    elif kind == "regression":
        assert "`logits[:, 0]` is a score" in card and "| output | `logits` | float32 | `(batch, 1)` |" in card
    else:
        named = ", ".join(f"{i} `{n}`" for i, n in enumerate(meta["labels"]))
        assert named in card and "labels = " + json.dumps(meta["labels"]) in card
    code = re.search(r"## Use\n.*?```python\n(.*?)```", card, re.S)
    assert code is not None
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code.group(1)], cwd=out, capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.rstrip("\n").split("\n")
    (tmp_path / "tok").mkdir()
    tok = Tokenizer.from_file(str(run_tokenizer(tracking.connect(uri), run_id, tmp_path / "tok")))
    if kind == "span":
        assert printed == [_span_answer(uri, run_id, tok)]
        return
    want = _classifier_lines(uri, run_id, tok, kind)
    _same(printed, want)
    # the comparison tells inputs apart (the model was fine-tuned enough to), and a pair's segment ids matter
    assert want[0][0] != want[1][0] or abs(_value(want[0]) - _value(want[1])) > 4 * TOL
    if kind != "single":
        wrong = _classifier_lines(uri, run_id, tok, kind, segments=False)
        assert max(abs(_value(w) - _value(x)) for w, x in zip(want, wrong, strict=True)) > 4 * TOL


def test_the_guide_shows_the_snippet_the_card_writes_for_sst2():
    """docs/guides/interop.md's example is the card's own for an SST-2 classifier (``max_length`` 128)."""
    tree = {"source": "runs:/0123", "task": "sst2", "label_names": ["negative", "positive"], "max_length": 128}
    cfg = build_config({"model": {"preset": "bert-base-uncased"}, "finetune": tree})
    code = "\n".join(snippet(cfg, ["negative", "positive"]))
    assert code in (ROOT / "docs" / "guides" / "interop.md").read_text(encoding="utf-8")
