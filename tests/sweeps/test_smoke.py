"""``ablate sweep STUDY --smoke`` on every shipped study: every arm, task, teacher and phase runs for a
few steps on a little real data (the workplace copy, through ABLATE_DATA_CATALOG), and every run ends
FINISHED; a study for a GPU is built on the meta device where there is none. And ``--check`` refuses a
study with an arm that cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.sweeps.spec import load_study
from tests.conftest import ROOT
from tests.sweeps.conftest import tiny_base, write_study

STUDIES = sorted((ROOT / "sweeps" / "studies").glob("*.yaml"))


@pytest.fixture()
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory of its own (the smoke's store goes under ./ablate-runs/smoke/) and a cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def _gpu_study(study: Path) -> bool:
    return "accelerator: gpu" in study.read_text(encoding="utf-8")


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.stem)
def test_every_shipped_study_runs_in_smoke_mode(study: Path, elsewhere: Path, capsys) -> None:
    spec, _ = load_study(study)
    assert main(["sweep", str(study), "--smoke"]) == 0, capsys.readouterr().out[-3000:]
    out = capsys.readouterr().out
    if _gpu_study(study) and not torch.cuda.is_available():
        assert f"smoke of study {spec.name}: not run on this machine (" in out
        assert "were built on the meta device and what their methods need checked" in out
        assert not (elsewhere / "ablate-runs").exists()  # nothing run, nothing written
        return
    assert f"smoke of study {spec.name}: " in out and "every run finished" in out
    client = MlflowClient(f"sqlite:///{elsewhere / 'ablate-runs' / 'smoke' / spec.name / 'mlflow.db'}")
    exp = client.get_experiment_by_name(spec.name)
    runs = client.search_runs([exp.experiment_id])
    assert runs and {r.info.status for r in runs} == {"FINISHED"}
    trials = [r for r in runs if r.data.tags.get("ablate.role") == "trial"]
    assert len(trials) == spec.total_trials() // len(spec.seeds)  # every arm, the first seed
    assert {r.data.params.get("variant") for r in trials} == (set(spec.variants) or {None})
    for trial in trials:  # each trial's tasks, each as a stage run of its own
        variant = trial.data.params.get("variant")
        tasks = [t for t in spec.tasks if t.runs_for(variant)]
        stages = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == trial.info.run_id]
        finetuned = [r for r in stages if r.data.tags.get("ablate.stage", "").startswith("finetune:")]
        assert len(finetuned) == len(tasks)  # each task once, at its first seed
    model = spec.study_model
    if model is not None and model.model is not None:  # trained once, for the whole study
        assert [r.data.tags["ablate.role"] for r in runs].count(model.SECTION) == 1
    steps = [int(r.data.params["trainer.max_steps"]) for r in trials if "trainer.max_steps" in r.data.params]
    assert max(steps, default=0) <= 16  # a handful of steps, not the study's own
    probed = [r for r in runs if r.data.params.get("trainer.intrinsic") == "True"]
    assert bool(probed) == ("intrinsic: true" in study.read_text(encoding="utf-8"))
    assert {r.data.params["trainer.probe_batches"] for r in probed} <= {"4"}  # the probes on a little data too


def test_a_run_that_fails_makes_the_smoke_fail_and_says_which(wiki_validation, elsewhere: Path, capsys) -> None:
    """A learning rate of 1e9 overflows: that arm's run ends FAILED; the other arm still runs; the smoke
    lists the failed run with its reason and exits 1."""
    path = write_study(
        elsewhere,
        wiki_validation,
        name="blows-up",
        search={"optim.lr": {"choices": [1.0e-3, 1.0e9]}},
        trainer={"max_steps": 200, "val_every": 100, "measure": False},
    )
    raw = yaml.safe_load(path.read_text())
    del raw["base"]["tracking"]  # the default root, under the working directory
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", str(path), "--smoke"]) == 1
    out = capsys.readouterr().out
    assert "FAILED lr=1000000000.0 seed=0: FloatingPointError" in out
    assert "smoke of study blows-up: 2 runs; 1 of 2 runs did not finish" in out
    assert not (elsewhere / "ablate-runs" / "mlflow.db").exists()  # the study's own store is untouched


def test_smoke_runs_in_a_store_of_its_own(study_file: Path, capsys) -> None:
    assert main(["sweep", str(study_file), "--smoke", "--storage", "sqlite:///x.db"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --storage: only for `ablate sweep` (not ablate sweep smoke)")


def test_check_refuses_a_study_whose_arm_cannot_run(tmp_path: Path, wiki_validation: Path, capsys) -> None:
    """schuBERT's gates need a layer of their own per layer: a reference whose layers are shared cannot be
    pruned. ``--check`` builds every arm on the meta device and says so, before anything runs."""
    base = tiny_base(tmp_path, wiki_validation)
    study = {
        "name": "cannot-prune",
        "base": base,
        "reference": {"model": {**base["model"], "sharing": "all"}},
        "variants": {"as-is": {"regime": "quant"}, "pruned": {"regime": "prune", "prune.method": "schubert-f"}},
        "optimize": {"metric": "val/loss"},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    assert main(["sweep", str(path), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: trial variant=pruned seed=0: prune.source: model.sharing:"), err
    assert not (tmp_path / "runs").exists()
