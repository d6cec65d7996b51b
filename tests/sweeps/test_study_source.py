"""A study with ``source:`` fine-tunes an existing model on its tasks over seeds, pre-training nothing."""

from __future__ import annotations

import csv

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import trained_run

SST2 = SHARED_DATA / "sst2"


def _task(tmp_path, **extra) -> dict:
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:401]) + "\n", encoding="utf-8")
    task = {"task": "sst2", "train": str(tmp_path / "train.tsv"), "validation": str(SST2 / "validation.tsv")}
    return {**task, "max_length": 32, "batch_size": 16, "lr": 1e-3, "max_steps": 4, "val_every": 2, **extra}


def _write(tmp_path, source: str, **extra) -> object:
    study = {
        "name": "from-run",
        "base": {"trainer": {"measure": False, "progress": False}, "tracking": {"root": str(tmp_path / "runs")}},
        "source": source,
        "tasks": [_task(tmp_path, seeds=[3, 4, 5])],
        "optimize": {"metric": "sst2/best_accuracy", "direction": "maximize"},
        **extra,
    }
    path = tmp_path / "from-run.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def test_a_study_fine_tunes_a_run_over_seeds_and_reports_intervals(tmp_path, wiki_validation, capsys):
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    _, pre = trained_run(tmp_path, wiki_validation)
    path = _write(tmp_path, f"runs:/{pre.run_id}")
    assert main(["sweep", str(path), "--check"]) == 0
    assert "fine-tuned on sst2 from runs:/" in capsys.readouterr().out
    assert main(["sweep", str(path)]) == 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("from-run").experiment_id
    (trial,) = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    stages = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{trial.info.run_id}'")
    assert sorted(s.data.tags["ablate.stage"] for s in stages) == ["finetune:sst2"] * 3  # nothing pre-trained
    assert {s.data.params["finetune.source"] for s in stages} == {f"runs:/{pre.run_id}"}
    assert sorted(s.data.params["seed"] for s in stages) == ["3", "4", "5"]
    assert trial.data.tags["ablate.pretrain_run"] == pre.run_id
    assert trial.data.params["model.hidden_dim"] == "32"  # the source's architecture, as the trial's params
    assert "val/mlm_acc" in trial.data.metrics  # the source's own figures, carried
    assert main(["report", str(path), "--out", str(tmp_path / "rep")]) == 0  # no report: declared: the default
    (row,) = csv.DictReader((tmp_path / "rep" / "report.csv").open(encoding="utf-8"))
    assert row["name"] == "from-run" and row["sst2/best_accuracy.n"] == "3"
    assert float(row["sst2/best_accuracy.half_width"]) >= 0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"search": {"optim.lr": {"choices": [0.001]}}}, "search: a study with source: fine-tunes that one model"),
        ({"variants": {"a": {"optim.lr": 0.001}}}, "variants: a study with source:"),
        ({"teacher": {"source": "/tmp"}}, "teacher: a study with source:"),
        ({"tasks": []}, "tasks: a study with source: fine-tunes it on its tasks; give tasks"),
        ({"optimize": {"metric": "val/loss"}}, "optimize: metric: 'val/loss': a study with source: trains only"),
    ],
)
def test_what_a_study_that_only_fine_tunes_cannot_have_is_refused(tmp_path, capsys, extra, needle):
    path = _write(tmp_path, "runs:/abc", **extra)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: ") and needle in err[0], err
    assert not (tmp_path / "runs").exists()


def test_a_source_that_is_not_there_is_refused_and_nothing_is_made(tmp_path, capsys):
    path = _write(tmp_path, "runs:/0123abcd")
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: source: runs:/0123abcd: no such run: no MLflow store at {tmp_path}/runs/mlflow.db yet"]
    assert not (tmp_path / "runs").exists()
    path = _write(tmp_path, str(tmp_path / "nope"))
    assert main(["sweep", str(path), "--check"]) == 2
    assert f"error: {path}: source: {tmp_path / 'nope'}: no such checkpoint folder" in capsys.readouterr().err
