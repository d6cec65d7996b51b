"""Every shipped report spec builds, from real recorded runs, into a complete table."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from ablate.reports import catalog
from ablate.reports.build import build_report
from ablate.reports.runs import parse_param
from ablate.reports.spec import ReportSpec
from ablate.sweeps.spec import load_study
from tests import forked
from tests.reports.recorded import FIXTURE, replay

NAMES = catalog.names()
STUDIES = sorted((Path(__file__).resolve().parents[2] / "sweeps" / "studies").glob("*.yaml"))
RECORDED = json.loads(gzip.decompress(FIXTURE.read_bytes()))["studies"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict[str, list[str]]]:
    root = tmp_path_factory.mktemp("recorded")
    uri = f"sqlite:///{root}/mlflow.db"
    return uri, root, replay(uri, root / "artifacts")


def test_the_paper_tables_are_shipped():
    assert set(NAMES) >= {
        "albert-table3",
        "albert-table4",
        "albert-table5",
        "mobilebert-operational",
        "distill-losses",
        "distill-strategies",
        "schubert",
        "embedding-simplification",
    }


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_a_study_naming_a_shipped_report_is_its_study(path):
    spec, _ = load_study(path)
    if isinstance(spec.report, str):  # or a profile of it for other hardware (albert-table5-gpu)
        study = ReportSpec.from_yaml(catalog.shipped(spec.report)).study
        assert spec.name == study or spec.name.startswith(f"{study}-"), (spec.name, study)


@pytest.mark.parametrize("name", NAMES)
def test_shipped_spec_builds_from_recorded_runs(name, recorded, tmp_path):
    uri, _, ids = recorded
    spec = catalog.load_named(name)
    trials = RECORDED[spec.study]["trials"]
    complete = [
        (rid, t)
        for rid, t in zip(ids[spec.study], trials, strict=True)
        if t["tags"]["ablate.state"] in spec.include_states
    ]
    assert complete, f"the recording holds no {spec.include_states} trial of {spec.study}"

    result = build_report(spec, spec.study, uri, tmp_path / name)

    assert sorted(result.run_ids) == sorted(rid for rid, _ in complete)
    assert result.missing == [], result.missing  # every cell of every recorded study is filled
    keys = {tuple(_value(t["params"].get(r)) for r in spec.rows) for _, t in complete}
    assert set(result.table.keys()) == keys
    order = result.table.keys()
    for key in keys:  # each cell is the mean of the row's recorded values
        row = result.table.stats.iloc[order.index(key)]
        for m in spec.metrics:
            values = [
                t["metrics"][m.name]
                for _, t in complete
                if tuple(_value(t["params"].get(r)) for r in spec.rows) == key and m.name in t["metrics"]
            ]
            if m.optional and not values:  # a metric only some rows log: an empty cell, not a missing one
                assert row[f"{m.name}.n"] == 0
                continue
            assert row[f"{m.name}.mean"] == pytest.approx(sum(values) / len(values))
    md = result.markdown.read_text()
    assert md.startswith(f"# {spec.title}") and all(m.display in md for m in spec.metrics)
    assert all(rid in md for rid, _ in complete) and "Missing: none" in md
    tex = result.latex.read_text()
    assert "\\toprule" in tex and "\\bottomrule" in tex and "\\textbf{" in tex
    assert len(pd.read_csv(result.csv)) == len(keys)
    assert len(result.plots) == len(spec.plots)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in result.plots)


def test_report_from_mlflow_alone(recorded, tmp_path):
    """A folder holding only the MLflow store: ``ablate report NAME`` rebuilds the table."""
    _, root, ids = recorded
    (tmp_path / "ablate-runs").mkdir()
    shutil.copy(root / "mlflow.db", tmp_path / "ablate-runs" / "mlflow.db")
    env_path = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}
    proc = forked.run(["report", "albert-table5"], cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "ablate-runs" / "reports" / "albert-table5" / "report.md").read_text()
    assert all(rid in md for rid in ids["albert-table5"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ablate-runs"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/ablate-runs/mlflow.db")
    parent = client.search_runs(
        [client.get_experiment_by_name("albert-table5").experiment_id], "tags.`ablate.role` = 'study'"
    )[0]
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "report")} >= {
        "report/report.md",
        "report/report.tex",
    }

    bad = forked.run(["report", "albert-table9"], cwd=tmp_path, env=env, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert bad.stderr.startswith("error: albert-table9: not a shipped report (one of albert-table3")


def _value(v: str | None) -> object:
    return parse_param(v)
