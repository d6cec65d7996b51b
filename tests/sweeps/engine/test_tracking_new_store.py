"""A new SQLite store starts as a copy of an empty store made once per machine (MLflow's schema migrations
run once, not per store); the copy is a whole store; an existing store is never replaced; where the empty
store cannot be made, MLflow makes each store itself."""

from __future__ import annotations

import mlflow.store.db.utils as db_utils
import pytest

from ablate.sweeps.engine import tracking


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, and the process's empty store forgotten; MLflow's table builder counted."""
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    tracking.empty_store.cache_clear()
    built: list[str] = []
    real = db_utils._initialize_tables
    monkeypatch.setattr(db_utils, "_initialize_tables", lambda engine: built.append(str(engine.url)) or real(engine))
    yield built
    tracking.empty_store.cache_clear()


def _store(uri: str, name: str) -> list[str]:
    """A run logged in ``uri``'s experiment ``name``: the names of every run there."""
    client = tracking.connect(uri)
    exp = tracking.experiment_id(client, name, uri)
    run_id = tracking.start_run(client, exp, f"{name}-run", {})
    client.log_metric(run_id, "val/loss", 1.5)
    client.set_terminated(run_id)
    return [r.info.run_name for r in client.search_runs([exp])]


def test_new_stores_are_copies_of_one_empty_store(tmp_path, cache) -> None:
    first, second = (f"sqlite:///{tmp_path / name / 'mlflow.db'}" for name in ("a", "b"))
    assert _store(first, "one") == ["one-run"]
    assert _store(second, "two") == ["two-run"]
    assert len(cache) == 1 and "mlflow-" in cache[0]  # the empty store's tables, built once; no store of its own
    assert len(list((tmp_path / "cache").glob("mlflow-*-empty.db"))) == 1
    client = tracking.connect(second)
    default = client.get_experiment("0")  # made by MLflow in each store, where it would make it anyway
    assert default is not None and default.name == "Default"


def test_an_existing_store_is_never_replaced(tmp_path, cache) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _store(uri, "kept")
    tracking.new_sqlite_store(uri)
    assert sorted(_store(uri, "kept")) == ["kept-run", "kept-run"]  # the first run is still there


def test_without_a_cache_folder_mlflow_makes_the_store_itself(tmp_path, monkeypatch) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be", encoding="utf-8")
    monkeypatch.setenv("ABLATE_CACHE", str(blocked))
    tracking.empty_store.cache_clear()
    try:
        assert tracking.empty_store() is None
        assert _store(f"sqlite:///{tmp_path / 's' / 'mlflow.db'}", "plain") == ["plain-run"]
    finally:
        tracking.empty_store.cache_clear()
