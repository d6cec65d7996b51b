"""``ablate report --experiment NAME [--tag KEY=VALUE]``: real ``ablate train`` runs (tiny model, real
text, SQLite MLflow) tabulated one row per run, in the files a study's report has."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from ablate.cli import main
from tests.reports.report_fixtures import STUDY
from tests.sweeps.conftest import tiny_base

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, wiki_validation):
    """Two ``ablate train`` runs in experiment ``exp`` (sharing all, then none), one in ``other``; in
    ``seeds``, sharing all with seeds 0 and 1 and sharing none with seed 0."""
    root = tmp_path_factory.mktemp("train-runs")
    base = tiny_base(root, wiki_validation, max_steps=2, val_every=2, measure=False)
    base["tracking"]["experiment"] = "exp"
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(base))
    for args in (["model.sharing=all"], ["model.sharing=none"], ["tracking.experiment=other"]):
        assert main(["train", str(config), *args]) == 0
    for sharing, seed in (("all", 0), ("all", 1), ("none", 0)):
        assert (
            main(["train", str(config), "tracking.experiment=seeds", f"model.sharing={sharing}", f"seed={seed}"]) == 0
        )
    return root, f"sqlite:///{root / 'runs' / 'mlflow.db'}"


def test_an_experiments_train_runs_one_row_each(trained, tmp_path, capsys):
    _, uri = trained
    out = tmp_path / "report"
    assert main(["report", "--experiment", "exp", "--tracking-uri", uri, "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"report.md", "report.tex", "report.csv", "runs.csv"}
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["model.sharing"]) == ["all", "none"]  # the earliest started first
    assert set(runs["trainer.max_steps"]) == {2} and "optim.lr" in runs.columns  # the whole flattened config
    assert runs["val/loss"].notna().all()
    table = pd.read_csv(out / "report.csv")
    assert list(table["run_id"]) == list(runs["run_id"]) and list(table["model.sharing"]) == ["all", "none"]
    assert list(table["val/loss.mean"]) == pytest.approx(list(runs["val/loss"]))
    md = (out / "report.md").read_text()
    assert md.startswith("# ablate train runs of experiment exp")
    header = md.splitlines()[2]
    assert "| run | run_name | model.sharing | " in header and "| val/loss |" in header  # what varies, then metrics
    assert "| trainer.max_steps | 2 |" in md  # the settings every run shares
    assert "Experiment: `exp`" in md and "Missing: none" in md
    assert "report written to" in capsys.readouterr().out


def test_runs_that_differ_only_in_seed_are_one_row_with_an_interval(trained, tmp_path):
    _, uri = trained
    out = tmp_path / "report"
    assert main(["report", "--experiment", "seeds", "--tracking-uri", uri, "--out", str(out)]) == 0
    runs = pd.read_csv(out / "runs.csv")
    table = pd.read_csv(out / "report.csv").set_index("model.sharing")
    assert list(table.index) == ["all", "none"] and list(table["n"]) == [2, 1]
    seeded = runs[runs["model.sharing"] == "all"]["val/loss"]
    assert table.at["all", "val/loss.mean"] == pytest.approx(seeded.mean())
    assert table.at["all", "val/loss.std"] == pytest.approx(seeded.std())  # two seeds: a spread and an interval
    assert table.at["all", "seed"] == "0 / 1"
    md = (out / "report.md").read_text()
    assert md.startswith("# ablate train runs of experiment seeds, seeds in one row")
    assert "| run ids | run_name | model.sharing | seed |" in md.splitlines()[2] and " ± " in md


def test_tag_picks_runs_by_param(trained, tmp_path):
    _, uri = trained
    out = tmp_path / "report"
    argv = ["report", "--experiment", "exp", "--tag", "model.sharing=none", "--tracking-uri", uri, "--out", str(out)]
    assert main(argv) == 0
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["model.sharing"]) == ["none"]
    assert "| model.sharing | none |" in (out / "report.md").read_text()  # one run: all its settings shared


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--experiment", "exp", "--tag", "optim.lr=0.5"], "--experiment exp: no ablate train runs with optim.lr=0.5"),
        (["--experiment", "nowhere"], "--experiment nowhere: no ablate train runs in"),
        (["--experiment", "exp", "--tag", "nokey"], "--tag 'nokey': expected KEY=VALUE"),
        (["--tag", "a=b"], "--tag: only for `ablate report experiment`"),
        (["quickstart", "--experiment", "exp"], "quickstart: not an argument of ablate report experiment"),
        (["--experiment", "exp", "--remeasure"], "--remeasure: only for `ablate report` (not"),
    ],
)
def test_bad_experiment_reports_write_nothing(trained, tmp_path, capsys, argv, needle):
    _, uri = trained
    out = tmp_path / "report"
    assert main(["report", *argv, "--tracking-uri", uri, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_a_studys_experiment_points_at_the_study_report(store, tmp_path, capsys):
    assert main(["report", "--experiment", STUDY, "--tracking-uri", store.uri, "--out", str(tmp_path / "r")]) == 2
    assert f"runs of study {STUDY}: ablate report STUDY.yaml (its file)" in capsys.readouterr().err
