"""A chained study's task teachers: the study's model fine-tuned once per task that distils from it,
shared by every trial and reused when the study runs again; augmentation from the study model's MLM."""

from __future__ import annotations

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import write_study
from tests.sweeps.test_study_teacher import FAST, TEACHER_MODEL

SST2 = SHARED_DATA / "sst2"


def _task(tmp_path, name: str, **extra) -> dict:
    return {
        "task": name,
        "train": str(tmp_path / "train.tsv"),
        "validation": str(tmp_path / "dev.tsv"),
        "max_length": 32,
        "batch_size": 16,
        "max_steps": 4,
        "val_every": 2,
        "patience": 2,
        **extra,
    }


def test_a_task_teacher_is_the_study_model_fine_tuned_once(tmp_path, wiki_validation, capsys):
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    for name, rows in (("train", 65), ("validation", 33)):
        lines = (SST2 / f"{name}.tsv").read_text(encoding="utf-8").splitlines()[:rows]
        (tmp_path / ("dev.tsv" if name == "validation" else "train.tsv")).write_text("\n".join(lines) + "\n")
    path = write_study(tmp_path, wiki_validation, name="td", trainer=FAST)
    raw = yaml.safe_load(path.read_text())
    raw["search"] = {}  # two trials: the variants
    raw["base"]["data"]["max_length"] = 32
    raw["reference"] = {"model": TEACHER_MODEL, "overrides": {"trainer.max_steps": 6, "trainer.val_every": 3}}
    raw["variants"] = {"scratch": {"regime": "pretrain"}, "distilled": {"regime": "distill"}}
    raw["tasks"] = [
        _task(tmp_path, "td", distill={"kd_weight": 1.0, "label_weight": 0.5, "temperature": 2.0}),
        _task(tmp_path, "da", augment_copies=1, augment_prob=0.5),
        _task(tmp_path, "td-mse", distill={"fmt_weight": 1.0, "at_weight": 1.0, "at_loss": "mse", "kd_weight": 1.0}),
    ]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))

    assert main(["sweep", str(path), "--n-trials", "1"]) == 0
    err = capsys.readouterr().err
    assert "teacher | td: training the study's model on td" in err
    assert main(["sweep", str(path)]) == 0  # the other trial: the same task teacher
    assert "teacher | td: reusing run" in capsys.readouterr().err

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("td").experiment_id
    runs = client.search_runs([exp])
    trained = {r.info.run_name: r for r in runs if r.data.tags["ablate.role"] in ("reference", "teacher")}
    assert set(trained) == {"reference", "teacher | td"}  # one task teacher: td-mse has td's data and schedule
    reference, task_teacher = trained["reference"], trained["teacher | td"]
    assert reference.data.tags["ablate.role"] == "reference" and task_teacher.data.tags["ablate.role"] == "teacher"
    # the study model is named as such on the parent and every trial; a teacher only where a trial distils from it
    (parent,) = [r for r in runs if r.data.tags["ablate.role"] == "study"]
    assert parent.data.tags["ablate.study_model_run"] == reference.info.run_id
    assert "ablate.teacher_run" not in parent.data.tags
    trials = {r.data.params["variant"]: r for r in runs if r.data.tags["ablate.role"] == "trial"}
    assert {t.data.tags["ablate.study_model_run"] for t in trials.values()} == {reference.info.run_id}
    assert trials["distilled"].data.tags["ablate.teacher_run"] == reference.info.run_id
    assert "ablate.teacher_run" not in trials["scratch"].data.tags  # pre-trained from scratch beside it
    assert task_teacher.data.params["regime"] == "finetune" and task_teacher.info.status == "FINISHED"
    assert task_teacher.data.params["finetune.source"] == f"runs:/{reference.info.run_id}"
    assert "distill.teacher" not in task_teacher.data.params  # the teacher itself is fine-tuned plainly
    stages = [r for r in runs if r.data.tags.get("ablate.stage", "").startswith("finetune:")]
    assert len(stages) == 6, sorted(r.info.run_name for r in stages)  # 2 trials x 3 tasks
    for stage in stages:
        assert stage.info.status == "FINISHED"
        if stage.data.tags["ablate.stage"] in ("finetune:td", "finetune:td-mse"):
            assert stage.data.params["distill.teacher"] == f"runs:/{task_teacher.info.run_id}"
            assert stage.data.tags["ablate.teacher_run"] == task_teacher.info.run_id
        else:  # augmented with the reference's MLM head; no teacher
            assert stage.data.params["finetune.augment_model"] == f"runs:/{reference.info.run_id}"
            assert "distill.teacher" not in stage.data.params
            assert stage.data.metrics["da/train_examples"] == 64 * 2


def test_a_task_that_distils_from_the_study_model_needs_one(tmp_path, wiki_validation, capsys):
    path = write_study(tmp_path, wiki_validation, name="none", trainer=FAST)
    raw = yaml.safe_load(path.read_text())
    (tmp_path / "t.tsv").write_text("sentence\tlabel\na\t0\n")
    raw["tasks"] = [
        {
            "task": "t",
            "train": str(tmp_path / "t.tsv"),
            "validation": str(tmp_path / "t.tsv"),
            "distill": {"kd_weight": 1.0},
        }
    ]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", "--check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: tasks[0].distill.teacher: the study trains no model") and "\n" not in err
    assert not (tmp_path / "runs").exists()
