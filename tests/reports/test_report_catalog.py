"""Shipped report specs and how a study names its report (inline, shipped name or path)."""

from __future__ import annotations

import pytest
import yaml

from ablate.cli import main
from ablate.lightning_modules.config.errors import ConfigError
from ablate.reports import catalog
from ablate.reports.catalog import study_report
from ablate.reports.spec import ReportSpec
from ablate.sweeps.spec import load_study

STUDY = {
    "name": "s",
    "base": {"model": {"preset": "bert-tiny"}, "data": {"corpus": "norvig-big"}},
    "search": {"model.sharing": {"choices": ["all", "none"]}},
}


def _write(tmp_path, report):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**STUDY, "report": report}), encoding="utf-8")
    return path


def test_every_shipped_spec_is_valid_and_names_its_study():
    for name in catalog.names():
        spec = ReportSpec.from_yaml(catalog.shipped(name))
        assert spec.study == name and spec.metrics


def test_shipped_names_accept_underscores():
    assert catalog.shipped("albert_table3") == catalog.shipped("albert-table3") is not None


def test_a_study_names_a_shipped_report(tmp_path):
    spec, _ = load_study(_write(tmp_path, "albert-table4"))
    assert study_report(spec, tmp_path / "study.yaml").title.startswith("ALBERT Table 4")


def test_a_study_names_a_report_file_beside_it(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        yaml.safe_dump({"title": "Mine", "rows": ["model.sharing"], "metrics": [{"name": "val/loss"}]}),
        encoding="utf-8",
    )
    spec, _ = load_study(_write(tmp_path, "mine.yaml"))
    assert study_report(spec, tmp_path / "study.yaml").title == "Mine"


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ("albert-table9", "report: albert-table9: not a shipped report (one of albert-table3"),
        ("nope.yaml", "report: nope.yaml: no such report spec file"),
        (
            {"title": "t", "rows": ["model.sharing"], "metrics": [{"name": "val/m", "format": "pct"}]},
            "report.metrics[0].format: Input should be",
        ),
    ],
)
def test_a_bad_report_fails_when_the_study_is_read(tmp_path, capsys, monkeypatch, report, message):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, report)
    with pytest.raises(ConfigError, match="report"):
        study_report(load_study(path)[0], path)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {path}: {message}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]  # no store, no run


def test_report_cli_refuses_a_spec_without_study(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"title": "t", "rows": ["x"], "metrics": [{"name": "val/m"}]}), encoding="utf-8")
    assert main(["report", str(path), "--tracking-uri", f"sqlite:///{tmp_path}/none.db"]) == 2
    assert "study: required in a report spec (or give --study)" in capsys.readouterr().err
