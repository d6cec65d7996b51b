"""Tokenizer training, specials, cache hits and misses, atomic writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import ablate.datamodules.tokenizer as tokmod
from ablate.datamodules.tokenizer import SPECIAL_TOKENS, cache_root, load_or_train_tokenizer, special_ids
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.experiment import DataConfig


def _no_training(*args: object, **kwargs: object) -> None:
    raise AssertionError("the tokenizer was retrained")


def test_specials_and_vocab(wiki_data: Callable[..., DataConfig], tmp_path: Path) -> None:
    tok, path = load_or_train_tokenizer(wiki_data(cache_dir=str(tmp_path)), 2000)
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert tuple(special_ids(tok)) == (0, 1, 2, 3, 4)
    assert 1000 < tok.get_vocab_size() <= 2000
    assert any(t.startswith("##") for t in tok.get_vocab())
    assert tok.encode("The Cafe was opened").tokens[0] == "[CLS]"
    assert "the" in tok.encode("The").tokens  # lowercased
    assert path.parent == tmp_path / "tokenizers" and path.suffix == ".json"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_cache_hit_and_miss(
    wiki_data: Callable[..., DataConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = wiki_data(cache_dir=str(tmp_path), tokenizer_docs=100)
    _, first = load_or_train_tokenizer(data, 1000)
    stamp = first.stat().st_mtime_ns
    monkeypatch.setattr(tokmod, "train_tokenizer", _no_training)
    tok, again = load_or_train_tokenizer(data, 1000)
    assert again == first and again.stat().st_mtime_ns == stamp and tok.get_vocab_size() <= 1000
    monkeypatch.undo()
    _, other = load_or_train_tokenizer(data, 1200)
    assert other != first and other.is_file()
    _, cased = load_or_train_tokenizer(wiki_data(cache_dir=str(tmp_path), tokenizer_docs=100, lowercase=False), 1000)
    assert cased not in (first, other)


def test_cache_misses_when_the_corpus_changes(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"Paragraph number {i} of the corpus." for i in range(60)), encoding="utf-8")
    data = DataConfig(corpus=str(corpus), cache_dir=str(tmp_path / "cache"), val_fraction=0.1, text_doc_chars=0)
    _, first = load_or_train_tokenizer(data, 200)
    corpus.write_text(corpus.read_text(encoding="utf-8") + "\n\nOne more paragraph.", encoding="utf-8")
    _, second = load_or_train_tokenizer(data, 200)
    assert first != second


def test_cache_dir_default_and_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ABLATE_CACHE", raising=False)
    assert cache_root(DataConfig()) == Path.home() / ".cache" / "ablate"
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path))
    assert cache_root(DataConfig()) == tmp_path
    assert cache_root(DataConfig(cache_dir=str(tmp_path / "x"))) == tmp_path / "x"


def test_crash_while_saving_leaves_nothing(
    wiki_data: Callable[..., DataConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Crashing:
        def save(self, path: str) -> None:
            Path(path).write_text('{"half": ', encoding="utf-8")
            raise KeyboardInterrupt

    monkeypatch.setattr(tokmod, "train_tokenizer", lambda docs, *a: (list(docs), Crashing())[1])
    data = wiki_data(cache_dir=str(tmp_path), tokenizer_docs=5)
    with pytest.raises(KeyboardInterrupt):
        load_or_train_tokenizer(data, 500)
    assert list((tmp_path / "tokenizers").iterdir()) == []


def test_empty_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "blank.txt"
    corpus.write_text("\n\n   \n", encoding="utf-8")
    with pytest.raises(DataError, match="corpus is empty"):
        load_or_train_tokenizer(DataConfig(corpus=str(corpus), cache_dir=str(tmp_path)), 500)
    assert not (tmp_path / "tokenizers").exists() or not list((tmp_path / "tokenizers").iterdir())


def test_small_vocab_is_respected(wiki_data: Callable[..., DataConfig], tmp_path: Path) -> None:
    data = wiki_data(cache_dir=str(tmp_path), tokenizer_docs=50)
    assert load_or_train_tokenizer(data, 64)[0].get_vocab_size() <= 64
    with pytest.raises(ConfigError, match="^model.vocab_size: 6 is too small"):
        load_or_train_tokenizer(data, 6)


_TRAIN_IN_A_PROCESS = """
import sys
from ablate.datamodules.tokenizer import load_or_train_tokenizer
from ablate.lightning_modules.config.experiment import DataConfig
_, path = load_or_train_tokenizer(DataConfig(corpus="norvig-big", tokenizer_docs=2000, cache_dir=sys.argv[1]), 4000)
print(path)
"""


def test_the_same_documents_give_the_same_tokenizer_in_every_process(tmp_path: Path) -> None:
    """`tokenizers` collects its alphabet in a hash map seeded per process: trained in two processes, the
    ids of a few hundred tokens came out in other orders (and a model's numbers with them). The file a
    second process trains is the first one's, byte for byte."""
    import subprocess
    import sys

    files = []
    for i in range(2):
        out = subprocess.run(
            [sys.executable, "-c", _TRAIN_IN_A_PROCESS, str(tmp_path / f"cache{i}")],
            capture_output=True,
            text=True,
            check=True,
        )
        files.append(Path(out.stdout.strip().splitlines()[-1]))
    assert files[0].name == files[1].name
    assert files[0].read_bytes() == files[1].read_bytes()
