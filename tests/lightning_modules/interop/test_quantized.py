"""A quantized model written as integers and scales and read back: every method's layers, the same
outputs bit for bit, integer dtypes in the file, 4-bit codes packed, dequantized weights, bad files."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from ablate.lightning_modules.config.errors import DataError
from ablate.lightning_modules.config.experiment import ExperimentConfig, to_yaml
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.interop.pretrained import state_dict
from ablate.lightning_modules.interop.quantized import (
    QUANT_YAML,
    QUANTIZED,
    dequantized,
    pack,
    read_quantized,
    unpack,
    write_quantized,
)
from ablate.lightning_modules.methods.quantization.apply import quantize, quantized_layers, targets
from ablate.lightning_modules.model.classifier import build_classifier
from ablate.lightning_modules.model.heads import build_pretraining_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MODEL = {"preset": "bert-tiny", "vocab_size": 300, "embed_dim": 32, "hidden_dim": 32, "num_layers": 2}
MODEL.update(num_heads=2, ffn_dim=64, max_position=32, dropout=0.0)


def _cfg(quant: dict, finetune: bool = False) -> ExperimentConfig:
    tree: dict = {"model": MODEL, "quant": quant}
    if finetune:
        tree["finetune"] = {"source": "runs:/0123", "num_labels": 3}
    return build_config(tree)


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (3, 16), generator=g)
    labels = torch.where(torch.arange(16) % 4 == 1, ids, torch.full_like(ids, -100))
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "token_type_ids": torch.zeros_like(ids),
        "mlm_labels": labels,
        "sentence_label": torch.zeros(3, dtype=torch.long),
    }


def _saved(cfg: ExperimentConfig, folder: Path, plan: dict[str, int] | None = None) -> torch.nn.Module:
    """A random float model of ``cfg`` as a run's ``model/`` folder (float weights, config), quantized
    and written beside it; the quantized model."""
    torch.manual_seed(0)
    if cfg.regime == "finetune":
        model = build_classifier(build_pretraining_model(cfg.model, cfg.objective), 3, 0.0, 0.5)
    else:
        model = build_pretraining_model(cfg.model, cfg.objective)
    model.eval()
    folder.mkdir(parents=True)
    save_file(state_dict(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    quantized = quantize(copy.deepcopy(model), cfg.quant, plan)
    write_quantized(quantized, cfg, plan, None, folder)
    return quantized


def _out(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        out = model(batch)
    return out if isinstance(out, torch.Tensor) else out.mlm_logits


CASES = {
    "dynamic-int8": ({"method": "dynamic-int8"}, True),
    "qat-int8": ({"method": "qat-int8"}, True),
    "weight-int4+int8 tables": ({"method": "weight-int4", "embeddings": "int8", "group_size": 16}, False),
    "weight-int8 classifier": ({"method": "weight-int8", "group_size": 16}, True),
}


@pytest.mark.parametrize("case", CASES)
def test_a_quantized_model_reads_back_bit_for_bit(case, tmp_path):
    quant, finetune = CASES[case]
    cfg = _cfg(quant, finetune)
    quantized = _saved(cfg, tmp_path / "model")
    loaded = read_quantized(tmp_path / "model")
    assert type(loaded.model) is type(quantized) and loaded.cfg.quant == cfg.quant
    assert sorted(loaded.layers) == sorted(quantized_layers(quantized)) == sorted(loaded.plan)
    batch = _batch()
    assert torch.equal(_out(loaded.model, batch), _out(quantized, batch))
    with safe_open(str(tmp_path / "model" / QUANTIZED), "pt") as f:
        for name, entry in loaded.layers.items():
            qdata = f.get_tensor(f"{name}.weight.qdata")
            want = torch.uint8 if entry["bits"] <= 4 else torch.int8
            assert qdata.dtype == want, (name, qdata.dtype)
            assert f.get_tensor(f"{name}.weight.zero_point").dtype in (torch.int8, torch.int64)
    meta = yaml.safe_load((tmp_path / "model" / QUANT_YAML).read_text())
    assert meta["method"] == cfg.quant.method and set(meta["layers"]) == set(loaded.layers)


def test_a_mixed_plan_keeps_each_layers_bits_and_packs_the_low_ones(tmp_path):
    cfg = _cfg({"method": "weight-mixed", "low_bits": 2, "high_bits": 8, "group_size": 16})
    names = sorted(targets(build_pretraining_model(cfg.model, cfg.objective)))
    plan = {n: (8 if i % 3 == 0 else 2) for i, n in enumerate(names)}
    quantized = _saved(cfg, tmp_path / "model", plan)
    loaded = read_quantized(tmp_path / "model")
    assert loaded.plan == plan
    assert torch.equal(_out(loaded.model, _batch()), _out(quantized, _batch()))
    two = next(n for n in names if plan[n] == 2)
    with safe_open(str(tmp_path / "model" / QUANTIZED), "pt") as f:
        packed = f.get_tensor(f"{two}.weight.qdata")
    shape = loaded.layers[two]["shape"]
    assert packed.numel() == (shape[0] * shape[1] + 1) // 2  # two codes per byte
    codes = unpack(packed, tuple(shape))
    assert codes.min() >= -2 and codes.max() <= 1  # 2-bit codes


def test_pack_round_trips_odd_counts():
    codes = torch.randint(-8, 8, (7, 3), dtype=torch.int8)
    assert torch.equal(unpack(pack(codes), (7, 3)), codes)


def test_dequantized_weights_give_a_weight_only_models_outputs(tmp_path):
    cfg = _cfg({"method": "weight-int4", "group_size": 16}, finetune=True)
    quantized = _saved(cfg, tmp_path / "model")
    _, teacher = dequantized(tmp_path / "model")
    assert not quantized_layers(teacher)  # a float model
    assert torch.allclose(_out(teacher, _batch()), _out(quantized, _batch()), atol=1e-5)


def test_a_layer_stored_otherwise_than_the_run_builds_is_a_data_error(tmp_path):
    cfg = _cfg({"method": "weight-int4", "group_size": 16})
    _saved(cfg, tmp_path / "model")
    path = tmp_path / "model" / QUANT_YAML
    meta = yaml.safe_load(path.read_text())
    first = next(iter(meta["layers"]))
    meta["layers"][first]["bits"] = 8
    path.write_text(yaml.safe_dump(meta))
    with pytest.raises(DataError, match=rf"quantized\.safetensors: layer {first} was stored as torchao 8-bit"):
        read_quantized(tmp_path / "model")
    path.write_text("layers: 3\n")
    with pytest.raises(DataError, match="not a quantized model's description"):
        read_quantized(tmp_path / "model")
