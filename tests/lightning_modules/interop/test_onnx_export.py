"""ONNX export of what ablate fine-tunes (``ablate export --format onnx``): a tiny classifier fine-tuned on real
SST-2 by ablate's own run, exported fp32 (ONNX Runtime within 1e-4 of ablate's logits on dev sentences, at other
batch sizes and lengths too), and each quantized flavour checked against fp32 on the dev rows; a span model;
the refusals, each one line with nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from ablate.cli import main  # noqa: E402
from ablate.lightning_modules.config.errors import ConfigError  # noqa: E402
from ablate.lightning_modules.config.load import build_config  # noqa: E402
from ablate.lightning_modules.interop.export import export  # noqa: E402
from ablate.lightning_modules.interop.onnx_check import feed, session, task_rows  # noqa: E402
from ablate.lightning_modules.interop.onnx_export import NO_EXITS, ONNX_FILE, ONNX_META, export_onnx  # noqa: E402
from ablate.lightning_modules.interop.onnx_quant import run_form  # noqa: E402
from ablate.lightning_modules.model.classifier import new_head  # noqa: E402
from ablate.lightning_modules.model.heads import build_pretraining_model  # noqa: E402
from ablate.lightning_modules.model.span import build_span_model  # noqa: E402
from ablate.sweeps.engine import tracking  # noqa: E402
from ablate.sweeps.engine.runner import train  # noqa: E402
from ablate.sweeps.engine.weights import load_run_classifier, run_tokenizer  # noqa: E402
from tests.conftest import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SST2, SQUAD = SHARED_DATA / "sst2", SHARED_DATA / "squad" / "dev-v1.1.json"
MODEL = {"preset": "bert-tiny", "num_layers": 2, "vocab_size": 1000, "max_position": 64, "hidden_dim": 64}
MODEL |= {"num_heads": 2, "ffn_dim": 128}


def _tokenizer(tmp, texts: list[str]):
    from ablate.datamodules.tokenizer import train_tokenizer

    tok = train_tokenizer(texts, vocab_size=1000, lowercase=True)
    tok.save(str(tmp / "tokenizer.json"))
    return tmp / "tokenizer.json"


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory):
    """A tiny BERT (random weights, a WordPiece vocabulary trained on SST-2's sentences) fine-tuned on SST-2
    (``nyu-mll/glue:sst2`` through the data catalog) by ablate's own fine-tuning run."""
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tmp = tmp_path_factory.mktemp("onnx")
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()[1:4000]
    tok = _tokenizer(tmp, [line.split("\t")[0] for line in lines])
    cfg = build_config({"model": MODEL})
    torch.manual_seed(0)
    export(build_pretraining_model(cfg.model, cfg.objective), cfg, tmp / "source", tokenizer=tok)
    tree = {
        "model": MODEL,
        "finetune": {
            "source": str(tmp / "source"),
            "task": "sst2",
            "train": "nyu-mll/glue:sst2",
            "label_names": ["negative", "positive"],
            "max_length": 48,
            "batch_size": 32,
            "lr": 2e-3,
            "max_steps": 60,
            "val_every": 60,
            "validation_examples": 256,
        },
        "data": {"num_workers": 0},
        "trainer": {"measure": False, "progress": False},
        "tracking": {"root": str(tmp / "runs")},
    }
    result = train(build_config(tree))
    return tmp, result.tracking_uri, result.run_id


def test_fp32_export_matches_ablate_within_1e4_at_any_batch_and_length(sst2_run, capsys):
    tmp, uri, run_id = sst2_run
    out = tmp / "fp32"
    assert main(["export", f"runs:/{run_id}", str(out), "--format", "onnx", "--tracking-uri", uri]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"run {run_id} exported to" in line and "onnx format, fp32; parity: ONNX Runtime fp32 within" in line
    meta = json.loads((out / ONNX_META).read_text(encoding="utf-8"))
    assert meta["labels"] == ["negative", "positive"] and meta["quantization"] is None
    assert meta["inputs"]["input_ids"]["shape"] == ["batch", "sequence"]
    assert meta["checks"]["parity"]["max_abs_diff"] <= 1e-4 and meta["checks"]["parity"]["rows"] == 256
    assert {"tokenizer.json", ONNX_FILE, "ablate.yaml"} <= {p.name for p in out.iterdir()}

    # dynamic axes: other batch sizes and lengths than the export traced, against ablate's model
    cfg, model = load_run_classifier(uri, run_id)
    rows = task_rows(cfg.finetune, out / "tokenizer.json", dev_rows=40)
    sess = session(out / ONNX_FILE)
    for b, t in ((1, 9), (7, 40)):
        batch = {k: v[:b, :t] for k, v in rows.dev[0].items() if v.dim() == 2}
        got = sess.run(None, feed(batch))[0]
        with torch.no_grad():
            want = model(batch).numpy()
        assert got.shape == (b, 2) and np.abs(got - want).max() <= 1e-4
    # the transformers tokenizer saved beside it encodes as the run did
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(out)
    assert hf("a gripping movie")["input_ids"][0] == hf.cls_token_id


@pytest.mark.parametrize("how", ["dynamic-int8", "static-int8", "int4"])
def test_each_quantized_export_is_checked_against_fp32_on_dev_rows(sst2_run, how, capsys):
    tmp, uri, run_id = sst2_run
    out = tmp / how
    assert main(["export", run_id, str(out), "--format", "onnx", "--quantize", how, "--tracking-uri", uri]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"onnx format, {how};" in line and f"{how}: accuracy " in line and "of predictions as fp32" in line
    meta = json.loads((out / ONNX_META).read_text(encoding="utf-8"))
    q = meta["checks"]["quantized"]
    assert meta["quantization"]["method"] in (how, "weight-int4") and q["rows"] == 256
    assert q["metric_torch"] - q["metric_onnx"] <= 1.0 and q["agreement"] >= 90
    ops = {n.op_type for n in __import__("onnx").load(str(out / ONNX_FILE)).graph.node}
    want = {"dynamic-int8": "MatMulInteger", "static-int8": "QuantizeLinear", "int4": "MatMulNBits"}[how]
    assert want in ops
    if how == "dynamic-int8":
        assert "ablate's dynamic-int8 (torch.ao)" in line and q["agreement_ablate"] >= 90
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_a_quantized_run_exports_in_its_own_form_checked_against_the_model_it_scored(sst2_run, capsys):
    """A fine-tuning run quantized dynamic int8 (``quant.method``) is written as ORT's dynamic int8 graph by
    default, and checked against the run's own quantized model (``model/quantized.safetensors``), not only fp32;
    another ``--quantize`` for it is refused; a plan of several widths has no MatMulNBits form."""
    tmp, uri, run_id = sst2_run
    source = tmp / "source"
    tree = {
        "model": MODEL,
        "finetune": {"source": str(source), "task": "sst2", "train": "nyu-mll/glue:sst2", "max_length": 48},
        "quant": {"method": "dynamic-int8"},
        "data": {"num_workers": 0},
        "trainer": {"measure": False, "progress": False},
        "tracking": {"root": str(tmp / "runs")},
    }
    tree["finetune"] |= {"batch_size": 32, "max_steps": 20, "val_every": 20, "validation_examples": 256}
    quantized_run = train(build_config(tree)).run_id
    out = tmp / "own-form"
    assert main(["export", quantized_run, str(out), "--format", "onnx", "--tracking-uri", uri]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "onnx format, dynamic-int8;" in line and "the run's own dynamic-int8 model" in line
    q = json.loads((out / ONNX_META).read_text(encoding="utf-8"))["checks"]["quantized"]
    assert abs(q["metric_onnx"] - q["metric_ablate_quantized"]) <= 1.0 and q["agreement_ablate"] >= 90
    again = [
        "export",
        quantized_run,
        str(tmp / "other"),
        "--format",
        "onnx",
        "--quantize",
        "int4",
        "--tracking-uri",
        uri,
    ]
    assert main(again) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --quantize int4: run ") and "its ONNX form is --quantize dynamic-int8" in err
    assert not (tmp / "other").exists()
    with pytest.raises(ConfigError, match="gives its layers 2, 4 bits"):
        run_form("weight-mixed", {"a": 2, "b": 4})
    assert run_form("qat-int8", {}) == "static-int8" and run_form("weight-mixed", {"a": 4}) == "weight-int4"


def test_a_span_model_exports_start_and_end_logits(tmp_path):
    if not SQUAD.is_file():
        pytest.skip(f"shared SQuAD data not found at {SQUAD}")
    tree = {
        "model": MODEL,
        "finetune": {
            "source": str(tmp_path / "unused"),
            "task": "squad",
            "kind": "span",
            "metric": "f1",
            "train": str(SQUAD),
            "validation": str(SQUAD),
            "max_length": 64,
            "max_query_length": 20,
            "doc_stride": 24,
        },
    }
    cfg = build_config(tree)
    texts = [line for line in SQUAD.read_text(encoding="utf-8")[:400_000].split(". ")]
    tok = _tokenizer(tmp_path, texts)
    torch.manual_seed(0)
    model = build_span_model(build_pretraining_model(cfg.model, cfg.objective), 0.02).eval()
    rows = task_rows(cfg.finetune, tok, dev_rows=48)
    done = export_onnx(model, cfg, tmp_path / "qa", rows, tokenizer=tok)
    assert done.parity.max_abs_diff is not None and done.parity.max_abs_diff <= 1e-4 and done.parity.rows == 48
    meta = json.loads((tmp_path / "qa" / ONNX_META).read_text(encoding="utf-8"))
    assert list(meta["outputs"]) == ["start_logits", "end_logits"] and meta["kind"] == "span"
    start, end = session(tmp_path / "qa" / ONNX_FILE).run(None, feed(rows.dev[0]))
    assert start.shape == end.shape == tuple(rows.dev[0]["input_ids"].shape)


def test_refusals_are_one_line_and_write_nothing(sst2_run, capsys):
    tmp, uri, run_id = sst2_run
    cases = [
        (["--format", "transformers", "--quantize", "dynamic-int8"], "the transformers format holds float weights"),
        (["--format", "onnx", "--quantize", "int3"], "MatMulNBits holds 2, 4, 8-bit weights, not 3-bit"),
        (["--format", "onnx", "--quantize", "fp8"], "--quantize: 'fp8' is not one of"),
    ]
    for i, (flags, message) in enumerate(cases):
        out = tmp / f"refused-{i}"
        assert main(["export", run_id, str(out), *flags, "--tracking-uri", uri]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
        assert not out.exists()
    # a pre-training run has no classifier or span head to export
    client = tracking.connect(uri)
    pre = tracking.start_run(client, tracking.experiment_id(client, "pretrain", uri), "pre", {})
    client.log_param(pre, "regime", "pretrain")
    tracking.end_run(client, pre, "FINISHED")
    assert main(["export", pre, str(tmp / "refused-pre"), "--format", "onnx", "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a pre-training run; ONNX exports a fine-tuned classifier or span model" in err[0]
    assert not (tmp / "refused-pre").exists()


def test_fastbert_exits_are_left_out_and_the_line_says_so(sst2_run):
    tmp, uri, run_id = sst2_run
    cfg, model = load_run_classifier(uri, run_id)
    model.exits = torch.nn.ModuleList([new_head(64, 2, 0.1, 0.02)])  # an exit after layer 1 of 2
    rows = task_rows(cfg.finetune, run_tokenizer(tracking.connect(uri), run_id, tmp), dev_rows=32)
    done = export_onnx(model, cfg, tmp / "exits", rows)
    assert NO_EXITS in done.describe() and done.parity.rows == 32
    assert json.loads((tmp / "exits" / ONNX_META).read_text(encoding="utf-8"))["early_exits"] == "not exported"


def test_without_the_onnx_extra_the_export_names_it(sst2_run, tmp_path):
    _, uri, run_id = sst2_run
    args = ["export", run_id, str(tmp_path / "out"), "--format", "onnx", "--tracking-uri", uri]
    code = "import sys; sys.modules['onnxruntime'] = None; sys.modules['onnx'] = None\nfrom ablate.cli import main\n"
    code += f"sys.exit(main({args!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("error: --format onnx needs the onnx extra: ")
    assert "'.[onnx]'" in err[0] and not (tmp_path / "out").exists()
