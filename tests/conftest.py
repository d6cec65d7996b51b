"""Shared fixtures: the repo's real data beside the checkout (../shared/data)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def wiki_validation() -> Path:
    path = SHARED_DATA / "wiki-en" / "validation-00-of-01.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"shared test data not found at {path}")
    return path
