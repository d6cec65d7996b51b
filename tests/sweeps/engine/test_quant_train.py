"""Quantization end to end: a tiny model trained on real text, quantized by a run of its own (the
``quant`` regime) and as the last step of a training run, refused as a source and by export,
fine-tuned with a quantized classifier; ``ablate params`` sizing quantized models."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.datamodules.pretrain import PretrainDataModule
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ObjectiveConfig
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.config.quant import QuantConfig
from ablate.lightning_modules.interop.export import export
from ablate.lightning_modules.methods.pretrain import PretrainModule
from ablate.lightning_modules.methods.quantization.apply import QuantizationNotApplied, quantize, targets
from ablate.lightning_modules.model.heads import build_pretraining_model
from ablate.sweeps.engine import weights
from ablate.sweeps.engine.quant import mlm_loss, on_cpu, quantized_model, validate
from ablate.sweeps.engine.runner import train
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import tiny_base

SST2 = SHARED_DATA / "sst2"
MODEL = {
    "preset": "bert-tiny",
    "vocab_size": 1000,
    "embed_dim": 64,
    "hidden_dim": 64,
    "num_layers": 2,
    "num_heads": 2,
    "ffn_dim": 128,
    "max_position": 64,
    "dropout": 0.0,
}


def _tree(base: dict, **sections) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree.update(sections)
    return tree


@pytest.fixture(scope="module")
def source(tmp_path_factory, wiki_validation):
    """A tiny float model trained for 20 steps: the base tree and its RunResult."""
    tmp = tmp_path_factory.mktemp("quant")
    base = tiny_base(tmp, wiki_validation)
    base["model"] = MODEL
    base["trainer"].update(max_steps=20, val_every=10, val_batches=2, measure=False)
    return tmp, base, train(build_config(base))


@pytest.fixture(scope="module")
def quantized(source):
    """``source`` quantized by a ``quant`` run (dynamic int8). Its config's model section is not the
    source's: the run takes the source's architecture."""
    _, base, src = source
    other = {**MODEL, "hidden_dim": 128, "embed_dim": 128, "num_layers": 4, "ffn_dim": 256}
    tree = _tree(base, model=other, quant={"source": f"runs:/{src.run_id}", "method": "dynamic-int8"})
    return train(build_config(tree))


def _runs(result) -> int:
    client = MlflowClient(result.tracking_uri)
    return len(client.search_runs([client.get_run(result.run_id).info.experiment_id]))


def test_a_quant_run_quantizes_its_source(source, quantized):
    _, _, src = source
    client = MlflowClient(quantized.tracking_uri)
    run, trained = client.get_run(quantized.run_id), client.get_run(src.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.source_run"] == src.run_id
    m, p = run.data.metrics, run.data.params
    assert p["regime"] == "quant" and p["quant.method"] == "dynamic-int8" and p["quant.source"] == f"runs:/{src.run_id}"
    # the architecture logged is the source's, not the config's model section
    source_model = {k: v for k, v in trained.data.params.items() if k.startswith("model.")}
    assert {k: v for k, v in p.items() if k.startswith("model.")} == source_model and p["model.hidden_dim"] == "64"
    # smaller: the float model's bytes are the source's
    assert m["quant/fp32_model_bytes"] == trained.data.metrics["model_bytes"]
    assert m["model_bytes"] < 0.8 * m["quant/fp32_model_bytes"]
    assert m["quant/avg_bits"] == 8.0
    # evaluated before and after
    for name in ("val/mlm_acc", "val/mlm_loss", "quant/fp32_mlm_acc", "quant/fp32_mlm_loss"):
        assert name in m, name
    assert 0.0 <= m["val/mlm_acc"] <= 1.0 and 0.0 <= m["quant/fp32_mlm_acc"] <= 1.0
    assert m["quant/mlm_acc_drop"] == pytest.approx(m["quant/fp32_mlm_acc"] - m["val/mlm_acc"], abs=1e-12)
    assert m["val/mlm_loss"] != m["quant/fp32_mlm_loss"]  # a different model ...
    assert m["val/mlm_loss"] == pytest.approx(m["quant/fp32_mlm_loss"], rel=0.05)  # ... close to the float one
    assert quantized.metrics["val/mlm_acc"] == m["val/mlm_acc"]
    # its model/ artifacts are the float weights and its config, with the tokenizer
    names = {a.path for a in client.list_artifacts(quantized.run_id, "model")}
    assert {"model/model.safetensors", "model/config.yaml", "model/tokenizer.json"} <= names


def test_quant_method_none_evaluates_the_source_as_the_float_arm(source, quantized):
    """The uncompressed arm of a quantization study (``quant.method: none``): the source evaluated as the
    quantized arms are, on the CPU in float32, its bytes and latency measured; nothing claimed quantized;
    its weights kept, so that its tasks fine-tune it like any arm's."""
    _, base, src = source
    tree = _tree(base, quant={"source": f"runs:/{src.run_id}", "method": "none"})
    tree["trainer"]["measure"] = True
    result = train(build_config(tree))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    m = run.data.metrics
    assert run.info.status == "FINISHED" and m["quant/layers"] == 0.0
    assert m["model_bytes"] == client.get_run(src.run_id).data.metrics["model_bytes"]  # the float model's
    assert m["latency_ms_b32"] > 0 and 0.0 <= m["val/mlm_acc"] <= 1.0
    # scored as the dynamic-int8 arm scores its float model: the same batches, the same numbers
    assert m["val/mlm_loss"] == client.get_run(quantized.run_id).data.metrics["quant/fp32_mlm_loss"]
    assert not any(k.startswith("quant/fp32_") or k == "quant/avg_bits" for k in m)
    names = {a.path for a in client.list_artifacts(result.run_id, "model")}
    assert {"model/model.safetensors", "model/config.yaml"} <= names


def test_the_quant_run_evaluates_the_float_model_as_its_source_run_did(source, quantized):
    """The same validation batches: the float model scores what its own run scored at its end."""
    _, _, src = source
    client = MlflowClient(quantized.tracking_uri)
    before = client.get_run(src.run_id).data.metrics
    after = client.get_run(quantized.run_id).data.metrics
    assert after["quant/fp32_mlm_loss"] == pytest.approx(before["val/mlm_loss"], rel=1e-4)
    assert after["quant/fp32_mlm_acc"] == pytest.approx(before["val/mlm_acc"], abs=1e-6)


def test_weight_mixed_logs_its_plan(source, tmp_path):
    _, base, src = source
    q = {"source": f"runs:/{src.run_id}", "method": "weight-mixed", "low_bits": 2, "high_bits": 8}
    result = train(build_config(_tree(base, quant={**q, "high_fraction": 0.4, "calib_batches": 2})))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert {k: run.data.params[f"quant.{k}"] for k in ("low_bits", "high_bits", "high_fraction", "rank")} == {
        "low_bits": "2",
        "high_bits": "8",
        "high_fraction": "0.4",
        "rank": "sensitivity",
    }
    plan = pd.read_csv(client.download_artifacts(result.run_id, "quant/plan.csv", str(tmp_path)))
    model = build_pretraining_model(build_config(base).model, ObjectiveConfig())
    layers = targets(model)
    assert sorted(plan["layer"]) == sorted(layers)  # one row per quantized layer
    assert set(plan["bits"]) == {2, 8}
    assert dict(zip(plan["layer"], plan["weights"], strict=True)) == {n: m.weight.numel() for n, m in layers.items()}
    high = plan.loc[plan["bits"] == 8, "weights"].sum()
    assert high <= 0.4 * plan["weights"].sum()
    avg = run.data.metrics["quant/avg_bits"]
    assert 2 < avg < 8 and avg == pytest.approx((plan["weights"] * plan["bits"]).sum() / plan["weights"].sum())
    assert run.data.metrics["model_bytes"] < run.data.metrics["quant/fp32_model_bytes"]


def test_a_training_run_ends_quantized(source):
    """quant.method without a source: the run trains a float model, then quantizes it; the
    quantized model's metrics are the run's final ones."""
    _, base, _ = source
    tree = _tree(base, quant={"method": "weight-int8"})
    tree["trainer"].update(max_steps=10, val_every=10)
    result = train(build_config(tree))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    m = run.data.metrics
    assert run.info.status == "FINISHED" and run.data.params["regime"] == "pretrain"
    assert run.data.params["quant.method"] == "weight-int8" and run.data.params["quant.group_size"] == "32"
    assert m["quant/avg_bits"] == 8.0 and m["model_bytes"] < m["quant/fp32_model_bytes"]
    # the model scored held int8 weights in every encoder Linear
    assert m["quant/layers"] == len(targets(build_pretraining_model(build_config(base).model, ObjectiveConfig())))
    # the float model's score was logged at the end of training (Lightning: step 9), the quantized one's
    # after it (step 10): the latest value, which MLflow reports as the run's
    history = sorted(client.get_metric_history(result.run_id, "val/mlm_loss"), key=lambda x: (x.step, x.timestamp))
    *_, fp32, last = history
    assert 9 <= fp32.step <= last.step == 10 and fp32.timestamp < last.timestamp
    assert fp32.value == m["quant/fp32_mlm_loss"] and last.value == m["val/mlm_loss"] == result.metrics["val/mlm_loss"]
    # the run's final value is the quantized model's: its float weights (model/), quantized as its config
    # says, score it on its validation batches. Not `last.value != fp32.value`: after 10 steps int8 moves
    # this loss by a few float32 ulps (about 1e-6), and in 2 of 58 models tried the two batches' changes
    # cancelled to the same float32 (the model differs from one process to the next with the WordPiece
    # vocabulary the tokenizers library trains: its merges depend on hash-map order)
    cfg, trained = weights.load_run_weights(result.tracking_uri, result.run_id)
    data = PretrainDataModule(
        cfg.data, cfg.objective, cfg.model.vocab_size, cfg.seed, val_batches=cfg.trainer.val_batches
    )
    data.prepare_data()
    quantized, _ = quantized_model(trained, cfg, data, mlm_loss)
    eval_cfg = on_cpu(cfg)
    assert validate(PretrainModule(eval_cfg, quantized), eval_cfg, data)["val/mlm_loss"] == last.value
    assert m["quant/mlm_acc_drop"] == pytest.approx(m["quant/fp32_mlm_acc"] - m["val/mlm_acc"], abs=1e-12)


def test_a_quantization_that_leaves_layers_float_is_an_error(monkeypatch):
    """A library skipping layers without raising (torchao returns some weights unchanged) must not
    leave a float model to be scored as the quantized one: the error names the layers left."""
    import torchao.quantization

    model = build_pretraining_model(build_config({"model": MODEL}).model, ObjectiveConfig())
    names = sorted(targets(model))
    skipped = set(names[:2])  # a quantize_ that skips two of the layers it is given

    def partly(module, config, filter_fn=None, **kwargs):
        keep = filter_fn or (lambda m, fqn: True)
        return quantize_(module, config, filter_fn=lambda m, fqn: keep(m, fqn) and fqn not in skipped, **kwargs)

    quantize_ = torchao.quantization.quantize_
    monkeypatch.setattr(torchao.quantization, "quantize_", partly)
    with pytest.raises(QuantizationNotApplied, match=r"^quant\.method: weight-int8: 2 of the 8 layers") as err:
        quantize(model, QuantConfig(method="weight-int8"))
    assert all(name in str(err.value) for name in skipped) and "\n" not in str(err.value)
    monkeypatch.setattr(torchao.quantization, "quantize_", lambda module, *a, **k: module)  # skips every layer
    with pytest.raises(QuantizationNotApplied, match="8 of the 8 layers"):
        quantize(
            build_pretraining_model(build_config({"model": MODEL}).model, ObjectiveConfig()),
            QuantConfig(method="weight-int8"),
        )


@pytest.mark.parametrize(
    ("field", "section"),
    [("prune.source", "prune"), ("quant.source", "quant")],
)
def test_a_quantized_run_is_no_source(source, quantized, field, section):
    """Pruned or quantized again, a quantized run's rounded weights are refused; the message names its
    source (a teacher learns from its dequantized model: tests/sweeps/engine/test_quant_stored.py)."""
    _, base, src = source
    key = field.split(".")[1]
    extra = {"method": "dynamic-int8"} if section == "quant" else {}
    tree = _tree(base, **{section: {key: f"runs:/{quantized.run_id}", **extra}})
    before = _runs(quantized)
    with pytest.raises(ConfigError) as err:
        train(build_config(tree))
    message = str(err.value)
    assert message.startswith(f"{field}: runs:/{quantized.run_id} is quantized"), message
    assert f"start from the model it quantized (runs:/{src.run_id})" in message and "\n" not in message
    assert _runs(quantized) == before  # refused before a run exists


def test_a_source_with_fewer_positions_than_the_data_is_refused_before_the_run(source, tmp_path):
    _, base, src = source
    short = build_config({"model": {**MODEL, "max_position": 32}})
    folder = tmp_path / "short"  # an ablate export with 32 positions; the runs' data.max_length is 64
    export(build_pretraining_model(short.model, short.objective), short, folder, format="ablate")
    before = _runs(src)
    with pytest.raises(ConfigError, match=r"^quant\.source: .*data\.max_length"):
        train(build_config(_tree(base, quant={"source": str(folder), "method": "dynamic-int8"})))
    assert _runs(src) == before


def test_a_quantized_run_is_not_exported(quantized, tmp_path):
    out = tmp_path / "export" / "model"
    with pytest.raises(ConfigError) as err:
        weights.export_run(quantized.tracking_uri, quantized.run_id, out)
    assert str(err.value).startswith("quant.method: dynamic-int8"), str(err.value)
    assert not out.exists() and (not out.parent.exists() or not any(out.parent.iterdir()))


def test_finetuning_a_quantized_run_quantizes_the_classifier(source, quantized):
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tmp, base, _ = source
    for split, rows in (("train", 400), ("validation", 200)):
        lines = (SST2 / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        (tmp / f"sst2-{split}.tsv").write_text("\n".join(lines[: rows + 1]) + "\n", encoding="utf-8")
    task = {
        "source": f"runs:/{quantized.run_id}",  # a quantized run: its float weights, quantized again here
        "task": "sst2",
        "train": str(tmp / "sst2-train.tsv"),
        "validation": str(tmp / "sst2-validation.tsv"),
        "max_length": 48,
        "batch_size": 32,
        "lr": 1e-3,
        "max_steps": 6,
        "val_every": 6,
        "patience": 3,
    }
    result = train(build_config(_tree(base, finetune=task, quant={"method": "dynamic-int8"})))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    m = run.data.metrics
    assert run.info.status == "FINISHED" and run.data.tags["ablate.source_run"] == quantized.run_id
    assert run.data.params["quant.method"] == "dynamic-int8"
    assert 0.0 <= m["sst2/final_accuracy"] <= 1.0 and m["sst2/final_accuracy"] == result.metrics["sst2/final_accuracy"]
    assert m["sst2/fp32_accuracy"] == m["sst2/best_accuracy"]  # the float classifier it leaves: its best validation
    assert m["quant/avg_bits"] == 8.0
    # the classifier (encoder + pooler + classifier) with an int8 encoder: smaller than the float pre-trained model
    fp32_bytes = client.get_run(quantized.run_id).data.metrics["quant/fp32_model_bytes"]
    assert 0 < m["model_bytes"] < 0.8 * fp32_bytes


def test_qbert_fine_tunes_then_trains_quantization_aware_at_2_and_4_bits(source, tmp_path):
    """Q-BERT on a fine-tuning run: the plan by the Hessian of the task loss on the fine-tuned
    classifier (2/4 bits), 8-bit embeddings, quantization-aware steps, then converted and scored."""
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tmp, base, src = source
    for split, rows in (("train", 400), ("validation", 200)):
        lines = (SST2 / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        (tmp / f"qbert-{split}.tsv").write_text("\n".join(lines[: rows + 1]) + "\n", encoding="utf-8")
    task = {
        "source": f"runs:/{src.run_id}",
        "task": "sst2",
        "train": str(tmp / "qbert-train.tsv"),
        "validation": str(tmp / "qbert-validation.tsv"),
        "max_length": 48,
        "batch_size": 32,
        "lr": 1e-3,
        "max_steps": 6,
        "val_every": 3,
        "patience": 3,
    }
    quant = {
        "method": "weight-mixed",
        "sensitivity": "hessian",
        "hessian_iters": 8,
        "low_bits": 2,
        "high_bits": 4,
        "high_fraction": 0.3,
        "calib_batches": 2,
        "embeddings": "int8",
        "qat_steps": 6,
    }
    result = train(build_config(_tree(base, finetune=task, quant=quant)))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    m, params = run.data.metrics, run.data.params
    assert run.info.status == "FINISHED"
    assert params["quant.sensitivity"] == "hessian" and params["quant.qat_steps"] == "6"
    assert params["quant.embeddings"] == "int8"
    history = client.get_metric_history(result.run_id, "sst2/accuracy")
    assert len(history) >= 4  # scored while fine-tuning and again while training quantization-aware
    plan = pd.read_csv(client.download_artifacts(result.run_id, "quant/plan.csv", str(tmp_path)))
    assert set(plan["bits"]) == {2, 4} and plan["eigenvalue_mean"].notna().all()
    assert 2 < m["quant/avg_bits"] < 4
    assert 0.0 <= m["sst2/final_accuracy"] <= 1.0 and m["sst2/fp32_accuracy"] > 0
    classifier = weights.load_run_classifier(result.tracking_uri, result.run_id)[1]  # float, as trained
    fp32 = sum(p.numel() * 4 for p in classifier.parameters())
    assert m["model_bytes"] < 0.3 * fp32


def test_a_quant_run_trains_quantization_aware_at_4_bits(source):
    _, base, src = source
    q = {"source": f"runs:/{src.run_id}", "method": "weight-int4", "qat_steps": 4, "embeddings": "int4"}
    result = train(build_config(_tree(base, quant=q)))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    m = run.data.metrics
    assert run.info.status == "FINISHED" and m["quant/avg_bits"] == 4.0
    assert len(client.get_metric_history(result.run_id, "train/loss")) >= 1  # it trained
    assert m["model_bytes"] < 0.25 * m["quant/fp32_model_bytes"]
    assert m["val/mlm_acc"] >= 0 and "quant/mlm_acc_drop" in m


def _params_json(capsys, *overrides: str) -> dict:
    assert main(["params", "bert-tiny", *overrides, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_params_sizes_a_quantized_model(capsys):
    fp32 = _params_json(capsys)
    int4 = _params_json(capsys, "quant.method=weight-int4")
    int8 = _params_json(capsys, "quant.method=dynamic-int8")
    qat = _params_json(capsys, "quant.method=qat-int8")  # the int8 layers its training ends with, not the float ones
    assert int4["model_bytes"] < int8["model_bytes"] < fp32["model_bytes"]
    assert qat["model_bytes"] < 0.8 * fp32["model_bytes"]
    assert fp32["model_bytes"] == 4 * (fp32["backbone"] + fp32["heads"])  # fp32, decoder tied
    int4.pop("model_bytes"), fp32.pop("model_bytes")
    assert int4 == fp32  # the same counts otherwise


def test_params_refuses_weight_mixed(capsys):
    assert main(["params", "bert-tiny", "quant.method=weight-mixed"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: quant.method: weight-mixed"), lines
    assert captured.out == ""
