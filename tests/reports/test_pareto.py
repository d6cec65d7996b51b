"""A guarded study's report: the Pareto front, the bound and the chosen configuration (reports/pareto.py)."""

from __future__ import annotations

import optuna
import pandas as pd
from matplotlib.image import imread

from ablate.cli import main
from ablate.reports.pareto import Guard, draw, front, to_markdown
from tests.sweeps.conftest import write_study

GUARD = Guard(
    metric="sst2/accuracy",
    direction="maximize",
    reference=0.90,
    reference_from="given",
    bound=0.89,
    objective="latency_ms_b1",
    objective_direction="minimize",
)


def _runs(points: list[tuple[str, float, float]]) -> pd.DataFrame:
    """A runs frame as reports read it: per run its objective, guard value and constraint."""
    return pd.DataFrame(
        {
            "run_id": [f"id-{name}" for name, _, _ in points],
            "run_name": [name for name, _, _ in points],
            "state": "COMPLETE",
            "trial": list(range(len(points))),
            "latency_ms_b1": [ms for _, ms, _ in points],
            "guard/value": [acc for _, _, acc in points],
            "guard/violation": [GUARD.bound - acc for _, _, acc in points],
        }
    )


def test_front_marks_the_bound_the_front_and_the_choice(tmp_path):
    runs = _runs([("fp32", 3.0, 0.91), ("int8", 1.5, 0.895), ("int4", 1.0, 0.86), ("slow-bad", 4.0, 0.85)])
    runs.loc[len(runs)] = {"run_id": "id-failed", "run_name": "failed", "state": "FAIL", "trial": 4}  # no guard
    result = front(runs, GUARD)
    p = result.points.set_index("run_name")
    assert list(p.index) == ["int4", "int8", "fp32", "slow-bad"]  # by objective, the unguarded run left out
    assert list(p["within_bound"]) == [False, True, True, False]
    assert list(p["on_front"]) == [True, True, True, False]  # slow-bad is beaten on both
    assert result.met and result.chosen is not None and result.chosen["run_name"] == "int8"
    md = to_markdown(result)
    assert "| **int8** (chosen) | 1.5 | 0.895 | yes | yes |" in md
    assert "Chosen configuration: `int8` (trial 1, run `id-int8`)" in md
    assert "`sst2/accuracy` >= 0.89 (reference 0.9, given)" in md
    assert draw(result, tmp_path / "pareto.png")
    img = imread(tmp_path / "pareto.png")
    assert img.shape[0] >= 600 and img.std() > 0.05


def test_when_no_configuration_meets_the_bound_the_closest_is_kept_and_said():
    result = front(_runs([("int4", 1.0, 0.80), ("int3", 0.8, 0.70), ("int8", 1.5, 0.86)]), GUARD)
    assert not result.met and result.chosen is not None and result.chosen["run_name"] == "int8"
    md = to_markdown(result)
    assert "No configuration met the bound" in md and "kept as the candidate: `int8`" in md
    assert "0.03 past the bound" in md


def test_a_guarded_study_reports_its_front_and_choice(tmp_path, wiki_validation, capsys):
    """A real tiny guarded study: ablate sweep, then ablate report; the report's Pareto section,
    pareto.csv and pareto.png agree with the trials' Optuna constraints."""
    guard = {"metric": "val/mlm_loss", "direction": "minimize", "max_drop": 1000.0, "reference": 5.0}
    path = write_study(
        tmp_path, wiki_validation, name="guarded", optimize={"metric": "params.backbone", "guard": guard}
    )
    assert main(["sweep", str(path)]) == 0
    said = capsys.readouterr().out
    assert "chosen trial" in said and "within the bound" in said
    storage = f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
    trials = optuna.load_study(study_name="guarded", storage=storage).trials
    assert all(t.constraints["guard"] <= 0 for t in trials) and len(trials) == 2
    smallest = min(trials, key=lambda t: t.value or 0.0)  # sharing=all: one layer's weights
    assert smallest.params["model.sharing"] == "all"

    out = tmp_path / "report"
    assert main(["report", str(path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "## Accuracy guard: the Pareto front" in md
    assert "Objective: minimize `params.backbone` within the bound `val/mlm_loss` <= 1005 (reference 5, given)" in md
    csv = pd.read_csv(out / "pareto.csv")
    assert len(csv) == 2 and csv["within_bound"].all() and csv["chosen"].sum() == 1
    chosen = csv[csv["chosen"]].iloc[0]
    assert chosen["run_id"] == smallest.user_attrs["mlflow_run_id"]
    assert f"Chosen configuration: `{chosen['run_name']}` (trial {smallest.number}, run `{chosen['run_id']}`)" in md
    assert (out / "pareto.png").stat().st_size > 10_000
