from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from ablate.lightning_modules.config.errors import ConfigError
from ablate.reports.render import to_csv, to_markdown
from ablate.reports.runs import load_runs
from ablate.reports.seeds import SAMPLE_COLUMNS
from ablate.reports.spec import MetricSpec, ReportSpec
from ablate.reports.tables import aggregate, aggregated_metrics
from tests.reports.report_fixtures import STUDY


@pytest.fixture(scope="module")
def runs(store):
    return load_runs(store.uri, STUDY)[0]


def _row(table, sharing, embed):
    st = table.stats
    return st[(st["model.sharing"] == sharing) & (st["model.embed_dim"] == embed)].iloc[0]


def test_aggregate_means_stds_and_n(runs, spec):
    table = aggregate(runs, spec)
    assert table.keys() == [
        ("all", 64, 1),
        ("all", 128, 1),
        ("attn", 64, 2),
        ("ffn", 64, 1),
        ("none", 64, 1),
        ("none", 128, 1),
    ]  # 64 before 128: numeric sort
    r = _row(table, "all", 64)
    assert r["n"] == 2 and r["val/mlm_acc.n"] == 2
    assert r["val/mlm_acc.mean"] == pytest.approx(0.61)
    assert r["val/mlm_acc.std"] == pytest.approx(math.sqrt(2 * 0.01**2))  # sample std
    single = _row(table, "all", 128)
    assert single["n"] == 1 and math.isnan(single["val/mlm_acc.std"])
    # the failed seed of none/128 is left out; its completed seed lacks sentence_acc
    r = _row(table, "none", 128)
    assert r["n"] == 1 and r["val/loss.mean"] == 1.8 and r["val/sentence_acc.n"] == 0
    assert len(table.run_ids) == 6


def test_failed_only_rows_and_missing_cells(runs, spec):
    table = aggregate(runs, spec)
    assert _row(table, "attn", 64)["n"] == 0
    notes = [m.describe(spec) for m in table.missing]
    assert "sharing=attn E=64 F=2: no COMPLETE runs (1 FAIL)" in notes
    assert "sharing=ffn E=64 F=1: no COMPLETE runs (1 PRUNED)" in notes
    assert any(n.startswith("sharing=none E=128 F=1 / SOP acc: not recorded") for n in notes)
    md = to_markdown(table)
    assert "| attn | 64 | 2 | – | – | – | – | 0 |" in md
    # including PRUNED brings the ffn row back
    pruned = ReportSpec.from_mapping({**_as_mapping(spec), "include_states": ["COMPLETE", "PRUNED"]})
    assert _row(aggregate(runs, pruned), "ffn", 64)["val/mlm_acc.mean"] == 0.30


def _as_mapping(spec):
    import dataclasses

    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def test_unknown_row_param_is_a_config_error(runs):
    spec = ReportSpec.from_mapping(
        {"title": "T", "rows": ["model.sharing", "model.embedim"], "metrics": [{"name": "val/loss"}]}
    )
    with pytest.raises(ConfigError, match=r"^report\.rows\[1\]: 'model\.embedim'"):
        aggregate(runs, spec)


def test_non_numeric_metric_is_a_config_error(runs):
    spec = ReportSpec.from_mapping(
        {"title": "T", "rows": ["model.sharing"], "metrics": [{"name": "val/loss"}, {"name": "val/corpus"}]}
    )
    runs = runs.assign(**{"val/corpus": runs["data.corpus"]})  # a column of text under a metric's name
    with pytest.raises(ConfigError, match=r"^report\.metrics\[1\]\.name: 'val/corpus' is not numeric"):
        aggregate(runs, spec)


def test_details_are_text_columns_beside_the_keys(runs):
    spec = ReportSpec(
        title="t",
        rows=("model.sharing",),
        details=("model.embed_dim",),
        row_labels={"model.embed_dim": "E seen"},
        metrics=(MetricSpec(name="val/mlm_acc"),),
    )
    table = aggregate(runs, spec)
    assert table.keys() == [("all",), ("attn",), ("ffn",), ("none",)]  # details do not group
    by_key = dict(zip(table.keys(), table.stats["model.embed_dim"], strict=True))
    assert by_key[("all",)] == "128 / 64"
    assert by_key[("attn",)] == ""  # its runs all failed: no included run to show
    # the samples the statistics are over stay the seeds' values, whatever columns are added beside them
    assert list(table.samples.columns) == list(SAMPLE_COLUMNS)
    counts = table.samples[table.samples["metric"] == "val/mlm_acc"].groupby("row").size()
    assert counts.reindex(range(len(table.keys())), fill_value=0).to_list() == table.stats["val/mlm_acc.n"].to_list()
    md = to_markdown(table)
    assert md.splitlines()[0].startswith("| sharing | E seen |")
    assert "| all | 128 / 64 |" in md
    assert "model.embed_dim" in to_csv(table).splitlines()[0]
    with pytest.raises(Exception, match="not one of rows .* or details"):
        ReportSpec(title="t", rows=("model.sharing",), row_labels={"nope": "x"}, metrics=(MetricSpec(name="val/loss"),))


def test_rows_follow_a_given_order_then_the_natural_one(runs):
    spec = ReportSpec(
        title="t",
        rows=("model.sharing", "model.embed_dim"),
        order={"model.sharing": ("none", "all"), "model.embed_dim": (128,)},
        metrics=(MetricSpec(name="val/mlm_acc"),),
    )
    keys = aggregate(runs, spec).keys()
    assert [k[:2] for k in keys] == [("none", 128), ("none", 64), ("all", 128), ("all", 64), ("attn", 64), ("ffn", 64)]
    with pytest.raises(Exception, match="not one of rows"):
        ReportSpec(title="t", rows=("model.sharing",), order={"model.num_ffn": (1,)}, metrics=spec.metrics)


def test_an_optional_metric_leaves_empty_cells_not_missing_ones(runs, spec):
    mapping = _as_mapping(spec)
    mapping["metrics"] = [dataclasses.replace(m, optional=m.name == "val/sentence_acc") for m in spec.metrics]
    table = aggregate(runs, ReportSpec.from_mapping(mapping))
    notes = [m.describe(table.spec) for m in table.missing]
    assert not any("SOP acc" in n for n in notes)  # none/128 logged no sentence accuracy: an empty cell
    assert "sharing=attn E=64 F=2: no COMPLETE runs (1 FAIL)" in notes  # a row without runs still is missing
    assert _row(table, "none", 128)["val/sentence_acc.n"] == 0


def test_a_curve_plot_carries_every_name_it_takes():
    over = {"x": "sst2/speed_{}/latency_ms", "y": "sst2/speed_{}/accuracy", "over": [0, 0.5]}
    spec = ReportSpec.from_mapping(
        {"title": "t", "rows": ["variant"], "metrics": [{"name": "sst2/speed_0/accuracy"}], "plots": [over]}
    )
    assert aggregated_metrics(spec) == [
        "sst2/speed_0/accuracy",  # a table column too: listed once
        "sst2/speed_0/latency_ms",
        "sst2/speed_0.5/latency_ms",
        "sst2/speed_0.5/accuracy",
    ]
    runs = pd.DataFrame(
        {
            "run_id": ["a", "b", "c"],
            "state": ["COMPLETE"] * 3,
            "variant": ["L6", "L6", "L3"],
            "sst2/speed_0/accuracy": [0.80, 0.82, 0.75],
            "sst2/speed_0.5/accuracy": [0.78, 0.80, None],
            "sst2/speed_0/latency_ms": [10.0, 12.0, 5.0],
        }
    )
    table = aggregate(runs, spec)
    row = table.stats.set_index("variant").loc["L6"]
    assert row["sst2/speed_0.5/accuracy.mean"] == pytest.approx(0.79) and row["sst2/speed_0/latency_ms.n"] == 2
    assert table.stats["sst2/speed_0.5/latency_ms.n"].tolist() == [0, 0]  # logged by no run: empty, no error
    assert [m.metric for m in table.missing] == []  # plot axes are not table cells
    bad = runs.assign(**{"sst2/speed_0.5/accuracy": ["x", "y", "z"]})
    with pytest.raises(ConfigError, match=r"^report\.plots\[0\]\.y: 'sst2/speed_0\.5/accuracy' is not numeric"):
        aggregate(bad, spec)
