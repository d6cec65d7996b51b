from __future__ import annotations

import re
import time

import pytest

from ablate.lightning_modules.config.errors import StorageError
from ablate.reports.runs import BASE_COLUMNS, load_runs, parse_param
from tests.reports.report_fixtures import STUDY, TRIALS


def test_one_flat_row_per_trial(store):
    runs, parent = load_runs(store.uri, STUDY)
    assert parent == store.parent_id
    assert sorted(runs["run_id"]) == sorted(store.trial_ids)  # no parent, no other study
    assert list(runs.columns[: len(BASE_COLUMNS)]) == BASE_COLUMNS
    assert list(runs["trial"]) == list(range(len(TRIALS)))
    first = runs.iloc[0]
    assert first["run_name"] == "embed_dim=64 sharing=all seed=1"
    assert (first["status"], first["state"]) == ("FINISHED", "COMPLETE")
    assert first["model.embed_dim"] == 64 and runs["model.embed_dim"].dtype.kind == "i"
    assert first["model.dropout"] == 0.1 and first["model.sharing"] == "all"
    assert first["model.intra_dim"] is None
    assert first["val/mlm_acc"] == 0.60  # the last logged value, not the first
    assert first["train/loss"] == 3.0
    failed = runs[runs["state"] == "FAIL"]
    assert set(failed["status"]) == {"FAILED"} and failed["val/mlm_acc"].isna().all()


def test_unknown_experiment_is_empty(store):
    runs, parent = load_runs(store.uri, "no-such-study")
    assert runs.empty and parent is None
    assert list(runs.columns) == BASE_COLUMNS


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://127.0.0.1:9", "http://127.0.0.1:9"),
        ("postgresql://u:p@127.0.0.1:1/x", "postgresql://u:***@127.0.0.1:1/x"),
    ],
)
def test_unreachable_store_fails_fast(uri, shown):
    start = time.monotonic()
    with pytest.raises(StorageError, match="^" + re.escape(shown)):
        load_runs(uri, STUDY)
    assert time.monotonic() - start < 10


def test_missing_sqlite_file_is_not_created(tmp_path):
    db = tmp_path / "nope" / "mlflow.db"
    with pytest.raises(StorageError, match="no MLflow database"):
        load_runs(f"sqlite:///{db}", STUDY)
    assert not db.exists()


def test_parse_param():
    assert parse_param("64") == 64 and isinstance(parse_param("64"), int)
    assert parse_param("1e-4") == 1e-4 and parse_param("0.5") == 0.5
    assert parse_param("None") is None
    assert parse_param("all") == "all" and parse_param("True") == "True"
