"""Shared fixtures: the real Wikipedia sample, a small cached tokenizer, tokenized docs."""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from ablate.datamodules.stream import tokenize_documents
from ablate.datamodules.tokenizer import load_or_train_tokenizer
from ablate.lightning_modules.config.experiment import DataConfig

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
WIKI_VALIDATION = SHARED_DATA / "wiki-en" / "validation-00-of-01.jsonl.gz"
VOCAB = 2000


@pytest.fixture(scope="session")
def wiki_file() -> Path:
    """The real Wikipedia sample (2,000 articles, jsonl.gz)."""
    if not WIKI_VALIDATION.is_file():
        pytest.skip(f"shared corpus missing: {WIKI_VALIDATION} (expected ../shared/data beside the repo)")
    return WIKI_VALIDATION


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer cache shared by the session (never ~/.cache)."""
    return tmp_path_factory.mktemp("ablate-cache")


@pytest.fixture(scope="session")
def wiki_data(wiki_file: Path, cache_dir: Path) -> Callable[..., DataConfig]:
    """Factory of DataConfigs on the Wikipedia sample, small and fast by default."""

    def make(**overrides: Any) -> DataConfig:
        fields: dict[str, Any] = {
            "corpus": str(wiki_file),
            "cache_dir": str(cache_dir),
            "tokenizer_docs": 300,
            "max_length": 64,
            "batch_size": 8,
            "num_workers": 0,
            "shuffle_buffer": 50,
            "val_fraction": 0.05,
        }
        fields.update(overrides)
        return DataConfig(**fields)

    return make


@pytest.fixture(scope="session")
def wiki_tokenizer(wiki_data: Callable[..., DataConfig]) -> Tokenizer:
    """A 2,000-piece WordPiece tokenizer trained on the sample (cached)."""
    return load_or_train_tokenizer(wiki_data(), VOCAB)[0]


@pytest.fixture(scope="session")
def wiki_texts(wiki_file: Path) -> list[str]:
    """The first 300 article texts, read directly (independently of the pipeline)."""
    with gzip.open(wiki_file, "rt", encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line in itertools.islice(fh, 300)]


@pytest.fixture(scope="session")
def wiki_docs(wiki_texts: list[str], wiki_tokenizer: Tokenizer) -> list[list[list[int]]]:
    """Those articles as tokenized sentences."""
    return list(tokenize_documents(wiki_texts, wiki_tokenizer))
