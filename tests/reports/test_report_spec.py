from __future__ import annotations

import dataclasses

import pytest

from ablate.lightning_modules.config.errors import ConfigError
from ablate.reports.spec import MetricSpec, ReportSpec

GOOD = {
    "title": "T",
    "rows": ["model.sharing", "model.embed_dim"],
    "metrics": [{"name": "params.backbone", "format": "millions"}, {"name": "val/mlm_acc", "better": "higher"}],
    "plots": [{"x": "params.backbone", "y": "val/mlm_acc", "hue": "model.sharing"}],
}


def test_parses_with_defaults():
    spec = ReportSpec.from_mapping(GOOD)
    assert spec.rows == ("model.sharing", "model.embed_dim")
    assert spec.include_states == ("COMPLETE",)
    assert spec.metrics[1] == MetricSpec(name="val/mlm_acc", better="higher")
    assert spec.metrics[0].ndigits == 1 and spec.metrics[1].ndigits == 3
    assert spec.row_label("model.embed_dim") == "embed_dim"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.title = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"metrics": [{"name": "val/a"}, {"name": "val/b"}, {"label": "no name"}]}, "report.metrics[2].name: "),
        ({"metrics": [{"name": "val/a", "format": "pct"}]}, "report.metrics[0].format: "),
        ({"metrics": [{"name": "val/a", "colour": "red"}]}, "report.metrics[0].colour: unknown key"),
        ({"metrics": [{"name": "val/a"}, {"name": "val/a"}]}, "report.metrics[1]: 'val/a' is listed twice"),
        ({"metrics": [{"name": "a"}]}, "report.metrics[0].name: metric 'a' is not in ablate's registry"),
        ({"metrics": []}, "report.metrics: "),
        ({"rows": []}, "report.rows: "),
        ({"rows": ["a", "a"]}, "report.rows: duplicate"),
        ({"colour": 1}, "report.colour: unknown key"),
        ({"plots": [{"x": "a", "y": "b", "hue": "model.seed"}]}, "report.plots[0].hue: "),
        ({"plots": [{"x": "a", "y": "model.sharing"}]}, "report.plots[0].y: "),
        ({"plots": [{"x": "s/ms", "y": "s_{}/acc", "over": [0.1]}]}, "report.plots[0].x: 's/ms' must hold {} exactly"),
        ({"plots": [{"x": "a", "y": "b"}, {"x": "s_{}", "y": "{}_{}", "over": ["0"]}]}, "report.plots[1].y: "),
        ({"plots": [{"x": "a", "y": "s_{}/acc"}]}, "report.plots[0].y: 's_{}/acc' holds {} but the plot has no over"),
        ({"plots": [{"x": "s_{}/ms", "y": "b"}]}, "report.plots[0].x: 's_{}/ms' holds {} but"),
        ({"plots": [{"x": "s_{}", "y": "a_{}", "over": [0.1, "0.1"]}]}, "report.plots[0].over[1]: '0.1' is listed"),
        ({"plots": [{"x": "s_{}", "y": "a_{}", "over": [True]}]}, "report.plots[0].over[0]: "),
        ({"row_labels": {"model.num_ffn": "F"}}, "report.row_labels.model.num_ffn: "),
        ({"include_states": ["DONE"]}, "report.include_states[0]: "),
        ({"title": None}, "report.title: "),
    ],
)
def test_errors_name_the_key(change, key):
    with pytest.raises(ConfigError) as err:
        ReportSpec.from_mapping({**GOOD, **change})
    assert str(err.value).startswith(key), str(err.value)


def test_not_a_mapping():
    with pytest.raises(ConfigError, match=r"^study\.report: expected a mapping"):
        ReportSpec.from_mapping(["x"], where="study.report")


def test_standalone_yaml(tmp_path):
    path = tmp_path / "REPORT.yaml"
    path.write_text("study: s1\ntracking_uri: sqlite:///x.db\ntitle: T\nrows: [a]\nmetrics: [{name: val/m}]\n")
    spec = ReportSpec.from_yaml(path)
    assert (spec.study, spec.tracking_uri) == ("s1", "sqlite:///x.db")
    path.write_text("title: T\nrows: [a]\nmetrics: [{name: val/m, digits: -1}]\n")
    with pytest.raises(ConfigError, match=r"REPORT\.yaml\.metrics\[0\]\.digits: "):
        ReportSpec.from_yaml(path)
    path.write_text("title: [unclosed\n")
    with pytest.raises(ConfigError, match=r"REPORT\.yaml"):
        ReportSpec.from_yaml(path)


def test_a_curve_plot_takes_one_name_per_over_value():
    plot = {"x": "sst2/speed_{}/latency_ms", "y": "sst2/speed_{}/accuracy", "over": [0, 0.1, 1.0, "fast"]}
    spec = ReportSpec.from_mapping({**GOOD, "plots": [plot]})
    (p,) = spec.plots
    assert p.over == ("0", "0.1", "1", "fast")  # numbers as FastBERT logs them: f"{s:g}"
    assert p.names("x") == [
        "sst2/speed_0/latency_ms",
        "sst2/speed_0.1/latency_ms",
        "sst2/speed_1/latency_ms",
        "sst2/speed_fast/latency_ms",
    ]
    assert p.names("y")[1] == "sst2/speed_0.1/accuracy" and p.hue is None
    assert spec.plots[0] != ReportSpec.from_mapping(GOOD).plots[0]
    assert ReportSpec.from_mapping(GOOD).plots[0].names("y") == ["val/mlm_acc"]  # no over: the name itself
