"""Interop with transformers: both directions agree on padded batches; exports load back."""

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

V = 1000
TOL = 1e-4
BASE = dict(vocab_size=V, num_layers=2, num_heads=4, ffn_dim=128, dropout=0.0, max_position=64)

OURS = {
    "bert": ModelConfig(**BASE, embed_dim=64, hidden_dim=64),
    "albert-all": ModelConfig(**BASE, embed_dim=32, hidden_dim=64, sharing="all", activation="relu"),
    "albert-none": ModelConfig(**BASE, embed_dim=32, hidden_dim=96, sharing="none"),
    "mobilebert-shared_qk": ModelConfig(
        **BASE,
        embed_dim=32,
        hidden_dim=64,
        intra_dim=32,
        num_ffn=3,
        embedding="trigram",
        attention_input="shared_qk",
        norm="no_norm",
        activation="relu",
        mlm_head="mobilebert",
    ),
    "mobilebert-bottleneck": ModelConfig(
        **BASE,
        embed_dim=32,
        hidden_dim=64,
        intra_dim=32,
        num_ffn=2,
        embedding="trigram",
        attention_input="bottleneck",
        norm="layer_norm",
        norm_eps=1e-5,
        mlm_head="mobilebert",
    ),
    "mobilebert-hidden": ModelConfig(
        **{**BASE, "num_layers": 3},
        embed_dim=32,
        hidden_dim=64,
        intra_dim=64,
        num_ffn=2,
        embedding="trigram",
        attention_input="hidden",
        norm="layer_norm",
        norm_eps=1e-5,
        mlm_head="mobilebert",
    ),
}
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
def _perturb(model: torch.nn.Module, seed: int = 1) -> None:
    """Norm gains/biases and all biases away from their 1/0 defaults, so that a swapped one shows."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.ndim == 1:
            p.add_(0.1 * torch.randn(p.shape, generator=g))


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
    _perturb(model)
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
    _perturb(model)
    _check(_outputs(model, to_transformers(model, cfg), batch), "mobilebert", mlm=False)


@pytest.mark.parametrize("name", THEIRS)
def test_transformers_to_ours(name, batch):
    torch.manual_seed(0)
    hf = THEIRS[name]()
    _perturb(hf)
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
    _perturb(model)
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
    _perturb(model)
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
    _perturb(model)
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


# --- export folders are transformers models: tokenizer, Auto classes, fill-mask, model card ---------------------


def _wiki_docs(path, n: int) -> list[str]:
    import gzip
    import itertools
    import json

    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in itertools.islice(f, n)]


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory, wiki_validation) -> tuple:
    """A V-token WordPiece tokenizer trained as a run trains it, on real text (its file and some text)."""
    from ablate.datamodules.tokenizer import train_tokenizer

    docs = _wiki_docs(wiki_validation, 300)
    path = tmp_path_factory.mktemp("tok") / "wordpiece.json"
    train_tokenizer(docs[:250], V, lowercase=True).save(str(path))
    return path, docs[250:]


FAMILIES = {"bert": "bert", "albert-all": "albert", "mobilebert-bottleneck": "mobilebert"}


@pytest.mark.parametrize("name", FAMILIES)
def test_export_is_a_transformers_model(name, wordpiece, tmp_path):
    """Tokenizer, masked LM, classifier and fill-mask pipeline all load from the folder with Auto classes."""
    from tokenizers import Tokenizer

    tok_path, _ = wordpiece
    cfg = ExperimentConfig(model=OURS[name])
    model = build_pretraining_model(cfg.model, cfg.objective)
    _perturb(model)
    out = tmp_path / "hf"
    metrics = {"val/loss": 1.25, "lr-AdamW": 1e-3, "params.backbone": 1.0}
    assert (
        export(model, cfg, out, tokenizer=tok_path, metrics=metrics, source="run `x`", repo="me/tiny") == "transformers"
    )
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"} <= {
        p.name for p in out.iterdir()
    }

    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert len(tok) == V == transformers.AutoConfig.from_pretrained(out).vocab_size
    assert tok.model_max_length == cfg.model.max_position and tok.do_lower_case
    text = "The capital of France is [MASK]."
    pieces = tok.tokenize(text)
    assert "the" in pieces and tok.unk_token not in pieces and pieces.count(tok.mask_token) == 1
    assert (
        Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab() == Tokenizer.from_file(str(tok_path)).get_vocab()
    )

    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(mlm).__name__ == transformers.AutoConfig.from_pretrained(out).architectures[0].replace(
        "PreTraining", "MaskedLM"
    )
    enc = tok(text, return_tensors="pt")
    model.eval()
    with torch.no_grad():
        hidden = model.encoder(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"].bool())[0]
        ours = model.mlm_head(hidden, model.encoder.embeddings.word.weight)
        theirs = mlm(**enc).logits[0]
    assert (ours - theirs).abs().max() < TOL  # the same predictions as our model
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(out)
    assert classifier(**enc).logits.shape == (1, 2)
    filled = transformers.pipeline("fill-mask", model=str(out))(text)
    assert len(filled) == 5 and all(r["token_str"] for r in filled)

    card = (out / "README.md").read_text()
    from ablate.lightning_modules.measure.accounting import param_report

    report = param_report(model, cfg.model, cfg.data.max_length)
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: fill-mask\n")
    assert f"| backbone parameters | {report.backbone:,} |" in card
    assert f"| forward FLOPs per token (T={cfg.data.max_length}) | {report.flops_per_token:,} |" in card
    assert "| `val/loss` | 1.25 |" in card and "lr-AdamW" not in card and "params.backbone`" not in card
    assert 'AutoTokenizer.from_pretrained("me/tiny")' in card and f"vocab_size: {V}" in card  # the config YAML


def test_exported_tokenizer_encodes_as_the_runs(wordpiece, tmp_path):
    """The transformers tokenizer gives the ids the run trained on (cased text, accents, pairs); a
    tokenizer that is not BERT's recipe is kept as it is."""
    from tokenizers import Tokenizer

    from ablate.datamodules.tokenizer import new_tokenizer, train_tokenizer
    from ablate.lightning_modules.interop.hub import hf_tokenizer, save_tokenizer

    tok_path, docs = wordpiece
    raw = Tokenizer.from_file(str(tok_path))
    assert save_tokenizer(tok_path, tmp_path, lowercase=True, max_length=64) == V
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    texts = [d[:400] for d in docs[:20]] + ["Ça va? NAÏVE café, 東京 [SEP] x"]
    for text in texts:
        assert hf(text)["input_ids"] == raw.encode(text).ids
    assert hf(texts[0], texts[1])["input_ids"] == raw.encode(texts[0], texts[1]).ids
    assert hf(texts[0], texts[1])["token_type_ids"] == raw.encode(texts[0], texts[1]).type_ids

    cased = train_tokenizer(docs[:50], 600, lowercase=False)
    assert new_tokenizer(False).normalizer is not None  # the recipe the wrapped tokenizer keeps
    wrapped = hf_tokenizer(cased, lowercase=True, max_length=64)  # do_lower_case contradicts the file: kept as is
    assert wrapped("The Capital")["input_ids"] == cased.encode("The Capital").ids


def test_export_ablate_format_carries_the_tokenizer_and_a_card(wordpiece, tmp_path):
    tok_path, _ = wordpiece
    cfg = ExperimentConfig(
        model=ModelConfig(**{**BASE, "embed_dim": 32, "hidden_dim": 64, "sharing": "attn"}),
        tracking={"tracking_uri": "postgresql://ablate:s3cret@db.example/mlflow"},
    )
    model = build_pretraining_model(cfg.model, cfg.objective)
    assert export(model, cfg, tmp_path / "out", tokenizer=tok_path) == "ablate"
    assert len(transformers.AutoTokenizer.from_pretrained(tmp_path / "out")) == V
    card = (tmp_path / "out" / "README.md").read_text()
    assert "library_name" not in card and "No transformers class fits this model" in card and "model.sharing" in card
    assert "s3cret" not in card + (tmp_path / "out" / "ablate.yaml").read_text()
    assert "postgresql://ablate:***@db.example/mlflow" in card
    loaded_cfg, _ = load_pretrained(tmp_path / "out")
    assert loaded_cfg == cfg.model


def test_export_refuses_a_tokenizer_it_cannot_use(wordpiece, tmp_path):
    cfg = ExperimentConfig(model=ModelConfig(**{**BASE, "vocab_size": 500, "embed_dim": 32, "hidden_dim": 64}))
    model = build_pretraining_model(cfg.model, cfg.objective)
    (tmp_path / "broken.json").write_text("{not json")
    for tok, needle in [(wordpiece[0], "more than model.vocab_size=500"), (tmp_path / "broken.json", "broken.json")]:
        with pytest.raises(ConfigError, match=needle):
            export(model, cfg, tmp_path / "out", tokenizer=tok)
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_initial_model_refuses_a_checkpoint_with_another_tokenizer(wordpiece, tmp_path):
    """init_from: an export folder's tokenizer must be the run's (its embedding rows are those tokens)."""
    from ablate.datamodules.tokenizer import train_tokenizer

    tok_path, docs = wordpiece
    cfg = ExperimentConfig(model=OURS["albert-all"])
    model = build_pretraining_model(cfg.model, cfg.objective)
    export(model, cfg, tmp_path / "ckpt", tokenizer=tok_path)
    start = ExperimentConfig(model=OURS["albert-all"], init_from=str(tmp_path / "ckpt"))
    assert initial_model(start, tok_path) is not None  # the same tokenizer
    assert initial_model(start) is not None  # no tokenizer to compare with
    other = tmp_path / "other.json"
    train_tokenizer(docs[:40], V, lowercase=False).save(str(other))
    with pytest.raises(ConfigError, match=r"init_from: .*tokenizer.json is a different tokenizer than this run's"):
        initial_model(start, other)


def test_without_transformers_the_tokenizer_file_is_copied(wordpiece, tmp_path, monkeypatch):
    """A run's model/ artifacts keep its tokenizer where the hf extra is not installed; an export that
    needs transformers says how to install it."""
    from ablate.lightning_modules.config.errors import AblateError
    from ablate.lightning_modules.interop import hub as hf_export

    def missing(module, extra):
        raise AblateError(f"{module} is not installed: run pip install -e '.[{extra}]' in the ablate checkout")

    monkeypatch.setattr(hf_export, "require", missing)
    tok_path, _ = wordpiece
    assert hf_export.save_tokenizer(tok_path, tmp_path, True, 64, required=False) == V
    assert (tmp_path / "tokenizer.json").read_bytes() == tok_path.read_bytes()
    with pytest.raises(AblateError, match=r"transformers is not installed: run pip install -e '.\[hf\]'"):
        hf_export.save_tokenizer(tok_path, tmp_path / "x", True, 64)
