"""The reference workload beside every latency: a real MLflow store whose trial runs logged real
measurements (``measure_latencies`` of tiny models, logged by the runner's ``log_run_inputs``), one of
them beside a reference made slow on purpose, as a machine busy the whole time makes it.

The runs' references are injected (a steady sleep, and a ten times longer one): the real workload's
time depends on what else this machine runs, and a test of the marker must not (the shared test
machine itself once made a tiny model's batch-1 latency 500 ms, and its reference slow with it)."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch
from mlflow import MlflowClient

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.measure import measuring, profiling
from ablate.lightning_modules.measure.accounting import param_report
from ablate.lightning_modules.measure.reference_load import REFERENCE_SUFFIX, reference_workload
from ablate.lightning_modules.model.heads import build_pretraining_model
from ablate.reports import build_report
from ablate.reports.render import cells
from ablate.reports.runs import load_runs
from ablate.reports.spec import ReportSpec
from ablate.reports.tables import REFERENCE_LIMIT, REFERENCE_MARK, REFERENCE_NOTE, aggregate
from ablate.sweeps.engine.tracking import log_run_inputs

STUDY = "reference-check"
SLOW_LAYERS = 3  # the run measured beside a slow reference
STEADY_S, DELAY_S = 0.02, 0.2  # how long the injected references take: a quiet machine's, a busy one's


def tiny_cfg(num_layers: int) -> ExperimentConfig:
    model = {"preset": "albert-tiny", "vocab_size": 1000, "embed_dim": 16, "hidden_dim": 32, "num_heads": 2}
    return build_config(
        {
            "model": {**model, "num_layers": num_layers, "ffn_dim": 64, "max_position": 32},
            "data": {"max_length": 32, "batch_size": 4},
            "trainer": {"accelerator": "cpu"},
        }
    )


@dataclass
class Study:
    uri: str
    ids: dict[int, str]  # layers -> run id


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Study:
    root = tmp_path_factory.mktemp("reference")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(STUDY, artifact_location=(root / "art").as_uri())
    parent = client.create_run(exp, run_name=STUDY, tags={"ablate.role": "study", "ablate.study": STUDY}).info.run_id
    cpu = torch.device("cpu")
    ids: dict[int, str] = {}
    for n, layers in enumerate((1, 2, SLOW_LAYERS, 4)):
        cfg = tiny_cfg(layers)
        model = build_pretraining_model(cfg.model, cfg.objective)
        pause = DELAY_S if layers == SLOW_LAYERS else STEADY_S
        ref = functools.partial(time.sleep, pause)
        counts = {"params.backbone": float(param_report(model, cfg.model, 32).backbone)}
        counts |= profiling.measure_latencies(model, 1000, 32, cpu, repeats=10, warmup=1, reference=ref)
        tags = {"mlflow.parentRunId": parent, "ablate.role": "trial", "ablate.study": STUDY}
        tags |= {"ablate.trial": str(n), "ablate.state": "COMPLETE"}
        ids[layers] = client.create_run(exp, run_name=f"L={layers}", tags=tags).info.run_id
        log_run_inputs(client, ids[layers], cfg, counts, None)
        client.log_param(ids[layers], "measure.device", measuring.describe_device(cpu))
        client.set_terminated(ids[layers], "FINISHED")
    client.set_terminated(parent, "FINISHED")
    return Study(uri, ids)


def spec() -> ReportSpec:
    return ReportSpec.from_mapping(
        {
            "title": "Layers",
            "study": STUDY,
            "rows": ["model.num_layers"],
            "row_labels": {"model.num_layers": "L"},
            "metrics": [
                {"name": "params.backbone", "label": "Params", "format": "millions", "digits": 3},
                {"name": "latency_ms_b1", "label": "ms/b1", "digits": 2},
                {"name": "latency_ms_b32", "label": "ms/b32", "digits": 2},
            ],
        }
    )


def test_every_repeat_is_followed_by_one_run_of_the_reference() -> None:
    cfg = tiny_cfg(1)
    model = build_pretraining_model(cfg.model, cfg.objective)
    ran: list[int] = []
    lat = profiling.time_forward(model, 1000, 2, 16, repeats=4, warmup=2, reference=lambda: ran.append(1))
    assert len(lat.times_ms) == len(lat.reference_ms) == len(ran) == 4  # not during warm-up
    assert lat.reference_median_ms == statistics.median(lat.reference_ms) >= 0
    assert profiling.time_forward(model, 1000, 2, 16, repeats=2, warmup=0).reference_ms == ()
    # by default the fixed workload runs: real matrix products, the same result every time
    got = profiling.measure_latencies(model, 1000, 16, torch.device("cpu"), repeats=2, warmup=0)
    assert got["latency_ms_b1_reference"] > 0 and got["latency_ms_b32_reference"] > 0
    work = reference_workload("cpu")
    assert torch.equal(work(), work()) and torch.isfinite(work()).all()


def test_a_run_logs_the_reference_beside_each_latency(study: Study) -> None:
    metrics = MlflowClient(tracking_uri=study.uri).get_run(study.ids[1]).data.metrics
    for batch in profiling.LATENCY_BATCHES:
        assert metrics[profiling.latency_metric(batch) + REFERENCE_SUFFIX] > 0
    slow = MlflowClient(tracking_uri=study.uri).get_run(study.ids[SLOW_LAYERS]).data.metrics
    assert slow["latency_ms_b32_reference"] >= DELAY_S * 1e3  # every run of it took that long: the median too


def test_a_slow_reference_marks_the_latency_cells_of_its_run_only(study: Study, tmp_path: Path) -> None:
    runs, _ = load_runs(study.uri, STUDY)
    table = aggregate(runs, spec())
    headers, text, _ = cells(table)
    by_layers = {int(row[0]): dict(zip(headers, row, strict=True)) for row in text}
    for layers, row in by_layers.items():
        marked = layers == SLOW_LAYERS
        assert row["ms/b1"].endswith(REFERENCE_MARK) == marked, (layers, row)
        assert row["ms/b32"].endswith(REFERENCE_MARK) == marked, (layers, row)
        assert not row["Params"].endswith(REFERENCE_MARK)  # no reference logged: never marked
    ratio = table.stats.set_index("model.num_layers")["latency_ms_b32.reference"]
    assert ratio[SLOW_LAYERS] > REFERENCE_LIMIT and (ratio.drop(SLOW_LAYERS) < REFERENCE_LIMIT).all()
    res = build_report(spec(), STUDY, study.uri, tmp_path / "out", log_to_parent=False)
    md = res.markdown.read_text()
    assert REFERENCE_NOTE in md and REFERENCE_MARK in md
    assert "$^\\ddagger$" in res.latex.read_text()
    csv = pd.read_csv(res.csv).set_index("model.num_layers")
    assert csv.at[SLOW_LAYERS, "latency_ms_b32.reference"] > REFERENCE_LIMIT


def test_remeasure_times_the_real_reference_again(study: Study, tmp_path: Path) -> None:
    res = build_report(spec(), STUDY, study.uri, tmp_path / "out", remeasure=True, progress=False)
    again = pd.read_csv(res.remeasured).set_index("run_name")
    assert (again["latency_ms_b32_reference"] > 0).all()
    # each run's logged reference (an injected sleep) is replaced by this pass's: the real workload's
    # time, whatever this machine's load makes it
    client = MlflowClient(tracking_uri=study.uri)
    for layers, run_id in study.ids.items():
        logged = client.get_run(run_id).data.metrics["latency_ms_b32_reference"]
        assert again.at[f"L={layers}", "latency_ms_b32_reference"] != pytest.approx(logged, rel=1e-9)
    assert res.table.stats["latency_ms_b32.reference"].notna().all()
