"""``data.tokenizer``: an existing tokenizer (a folder, or a hub name the data catalog's ``models:``
maps to one) instead of one trained for the run; ``vocab.txt`` alone read as transformers reads it."""

from __future__ import annotations

import pytest

from ablate.datamodules.catalog import ENV, check_model, load_catalog, resolve_model
from ablate.datamodules.tokenizer import checkpoint_tokenizer, given_tokenizer, special_ids
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.experiment import DataConfig
from tests.hub_checkpoints import vocabulary, write_checkpoint, write_vocab

TEXTS = [
    ("The CITY's first school, in 1923: Héllo wörld!", "two American films were made"),
    ("naïve café 東京 at 3.5%", "zzz qqq ##x [MASK] unknown"),
]


@pytest.mark.parametrize("lowercase", [True, False, None])
def test_a_vocab_txt_folder_reads_as_transformers_reads_it(tmp_path, lowercase):
    import transformers

    folder = write_vocab(tmp_path / "bert", vocabulary(), lowercase=lowercase)
    path = checkpoint_tokenizer(folder, tmp_path / "out", lowercase=False)  # data.lowercase: where the folder is silent
    assert path is not None and path.parent == tmp_path / "out"
    from tokenizers import Tokenizer

    ours = Tokenizer.from_file(str(path))
    hf = transformers.BertTokenizerFast.from_pretrained(
        str(folder), **({"do_lower_case": False} if lowercase is None else {})
    )
    assert ours.get_vocab() == hf.backend_tokenizer.get_vocab()
    for a, b in TEXTS:
        assert ours.encode(a, b).ids == hf(a, b).input_ids
    assert special_ids(ours) == (0, 3, 4, 5, 6)  # BERT's order, not ablate's trained 0..4
    lowered = ours.encode("CITY").tokens
    assert lowered == (["[CLS]", "city", "[SEP]"] if lowercase else ["[CLS]", "[UNK]", "[SEP]"])


def test_a_given_tokenizer_is_the_runs_and_its_size_is_checked(tmp_path):
    folder = write_checkpoint(tmp_path / "ckpt")
    size = len(vocabulary())
    data = DataConfig(tokenizer=str(folder), cache_dir=str(tmp_path / "cache"))
    tok, path = given_tokenizer(data, size)
    assert tok.get_vocab_size() == size and path.parent == tmp_path / "cache" / "tokenizers"
    assert given_tokenizer(data, None)[1] == path  # cached by its content
    with pytest.raises(ConfigError) as info:
        given_tokenizer(data, 30522)
    assert str(info.value) == (
        f"model.vocab_size: 30522, but data.tokenizer {folder} has {size} tokens (set model.vocab_size={size})"
    )


def test_a_folder_without_a_vocabulary_is_refused(tmp_path):
    empty = tmp_path / "weights-only"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(
        ConfigError, match=r"^data.tokenizer: .*weights-only: no vocabulary in .*tokenizer.json nor vocab.txt"
    ):
        given_tokenizer(DataConfig(tokenizer=str(empty), cache_dir=str(tmp_path / "c")), None)
    with pytest.raises(ConfigError, match=r"^data.tokenizer: .*/nowhere: no such tokenizer folder$"):
        given_tokenizer(DataConfig(tokenizer=str(tmp_path / "nowhere"), cache_dir=str(tmp_path / "c")), None)
    write_vocab(tmp_path / "gpt", ["a", "b", "c"])  # no [CLS] ...: not BERT's
    with pytest.raises(ConfigError, match=r"^data.tokenizer: .*vocab.txt: not BERT's vocabulary"):
        given_tokenizer(DataConfig(tokenizer=str(tmp_path / "gpt"), cache_dir=str(tmp_path / "c")), None)


def test_the_catalog_maps_hub_model_names_to_folders(tmp_path, monkeypatch):
    write_vocab(tmp_path / "models" / "bert", vocabulary())
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("models:\n  google-bert/bert-base-uncased: models/bert\n  acme/missing: models/none\n")
    monkeypatch.setenv(ENV, str(catalog))
    assert resolve_model("google-bert/bert-base-uncased", "data.tokenizer") == tmp_path / "models" / "bert"
    tok, _ = given_tokenizer(DataConfig(tokenizer="google-bert/bert-base-uncased", cache_dir=str(tmp_path)), None)
    assert tok.token_to_id("school") == vocabulary().index("school")
    with pytest.raises(DataError, match=r"^prune.source: acme/missing: ABLATE_DATA_CATALOG: .*models/none: no such"):
        check_model("acme/missing", "prune.source")
    check_model("acme/not-mapped", "distill.teacher")  # a hub name: its form only, offline
    check_model("runs:/0123abcd", "distill.teacher")
    with pytest.raises(ConfigError, match=r"^distill.teacher: acme//x: not a hub model name"):
        check_model("acme//x", "distill.teacher")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  ./local/bert: models/bert\n")
    with pytest.raises(ConfigError, match=r"models../local/bert: a local path, not a hub model name"):
        load_catalog(bad)
