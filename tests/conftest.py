"""Shared fixtures: the repo's real data beside the checkout (../shared/data)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on two cores: one thread each
    torch.set_num_threads(1)

# GPU-only tests: ``@requires_cuda`` (or ``pytestmark = requires_cuda``) marks a test ``cuda``; a
# ``cuda`` test is skipped where CUDA is not available (CI has no GPU). On a GPU machine:
# ``pytest -m cuda``.
requires_cuda = pytest.mark.cuda


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (pytest -m cuda on a GPU machine)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def wiki_validation() -> Path:
    path = SHARED_DATA / "wiki-en" / "validation-00-of-01.jsonl.gz"
    if not path.is_file():
        pytest.skip(f"shared test data not found at {path}")
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on a shared 2-core CPU: one thread is as fast, and far faster when the cores are
    contended (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
