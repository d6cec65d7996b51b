"""A quantized run keeps its quantized model: ``model/quantized.safetensors`` with integer weights and
``model/quantization.yaml``, rebuilt by ``load_quantized`` and scored again to the logged metric (the
``quant`` regime, and Q-BERT's QAT in a fine-tuning run); a quantized run as a source and a teacher."""

from __future__ import annotations

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from safetensors import safe_open

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.methods.quantization.apply import quantized_layers
from ablate.sweeps.engine import weights
from ablate.sweeps.engine.rescore import rescore_quantized
from ablate.sweeps.engine.runner import train
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import tiny_base

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SST2 = SHARED_DATA / "sst2"
MODEL = {"preset": "bert-tiny", "vocab_size": 1000, "embed_dim": 32, "hidden_dim": 32, "num_layers": 2}
MODEL.update(num_heads=2, ffn_dim=64, max_position=64, dropout=0.0)


@pytest.fixture(scope="module")
def source(tmp_path_factory, wiki_validation):
    tmp = tmp_path_factory.mktemp("stored")
    base = tiny_base(tmp, wiki_validation)
    base["model"] = MODEL
    base["trainer"].update(max_steps=10, val_every=10, val_batches=2, measure=False)
    return tmp, base, train(build_config(base))


def _tree(base: dict, **sections) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree.update(sections)
    return tree


def _artifacts(result) -> set[str]:
    client = MlflowClient(result.tracking_uri)
    return {a.path for a in client.list_artifacts(result.run_id, "model")}


def test_a_quant_run_keeps_its_int8_model_and_scores_it_again(source, tmp_path):
    _, base, src = source
    quant = {"source": f"runs:/{src.run_id}", "method": "dynamic-int8"}
    result = train(build_config(_tree(base, quant=quant)))
    assert {"model/quantized.safetensors", "model/quantization.yaml", "model/model.safetensors"} <= _artifacts(result)
    client = MlflowClient(result.tracking_uri)
    local = client.download_artifacts(result.run_id, "model/quantized.safetensors", str(tmp_path))
    stored = weights.load_quantized(result.tracking_uri, result.run_id)
    assert stored.method == "dynamic-int8" and set(stored.plan.values()) == {8}
    assert len(stored.layers) == len(quantized_layers(stored.model)) == result.metrics["quant/layers"]
    with safe_open(local, "pt") as f:
        assert all(f.get_tensor(f"{n}.weight.qdata").dtype == torch.int8 for n in stored.layers)
    again = rescore_quantized(result.tracking_uri, result.run_id)
    assert again["val/mlm_acc"] == pytest.approx(result.metrics["val/mlm_acc"], abs=1e-6)
    assert again["val/mlm_loss"] == pytest.approx(result.metrics["val/mlm_loss"], rel=1e-5)
    # a quantized run is no source to quantize again; the message names what to start from
    with pytest.raises(ConfigError, match=rf"^quant\.source: runs:/{result.run_id} is quantized .*runs:/{src.run_id}"):
        train(build_config(_tree(base, quant={"source": f"runs:/{result.run_id}", "method": "weight-int4"})))


def test_qbert_in_a_finetuning_run_keeps_its_low_bit_classifier(source, tmp_path):
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tmp, base, src = source
    for split, rows in (("train", 200), ("validation", 120)):
        lines = (SST2 / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        (tmp / f"stored-{split}.tsv").write_text("\n".join(lines[: rows + 1]) + "\n", encoding="utf-8")
    task = {
        "source": f"runs:/{src.run_id}",
        "task": "sst2",
        "train": str(tmp / "stored-train.tsv"),
        "validation": str(tmp / "stored-validation.tsv"),
        "max_length": 32,
        "batch_size": 32,
        "lr": 1e-3,
        "max_steps": 4,
        "val_every": 4,
        "patience": 2,
    }
    quant = {"method": "weight-int4", "group_size": 16, "embeddings": "int8", "qat_steps": 2}
    result = train(build_config(_tree(base, finetune=task, quant=quant)))
    assert {"model/quantized.safetensors", "model/quantization.yaml"} <= _artifacts(result)
    stored = weights.load_quantized(result.tracking_uri, result.run_id)
    tables = {n for n, e in stored.layers.items() if e["bits"] == 8}
    assert tables == {"encoder.embeddings.word", "encoder.embeddings.token_type"}
    assert {e["bits"] for n, e in stored.layers.items() if n not in tables} == {4}
    # the logged quantized score (the summary keeps the quantize finisher's <task>/final_<metric>); the
    # bit-for-bit check is tests/lightning_modules/interop/test_quantized.py
    logged = result.metrics["sst2/final_accuracy"]
    assert rescore_quantized(result.tracking_uri, result.run_id)["sst2/final_accuracy"] == pytest.approx(logged)
    # a teacher learns from its dequantized weights: the same logits as the weight-only classifier
    _, teacher = weights.load_dequantized(result.tracking_uri, result.run_id)
    ids = torch.randint(5, 1000, (2, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool)}
    batch["token_type_ids"] = torch.zeros_like(ids)
    with torch.inference_mode():
        assert torch.allclose(teacher(batch), stored.model(batch), atol=1e-5)
    # a run that is not quantized has no quantized model
    with pytest.raises(ConfigError, match=rf"^runs:/{src.run_id} is not quantized"):
        weights.load_quantized(src.tracking_uri, src.run_id)
