"""What ``ablate report TARGET`` reads: a shipped study's name resolves like a shipped report's; a
report before any sweep names the command that makes the runs; a cell no trial ever started is
listed as missing. Real SQLite MLflow stores, runs logged as the runner logs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.errors import ConfigError
from ablate.reports.target import resolve_target, shipped_study, shown
from ablate.sweeps.engine import tracking
from ablate.sweeps.spec import load_study, trial_config

QUICKSTART = shipped_study("quickstart")
assert QUICKSTART is not None


def test_a_shipped_study_name_resolves_to_the_study() -> None:
    target = resolve_target("quickstart")
    assert target.study == "quickstart" and target.report.title.startswith("Quickstart")
    assert target.sweep is not None and target.sweep.endswith("sweeps/studies/quickstart.yaml")
    # the grid: E x sharing x F, one seed each
    assert target.expected is not None and sorted(target.expected.trials.values()) == [1] * 8
    assert ("all", 32, 1) in target.expected.trials
    by_file = resolve_target(str(QUICKSTART))
    assert (by_file.study, by_file.report, by_file.expected) == (target.study, target.report, target.expected)


def test_a_shipped_report_name_still_wins_and_knows_its_study() -> None:
    target = resolve_target("albert-table3")
    assert target.report.title.startswith("ALBERT Table 3") and target.study == "albert-table3"
    assert target.sweep is not None and target.sweep.endswith("albert_table3.yaml")
    assert resolve_target("albert-table3", study="mine").sweep is None  # another study: not that grid


def test_an_unknown_name_lists_both_kinds(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^nope: not a shipped report \(one of albert-table3.*a shipped study \(one of .*quickstart"
    ):
        resolve_target("nope")
    with pytest.raises(ConfigError, match="no such report spec file"):
        resolve_target(str(tmp_path / "absent.yaml"))


def test_a_report_before_any_sweep_says_which_command_makes_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["report", "quickstart"]) == 2
    err = capsys.readouterr().err
    store = f"sqlite:///{tmp_path.resolve()}/ablate-runs/mlflow.db"
    assert err == (
        f"error: no runs for study quickstart in {store} (no MLflow store there yet); run: ablate sweep {QUICKSTART}\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing created
    # a store that holds other studies only: the same advice
    uri = f"sqlite:///{tmp_path}/other.db"
    tracking.experiment_id(tracking.connect(uri), "another", uri)
    assert main(["report", "albert-table3", "--tracking-uri", uri]) == 2
    assert capsys.readouterr().err.startswith(f"error: no runs for study albert-table3 in {uri}; run: ablate sweep ")


def _log(client: MlflowClient, exp: str, parent: str, cfg_params: tuple[Path, dict[str, object]], state: str) -> str:
    """A trial run as the sweep logs it: tags, the trial config's params (``log_run_inputs``), metrics."""
    path, params = cfg_params
    spec, base = load_study(path)
    cfg = trial_config(base, spec, params)
    tags = {tracking.ROLE: "trial", tracking.STUDY: spec.name, tracking.STATE: state}
    run = tracking.start_run(client, exp, " ".join(f"{k}={v}" for k, v in params.items()), tags, parent)
    metrics = {"params.backbone": 1e6, "flops_per_token": 2e6, "latency_ms_b32": 25.0} if state == "COMPLETE" else {}
    metrics |= {"val/mlm_acc": 0.07, "val/sentence_acc": 0.5, "val/loss": 7.5} if state == "COMPLETE" else {}
    tracking.log_run_inputs(client, run, cfg, metrics, None)
    tracking.end_run(client, run, "FINISHED" if state == "COMPLETE" else "FAILED")
    return run


def _store(tmp_path: Path, name: str) -> tuple[str, MlflowClient, str, str]:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = tracking.connect(uri)
    exp = tracking.experiment_id(client, name, uri)
    parent = tracking.start_run(client, exp, name, {tracking.ROLE: "study", tracking.STUDY: name})
    return uri, client, exp, parent


def test_cells_that_never_started_are_listed_as_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri, client, exp, parent = _store(tmp_path, "quickstart")
    done = {"model.embed_dim": 32, "model.sharing": "all", "model.num_ffn": 1, "seed": 0}
    failed = {"model.embed_dim": 128, "model.sharing": "none", "model.num_ffn": 2, "seed": 0}
    _log(client, exp, parent, (QUICKSTART, done), "COMPLETE")
    _log(client, exp, parent, (QUICKSTART, failed), "FAIL")
    out = tmp_path / "out"
    assert main(["report", "quickstart", "--tracking-uri", uri, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    md = (out / "report.md").read_text()
    missing = md.split("Missing:")[1].strip().splitlines()
    never = [line for line in missing if "never started" in line]
    assert len(never) == 6  # 8 grid points, one ran, one failed
    assert all(
        line.endswith(f"never started: no run of its 1 trial; run: ablate sweep {shown(QUICKSTART)}") for line in never
    )
    assert "- sharing=none E=128 F=2: no COMPLETE runs (1 FAIL)" in missing
    assert not any("sharing=all E=32 F=1" in line for line in missing)
    table = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| sharing")]
    assert len(table) == 8  # every row of the grid is in the table, the empty ones with – cells
    assert printed.count("never started") == 6


def test_a_row_short_of_its_seeds_says_how_many_never_started(tmp_path: Path) -> None:
    study = yaml.safe_load(QUICKSTART.read_text()) | {"name": "seeds", "seeds": [0, 1, 2]}
    study["search"] = {"model.embed_dim": {"choices": [32]}, "model.sharing": {"choices": ["all"]}}
    study["search"]["model.num_ffn"] = {"choices": [1]}
    path = tmp_path / "seeds.yaml"
    path.write_text(yaml.safe_dump(study), encoding="utf-8")
    uri, client, exp, parent = _store(tmp_path, "seeds")
    _log(
        client,
        exp,
        parent,
        (path, {"model.embed_dim": 32, "model.sharing": "all", "model.num_ffn": 1, "seed": 1}),
        "COMPLETE",
    )
    out = tmp_path / "out"
    assert main(["report", str(path), "--tracking-uri", uri, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert f"- sharing=all E=32 F=1: 2 of its 3 trials never started (1 run); run: ablate sweep {path}" in md


def test_runs_of_another_grid_are_not_held_against_this_one(tmp_path: Path) -> None:
    uri, client, exp, parent = _store(tmp_path, "quickstart")
    other = {"model.embed_dim": 64, "model.sharing": "all", "model.num_ffn": 1, "seed": 0}  # not in the grid
    _log(client, exp, parent, (QUICKSTART, other), "COMPLETE")
    out = tmp_path / "out"
    assert main(["report", "quickstart", "--tracking-uri", uri, "--out", str(out)]) == 0
    assert "never started" not in (out / "report.md").read_text()
