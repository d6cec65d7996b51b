"""A fine-tuned Classifier <-> transformers ``*ForSequenceClassification``: equal logits both ways for
BERT, ALBERT and MobileBERT; exports of either format load back with ``load_classifier``."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ablate.lightning_modules.config.errors import ConfigError  # noqa: E402
from ablate.lightning_modules.config.experiment import ExperimentConfig  # noqa: E402
from ablate.lightning_modules.config.load import build_config  # noqa: E402
from ablate.lightning_modules.interop.classifier import (  # noqa: E402
    from_transformers_classifier,
    load_classifier,  # noqa: E402
    to_transformers_classifier,
)
from ablate.lightning_modules.interop.export import export  # noqa: E402
from ablate.lightning_modules.interop.pretrained import load_pretrained  # noqa: E402
from ablate.lightning_modules.model.classifier import Classifier, build_classifier  # noqa: E402
from ablate.lightning_modules.model.heads import build_pretraining_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TOL = 1e-4
PRESETS = {
    "bert-tiny": "BertForSequenceClassification",
    "albert-tiny": "AlbertForSequenceClassification",
    "mobilebert-mini": "MobileBertForSequenceClassification",
}


def _config(preset: str, num_labels: int = 3, **model: object) -> ExperimentConfig:
    """A fine-tuning run's config (the source is only named: nothing reads it here)."""
    return build_config(
        {"model": {"preset": preset, **model}, "finetune": {"source": "runs:/0123", "num_labels": num_labels}}
    )


def _classifier(cfg: ExperimentConfig, seed: int = 0) -> Classifier:
    """A classifier as fine-tuning builds it, every weight moved off its initial value (so a swap shows)."""
    torch.manual_seed(seed)
    pretrained = build_pretraining_model(cfg.model, cfg.objective)
    model = build_classifier(pretrained, cfg.finetune.num_labels, dropout=0.1, init_std=0.5)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((0.1 if p.ndim == 1 else 0.02) * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 8192, (4, 24), generator=g)
    ids[:, 0] = 2  # [CLS]
    mask = torch.ones(4, 24, dtype=torch.bool)
    mask[1, 15:] = False
    mask[2, 7:] = False
    types = torch.zeros(4, 24, dtype=torch.long)
    types[:, 12:] = 1
    return {"input_ids": ids.masked_fill(~mask, 0), "token_type_ids": types * mask, "attention_mask": mask}


@torch.no_grad()
def _hf_logits(hf, batch) -> torch.Tensor:
    return hf(
        input_ids=batch["input_ids"],
        token_type_ids=batch["token_type_ids"],
        attention_mask=batch["attention_mask"].long(),
    ).logits


@pytest.mark.parametrize("preset", PRESETS)
def test_round_trip_gives_the_same_logits(preset, batch):
    cfg = _config(preset)
    model = _classifier(cfg)
    with torch.no_grad():
        ours = model(batch)
    hf = to_transformers_classifier(model, cfg.model).eval()
    assert type(hf).__name__ == PRESETS[preset] and hf.config.num_labels == 3
    assert hf.config.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    theirs = _hf_logits(hf, batch)
    assert ours.abs().max() > 0.1 and ours.std(0).max() > 1e-3  # real, input-dependent logits
    assert (ours - theirs).abs().max() < TOL

    back_cfg, back = from_transformers_classifier(hf)
    assert back_cfg.vocab_size == cfg.model.vocab_size and back.num_labels == 3 and back.exits is None
    with torch.no_grad():
        again = back.eval()(batch)
    assert (again - ours).abs().max() < TOL
    assert model.state_dict().keys() == back.state_dict().keys()
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())


def test_head_dropout_and_pooler_map_to_each_familys_own(batch):
    for preset, dropout_key in [("bert-tiny", "classifier_dropout"), ("albert-tiny", "classifier_dropout_prob")]:
        cfg = _config(preset, num_labels=2)
        hf = to_transformers_classifier(_classifier(cfg), cfg.model, labels=["negative", "positive"])
        assert getattr(hf.config, dropout_key) == pytest.approx(0.1)
        assert hf.config.label2id == {"negative": 0, "positive": 1}
        assert from_transformers_classifier(hf)[1].head.dropout.p == pytest.approx(0.1)
    cfg = _config("mobilebert-mini", num_labels=2)
    hf = to_transformers_classifier(_classifier(cfg), cfg.model)
    assert hf.config.classifier_activation and hasattr(hf.mobilebert.pooler, "dense")  # dense + tanh, as ours
    with pytest.raises(ConfigError, match="labels: 2 distinct names"):
        to_transformers_classifier(_classifier(cfg), cfg.model, labels=["a", "a"])


def test_what_transformers_classifiers_are_refused():
    cfg = _config("bert-tiny", num_labels=2)
    hf = to_transformers_classifier(_classifier(cfg), cfg.model)
    hf.config.problem_type = "multi_label_classification"
    with pytest.raises(ConfigError, match="multi-label"):
        from_transformers_classifier(hf)
    pretraining = transformers.BertForPreTraining(hf.config)
    with pytest.raises(ConfigError, match="expected a BertForSequenceClassification"):
        from_transformers_classifier(pretraining)


def test_transformers_export_loads_back_and_is_not_a_pretrained_model(tmp_path, batch):
    cfg = _config("albert-tiny", num_labels=2)
    model = _classifier(cfg)
    assert export(model, cfg, tmp_path / "hf", metrics={"sst2/final_accuracy": 0.75}) == "transformers"
    names = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "ablate.yaml", "README.md"} <= names
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["AlbertForSequenceClassification"]
    assert config["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"} and config["label2id"] == {"LABEL_0": 0, "LABEL_1": 1}
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "sequence classifier" in card
    assert "task `sst2`" in card and "Dev accuracy (`finetune.metric`): **0.75**" in card
    assert "never exported: transformers has no place for them" in card
    assert "| head parameters (pooler + classifier) |" in card

    auto = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        ours = model(batch)
    assert (_hf_logits(auto, batch) - ours).abs().max() < TOL
    loaded_cfg, loaded = load_classifier(tmp_path / "hf")
    assert loaded_cfg.hidden_dim == cfg.model.hidden_dim and not loaded.training
    with torch.no_grad():
        assert (loaded(batch) - ours).abs().max() < TOL
    with pytest.raises(ConfigError, match="a fine-tuned classifier, not a pre-trained model"):
        load_pretrained(tmp_path / "hf")


def test_ablate_export_of_a_classifier_round_trips_exactly_without_its_exits(tmp_path, batch):
    """A model transformers cannot express (sharing attn) is saved as our state dict; exits never go with it."""
    cfg = _config("albert-tiny", num_labels=3, sharing="attn", num_layers=2)
    model = _classifier(cfg)
    model.exits = torch.nn.ModuleList([torch.nn.Linear(4, 3)])  # stands for FastBERT's exit heads
    assert export(model, cfg, tmp_path / "out") == "ablate"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "ablate.yaml", "model.safetensors"]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "load_classifier(folder)" in card and "exit classifiers (`finetune.exits`) are not exported" in card
    loaded_cfg, loaded = load_classifier(tmp_path / "out")
    assert loaded_cfg == cfg.model and loaded.exits is None
    with torch.no_grad():
        assert torch.equal(loaded(batch), model(batch))
    with pytest.raises(ConfigError, match="not expressible"):
        export(model, cfg, tmp_path / "hf", format="transformers")
    with pytest.raises(ConfigError, match="a fine-tuned classifier, not a pre-trained model"):
        load_pretrained(tmp_path / "out")


def test_a_runs_saved_classifier_comes_back_with_its_exits(tmp_path, batch):
    """A fine-tuning run's ``model/`` artifacts (our state dict + config.yaml) keep FastBERT's exits."""
    from safetensors.torch import save_file

    from ablate.lightning_modules.config.experiment import to_yaml
    from ablate.lightning_modules.interop.pretrained import state_dict
    from ablate.lightning_modules.model.classifier import new_head

    cfg = _config("bert-tiny", num_labels=2)
    model = _classifier(cfg)
    model.exits = torch.nn.ModuleList(new_head(128, 2, 0.1, 0.5) for _ in range(cfg.model.num_layers - 1))
    (tmp_path / "model").mkdir()
    save_file(state_dict(model), str(tmp_path / "model" / "model.safetensors"))
    (tmp_path / "model" / "config.yaml").write_text(to_yaml(cfg))
    _, loaded = load_classifier(tmp_path / "model")
    assert loaded.exits is not None and len(loaded.exits) == 3
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(loaded(batch), model(batch))


def test_load_classifier_refuses_pretrained_models(tmp_path):
    cfg = build_config({"model": {"preset": "bert-tiny", "num_layers": 1}})
    model = build_pretraining_model(cfg.model, cfg.objective)
    export(model, cfg, tmp_path / "hf")
    export(model, build_config({"model": {"preset": "bert-tiny", "num_layers": 1, "sharing": "ffn"}}), tmp_path / "ab")
    with pytest.raises(ConfigError, match="a BertForPreTraining checkpoint, not a sequence classifier"):
        load_classifier(tmp_path / "hf")
    with pytest.raises(ConfigError, match=r"a pre-trained model \(regime pretrain\), not a fine-tuned classifier"):
        load_classifier(tmp_path / "ab")
    with pytest.raises(ConfigError, match="no such checkpoint folder"):
        load_classifier(tmp_path / "missing")
    with pytest.raises(ConfigError, match="regime: 'pretrain'; a classifier is exported with its fine-tuning run"):
        export(_classifier(_config("bert-tiny")), cfg, tmp_path / "x")
