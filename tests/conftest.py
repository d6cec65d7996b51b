"""Shared fixtures: the repo's real data beside the checkout (../shared/data), and the data catalog
that maps the shipped studies' hub names to it (``ABLATE_DATA_CATALOG``, set for the session)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from tests.markers import assign as assign_markers

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
CATALOG_ENV = "ABLATE_DATA_CATALOG"


def documented_catalog(data: Path) -> str:
    """The example catalog of docs/data.md (copies under ``/data``), pointing at ``data`` instead."""
    text = (ROOT / "docs" / "data.md").read_text(encoding="utf-8")
    found = re.search(r"```yaml\n(# ABLATE_DATA_CATALOG=.*?)```", text, re.S)
    assert found, "docs/data.md: its example catalog (a yaml block starting '# ABLATE_DATA_CATALOG=') is gone"
    return found.group(1).replace("/data/", f"{data}/")


STAND_INS = {
    "rajpurkar/squad": {"train": "squad/dev-v1.1.json"},
    "rajpurkar/squad_v2": {"train": "squad/dev-v2.0.json"},
    "nyu-mll/glue:mnli": {
        "train": "glue/mnli/validation_matched.tsv",
        "validation_mismatched": "glue/mnli/validation_matched.tsv",
    },
}
"""Splits the shipped studies name that the workplace copy lacks (SQuAD's training sets, MNLI's
training set and mismatched dev set), read from the dev files that are there: tests run those studies
a few steps (``--smoke``), where training on dev data only checks that everything runs."""


@pytest.fixture(scope="session", autouse=True)
def data_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """The documented catalog, pointing at the shared data, with :data:`STAND_INS` added, as
    ``ABLATE_DATA_CATALOG`` for the whole session (None, and the variable unset, where the shared data is
    absent: hub names stay hub names)."""
    if not SHARED_DATA.is_dir():
        yield None
        return
    path = tmp_path_factory.mktemp("catalog") / "catalog.yaml"
    catalog = yaml.safe_load(documented_catalog(SHARED_DATA))
    for name, splits in STAND_INS.items():
        catalog["datasets"].setdefault(name, {}).update({k: str(SHARED_DATA / v) for k, v in splits.items()})
    path.write_text(yaml.safe_dump(catalog, sort_keys=False), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CATALOG_ENV, str(path))
        yield path


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs two workers on two cores: one thread each
    torch.set_num_threads(1)
    # and the processes a test starts (ablate commands, workers) too: two workers' children with two
    # OpenMP threads each on two cores spin against each other and run several times slower
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# GPU-only tests: ``@requires_cuda`` (or ``pytestmark = requires_cuda``) marks a test ``cuda``; a
# ``cuda`` test is skipped where CUDA is not available (CI has no GPU). On a GPU machine:
# ``pytest -m cuda``.
requires_cuda = pytest.mark.cuda


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    assign_markers(items)  # slow and e2e, by file and test name (tests/markers.py)
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


@pytest.fixture()
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wiki_validation: Path) -> Path:
    """A test's own working directory (a refusal must leave it empty), with the data catalog's variable
    restored after the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CATALOG_ENV, os.environ.get(CATALOG_ENV, ""))
    return tmp_path


def one_error(code: int, err: str, ignore: tuple[str, ...] = ()) -> str:
    """The one ``error:`` line a refused command printed (exit status 2, no traceback); lines holding one of
    ``ignore`` are not counted."""
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip() and not any(word in line for word in ignore)]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on a shared 2-core CPU: one thread is as fast, and far faster when the cores are
    contended (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def ablate_process() -> None:
    """The test process set up as the ``ablate`` command sets up its own (:func:`ablate.process.prepare`):
    tests that call runs in-process then run them as the command does; its signals stay pytest's (the
    signal handling is tested through the command, in subprocesses)."""
    from ablate.process import prepare

    prepare(signals=False)
