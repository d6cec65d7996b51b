"""``ablate report``'s latency, timed as deployed: a real MLflow store of fine-tuning runs (logged by the
runner's own ``log_run_inputs``) whose models are float, dynamic int8 and 3-bit weight-only. The first two are
timed as the ONNX graphs ``ablate export --format onnx [--quantize]`` writes, through ONNX Runtime; the third
(bits MatMulNBits lacks) in PyTorch, and the report says which for each row. Whether the ratios between rows
hold when a report is made twice is a measurement, not a test: docs/reports.md gives it, machine and date."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.load import build_config
from ablate.reports import build_report
from ablate.reports.remeasure import RUNTIME
from ablate.reports.spec import ReportSpec
from ablate.sweeps.engine.tracking import log_run_inputs

STUDY = "deployed-latency"
LOGGED = 1234.0  # what every run logged as its latency: the report shows its own figures instead
METHODS = {"none": "ORT fp32", "dynamic-int8": "ORT int8", "weight-int3": "PyTorch int3 weight-only"}


def finetune_cfg(method: str) -> ExperimentConfig:
    model = {"preset": "bert-tiny", "vocab_size": 1000, "hidden_dim": 128, "num_heads": 2, "num_layers": 2}
    return build_config(
        {
            "model": {**model, "ffn_dim": 256, "max_position": 64},
            "finetune": {"source": "runs:/0123", "num_labels": 2, "max_length": 64},
            "quant": {"method": method},
            "trainer": {"accelerator": "cpu"},
        }
    )


@dataclass
class Study:
    uri: str
    ids: dict[str, str]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Study:
    root = tmp_path_factory.mktemp("deployed")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(STUDY, artifact_location=(root / "art").as_uri())
    parent = client.create_run(exp, run_name=STUDY, tags={"ablate.role": "study", "ablate.study": STUDY}).info.run_id
    ids: dict[str, str] = {}
    for n, method in enumerate(METHODS):
        tags = {"mlflow.parentRunId": parent, "ablate.role": "trial", "ablate.study": STUDY}
        tags |= {"ablate.trial": str(n), "ablate.state": "COMPLETE"}
        ids[method] = client.create_run(exp, run_name=method, tags=tags).info.run_id
        logged = {"latency_ms_b1": LOGGED, "latency_ms_b32": LOGGED}
        log_run_inputs(client, ids[method], finetune_cfg(method), logged, None)
    for rid in [*ids.values(), parent]:
        client.set_terminated(rid, "FINISHED")
    return Study(uri, ids)


def spec() -> ReportSpec:
    return ReportSpec.from_mapping(
        {
            "title": "Quantized, deployed",
            "study": STUDY,
            "rows": ["quant.method"],
            "metrics": [
                {"name": "latency_ms_b1", "label": "ms/b1", "digits": 2, "better": "lower"},
                {"name": "latency_ms_b32", "label": "ms/b32", "digits": 2, "better": "lower"},
            ],
        }
    )


def _latencies(study: Study, out: Path) -> tuple[pd.Series, pd.DataFrame, str]:
    res = build_report(spec(), STUDY, study.uri, out, log_to_parent=False, remeasure=True, progress=False)
    assert res.remeasured is not None
    stats = res.table.stats.set_index("quant.method")
    return stats["latency_ms_b32.mean"], pd.read_csv(res.remeasured), res.markdown.read_text()


def test_latency_is_timed_as_deployed(study: Study, tmp_path: Path) -> None:
    first, again, md = _latencies(study, tmp_path / "one")
    # each row says which runtime and form timed it; the 3-bit one says why not ONNX Runtime
    by_name = again.set_index("run_name")
    assert {m: by_name.at[m, RUNTIME] for m in METHODS} == METHODS
    assert "MatMulNBits holds 2-, 4- and 8-bit weights, not 3-bit" in by_name.at["weight-int3", "why"]
    assert by_name.at["none", "why"] != by_name.at["none", "why"]  # NaN: ONNX Runtime ran it, no reason
    assert "| timed by |" in md and "| ORT int8 |" in md and "instruction sets AVX2" in md
    assert f"{LOGGED:.2f}" not in md
    for name in ("latency_ms_b1", "latency_ms_b32", "latency_ms_b1_all", "latency_ms_b32_all"):
        assert (again[name] > 0).all()
