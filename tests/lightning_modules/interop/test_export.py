"""Export folders are transformers models (tokenizer, Auto classes, fill-mask, model card), or ablate's own
format where no transformers class fits; the tokenizer goes with them."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ablate.lightning_modules.config.errors import ConfigError  # noqa: E402
from ablate.lightning_modules.config.experiment import ExperimentConfig  # noqa: E402
from ablate.lightning_modules.config.model import ModelConfig  # noqa: E402
from ablate.lightning_modules.interop.export import export  # noqa: E402
from ablate.lightning_modules.interop.pretrained import initial_model, load_pretrained  # noqa: E402
from ablate.lightning_modules.model.heads import build_pretraining_model  # noqa: E402
from tests.lightning_modules.interop.families import BASE, OURS, TOL, V, perturb  # noqa: E402


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
    perturb(model)
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
