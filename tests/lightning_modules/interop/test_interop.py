"""Interop with transformers: both directions agree on padded batches; what cannot be expressed says why."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ablate.lightning_modules.config.errors import ConfigError  # noqa: E402
from ablate.lightning_modules.config.experiment import ExperimentConfig, ObjectiveConfig  # noqa: E402
from ablate.lightning_modules.config.model import LayerSpec, ModelConfig  # noqa: E402
from ablate.lightning_modules.interop.export import export  # noqa: E402
from ablate.lightning_modules.interop.pretrained import (  # noqa: E402
    from_transformers,
    initial_model,
    load_pretrained,  # noqa: E402
    to_transformers,
)
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model  # noqa: E402
from tests.lightning_modules.interop.families import BASE, OURS, TOL, V, perturb  # noqa: E402

HF_COMMON = dict(
    vocab_size=V,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=64,
    attn_implementation="eager",
)
THEIRS = {
    "bert": lambda: transformers.BertForPreTraining(transformers.BertConfig(**HF_COMMON, hidden_size=64)),
    "albert": lambda: transformers.AlbertForPreTraining(
        transformers.AlbertConfig(
            **HF_COMMON,
            hidden_size=64,
            embedding_size=32,
            hidden_act="gelu",
            num_hidden_groups=1,
            inner_group_num=1,
            classifier_dropout_prob=0.0,
        )
    ),
    **{
        f"mobilebert-{wiring}": (
            lambda wiring=wiring, norm=norm, act=act: transformers.MobileBertForPreTraining(
                transformers.MobileBertConfig(
                    **HF_COMMON,
                    hidden_size=64,
                    embedding_size=32,
                    intra_bottleneck_size=32,
                    use_bottleneck_attention=wiring == "bottleneck",
                    key_query_shared_bottleneck=wiring == "shared_qk",
                    num_feedforward_networks=2,
                    normalization_type=norm,
                    hidden_act=act,
                    layer_norm_eps=1e-5,
                )
            )
        )
        for wiring, norm, act in [("shared_qk", "no_norm", "relu"), ("bottleneck", "layer_norm", "gelu")]
    },
}


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, V, (3, 16), generator=g)
    mask = torch.ones(3, 16, dtype=torch.bool)
    mask[1, 11:] = False
    mask[2, 6:] = False
    types = torch.zeros(3, 16, dtype=torch.long)
    types[:, 8:] = 1
    return {"input_ids": ids.masked_fill(~mask, 0), "token_type_ids": types, "attention_mask": mask}


@torch.no_grad()
def _outputs(ours: PretrainingModel, hf, batch) -> dict[str, float]:
    ours.eval(), hf.eval()
    mask = batch["attention_mask"]
    hidden = ours.encoder(batch["input_ids"], batch["token_type_ids"], mask)
    theirs = hf.base_model(
        input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=mask.long()
    ).last_hidden_state
    out = hf(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=mask.long())
    sentence = out.sop_logits if hasattr(out, "sop_logits") else out.seq_relationship_logits
    mlm = ours.mlm_head(hidden[mask], ours.encoder.embeddings.word.weight)
    return {
        "hidden": (hidden - theirs)[mask].abs().max().item(),
        "sentence": (ours.sentence_head(hidden[:, 0]) - sentence).abs().max().item(),
        "mlm": (mlm - out.prediction_logits[mask]).abs().max().item(),
        "scale": hidden.abs().max().item(),
    }


def _check(diff: dict[str, float], name: str, mlm: bool = True) -> None:
    assert diff["scale"] > 0.1  # a real signal, not zeros
    assert diff["hidden"] < TOL, diff
    assert diff["sentence"] < TOL, diff
    if mlm:
        assert diff["mlm"] < TOL, diff


@pytest.mark.parametrize("name", OURS)
def test_ours_to_transformers(name, batch):
    cfg = OURS[name]
    model = build_pretraining_model(cfg, ObjectiveConfig(sentence="sop"))
    perturb(model)
    hf = to_transformers(model, cfg)
    _check(_outputs(model, hf, batch), name)
    back_cfg, back = from_transformers(hf)
    assert back_cfg == cfg
    _check(_outputs(back, hf, batch), name)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values(), strict=False))


def test_mobilebert_with_a_factorized_head_exports_approximately(batch):
    """Our ALBERT-style MLM head (H -> E, tied V x E) on a MobileBERT: encoder and sentence head exact,
    MLM logits only approximate (HF's head is H -> H with extra decoder columns)."""
    cfg = OURS["mobilebert-shared_qk"].__class__(**{**vars(OURS["mobilebert-shared_qk"]), "mlm_head": "factorized"})
    model = build_pretraining_model(cfg, ObjectiveConfig(sentence="sop"))
    perturb(model)
    _check(_outputs(model, to_transformers(model, cfg), batch), "mobilebert", mlm=False)


@pytest.mark.parametrize("name", THEIRS)
def test_transformers_to_ours(name, batch):
    torch.manual_seed(0)
    hf = THEIRS[name]()
    perturb(hf)
    cfg, model = from_transformers(hf)
    assert cfg.num_layers == 2 and cfg.vocab_size == V
    _check(_outputs(model, hf, batch), name)


def test_albert_embedding_equal_to_hidden_uses_identity_mapping(batch):
    cfg = ModelConfig(**BASE, embed_dim=64, hidden_dim=64, sharing="all")
    model = build_pretraining_model(cfg, ObjectiveConfig())
    hf = to_transformers(model, cfg)
    assert isinstance(hf, transformers.AlbertForPreTraining)
    _check(_outputs(model, hf, batch), "albert")
    with torch.no_grad():
        hf.albert.encoder.embedding_hidden_mapping_in.weight.mul_(2)
    with pytest.raises(ConfigError, match="embedding_hidden_mapping_in"):
        from_transformers(hf)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"sharing": "attn"}, "model.sharing: 'attn'"),
        ({"norm": "no_norm"}, "model.norm"),
        ({"position": "none", "embed_norm": False}, "model.position: .*; model.embed_norm"),
        ({"embedding": "trigram", "intra_dim": 32, "attention_input": "hidden"}, "model.attention_input: 'hidden'"),
        ({"embedding": "trigram", "intra_dim": 32}, "model.norm_eps: MobileBERT with LayerNorm"),
    ],
)
def test_not_expressible_says_why(change, needle):
    cfg = ModelConfig(**{**BASE, "embed_dim": 32, "hidden_dim": 64, **change})
    with pytest.raises(ConfigError, match=needle):
        to_transformers(build_pretraining_model(cfg, ObjectiveConfig()), cfg)


def _equal_outputs(a: PretrainingModel, b: PretrainingModel, batch, exact: bool) -> None:
    a.eval(), b.eval()
    with torch.no_grad():
        x = a.encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        y = b.encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    assert torch.equal(x, y) if exact else (x - y).abs().max() < TOL


@pytest.mark.parametrize(
    "change",
    [
        {"sharing": "attn"},
        {
            "layers": [
                {"num_heads": 2, "qk_dim": 8, "v_dim": 16, "ffn_dim": 64},
                {"num_heads": 4, "qk_dim": 16, "v_dim": 8, "ffn_dim": 32},
            ]
        },
    ],
)
def test_export_not_expressible_round_trips_exactly(change, tmp_path, batch):
    cfg = ExperimentConfig(model=ModelConfig(**{**BASE, "embed_dim": 32, "hidden_dim": 64, **change}))
    model = build_pretraining_model(cfg.model, cfg.objective)
    perturb(model)
    assert export(model, cfg, tmp_path / "out") == "ablate"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "ablate.yaml", "model.safetensors"]
    drawn = torch.get_rng_state()
    loaded_cfg, loaded = load_pretrained(tmp_path / "out")
    assert torch.equal(torch.get_rng_state(), drawn)  # built empty (no initial weights drawn), then loaded
    assert len(list(loaded.parameters())) == len(list(model.parameters()))  # tied weights still one parameter
    assert loaded_cfg == cfg.model
    _equal_outputs(model, loaded, batch, exact=True)
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=False)
    )
    with pytest.raises(ConfigError, match="not expressible"):
        export(model, cfg, tmp_path / "hf", format="transformers")
    assert not (tmp_path / "hf").exists()
    with pytest.raises(ConfigError, match="already exists"):
        export(model, cfg, tmp_path / "out")


def test_export_expressible_writes_a_transformers_checkpoint(tmp_path, batch):
    cfg = ExperimentConfig(model=OURS["mobilebert-shared_qk"])
    model = build_pretraining_model(cfg.model, cfg.objective)
    perturb(model)
    assert export(model, cfg, tmp_path / "hf") == "transformers"
    hf = transformers.MobileBertForPreTraining.from_pretrained(tmp_path / "hf", local_files_only=True)
    _check(_outputs(model, hf, batch), "mobilebert")
    loaded_cfg, loaded = load_pretrained(tmp_path / "hf")
    assert loaded_cfg == cfg.model
    _equal_outputs(model, loaded, batch, exact=False)


def test_initial_model(tmp_path, batch):
    cfg = ExperimentConfig(model=OURS["albert-all"])
    assert initial_model(cfg) is None
    model = build_pretraining_model(cfg.model, cfg.objective)
    perturb(model)
    export(model, cfg, tmp_path / "ckpt")
    start = initial_model(
        ExperimentConfig(
            model=OURS["albert-all"], init_from=str(tmp_path / "ckpt"), objective=ObjectiveConfig(sentence="none")
        )
    )
    assert start.sentence_head is None
    _equal_outputs(model, start, batch, exact=False)
    wrong = ExperimentConfig(
        model=ModelConfig(**{**BASE, "embed_dim": 32, "hidden_dim": 64, "num_layers": 3}),
        init_from=str(tmp_path / "ckpt"),
    )
    with pytest.raises(ConfigError, match=r"set model.num_layers=2 model.sharing=all model.activation=relu"):
        initial_model(wrong)
    with pytest.raises(ConfigError, match="no such checkpoint folder"):
        initial_model(ExperimentConfig(init_from=str(tmp_path / "missing")))


def test_layer_specs_equal_to_uniform_are_expressible():
    spec = LayerSpec(num_heads=4, qk_dim=16, v_dim=16, ffn_dim=128)
    cfg = ModelConfig(**{**BASE, "embed_dim": 64, "hidden_dim": 64, "layers": (spec, spec)})
    assert isinstance(
        to_transformers(build_pretraining_model(cfg, ObjectiveConfig()), cfg), transformers.BertForPreTraining
    )
