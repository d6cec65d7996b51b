"""A run's measurement reused by the next run of its shape (in the process and from disk), measured
again for another shape; the corpus check memoized per file state."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ablate.datamodules.corpus import check_corpus
from ablate.lightning_modules.config.errors import DataError
from ablate.lightning_modules.config.experiment import DataConfig
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.measure import cache
from ablate.lightning_modules.measure.accounting import MEASURED_ON
from ablate.lightning_modules.model.heads import build_pretraining_model
from ablate.sweeps.engine.runner import train
from tests.sweeps.conftest import tiny_base

pytestmark = pytest.mark.usefixtures("one_thread")

MEASURED = ("latency_ms_b1", "latency_ms_b32", "params.backbone", "flops_per_token", "model_bytes")


def test_a_repeat_run_reuses_the_measurement_and_says_so(tmp_path: Path, wiki_validation: Path) -> None:
    cache.forget()
    cfg = build_config(tiny_base(tmp_path, wiki_validation, max_steps=1, val_every=1, val_batches=1))
    first, second = train(cfg), train(cfg)
    client = MlflowClient(first.tracking_uri)
    a, b = (client.get_run(r.run_id).data for r in (first, second))
    assert a.params[cache.CACHE] == "measured" and cache.CACHED_AT not in a.params
    assert b.params[cache.CACHE] == "reused" and "by " in b.params[cache.CACHED_AT]
    assert b.params[MEASURED_ON] == a.params[MEASURED_ON]
    (entry,) = (tmp_path / "runs" / cache.FOLDER).glob("*.json")
    counts = json.loads(entry.read_text(encoding="utf-8"))["counts"]
    assert set(MEASURED) <= set(counts)
    assert {k: a.metrics[k] for k in counts} == {k: b.metrics[k] for k in counts} == counts


def test_another_shape_is_measured_and_a_new_process_reads_the_disk(tmp_path: Path, wiki_validation: Path) -> None:
    cache.forget()
    cfg = build_config(tiny_base(tmp_path, wiki_validation))
    model = build_pretraining_model(cfg.model, cfg.objective)
    counts, params = cache.cached_counts(model, cfg.model, cfg)
    assert params[cache.CACHE] == "measured"
    cache.forget()  # a second worker: only the file under the tracking root
    again, params = cache.cached_counts(build_pretraining_model(cfg.model, cfg.objective), cfg.model, cfg)
    assert params[cache.CACHE] == "reused" and again == counts
    base = tiny_base(tmp_path, wiki_validation)
    wider = build_config({**base, "model": {**base["model"], "hidden_dim": 48}})
    other, params = cache.cached_counts(build_pretraining_model(wider.model, wider.objective), wider.model, wider)
    assert params[cache.CACHE] == "measured" and other["params.backbone"] > counts["params.backbone"]
    longer = build_config({**base, "data": {**base["data"], "max_length": 32}})
    _, params = cache.cached_counts(build_pretraining_model(longer.model, longer.objective), longer.model, longer)
    assert params[cache.CACHE] == "measured"  # T is in the key
    assert len(list((tmp_path / "runs" / cache.FOLDER).glob("*.json"))) == 3


def test_an_unreadable_entry_is_measured_again(tmp_path: Path, wiki_validation: Path) -> None:
    cache.forget()
    cfg = build_config(tiny_base(tmp_path, wiki_validation))
    model = build_pretraining_model(cfg.model, cfg.objective)
    cache.cached_counts(model, cfg.model, cfg)
    (entry,) = (tmp_path / "runs" / cache.FOLDER).glob("*.json")
    entry.write_text("{", encoding="utf-8")
    cache.forget()
    _, params = cache.cached_counts(model, cfg.model, cfg)
    assert params[cache.CACHE] == "measured" and "counts" in json.loads(entry.read_text(encoding="utf-8"))


def test_the_corpus_check_is_memoized_per_file_state(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    good = "\n".join(json.dumps({"text": f"Document number {i:04d} of the corpus."}) for i in range(400))
    path.write_text(good, encoding="utf-8")
    data = DataConfig(corpus=str(path), val_fraction=0.1)
    check_corpus(data)
    stat = os.stat(path)
    path.write_text(json.dumps({"text": "x"}).ljust(len(good.encode())), encoding="utf-8")  # same size: too small
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    check_corpus(data)  # the same size and mtime: not scanned again
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with pytest.raises(DataError, match="too small"):
        check_corpus(data)  # a changed file is checked again
