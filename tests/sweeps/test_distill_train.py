"""A tiny teacher -> student distillation end to end: real corpus, real MLflow store, the CLI."""

from __future__ import annotations

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.configio import build_config
from ablate.lightning_modules.errors import ConfigError
from ablate.sweeps.runner import train
from tests.sweeps.conftest import trained_run

TEACHER = {
    "preset": "ibbert-mini",
    "vocab_size": 1000,
    "embed_dim": 16,
    "hidden_dim": 32,
    "intra_dim": 64,
    "num_layers": 2,
    "num_heads": 2,
    "ffn_dim": 128,
    "max_position": 64,
}
STUDENT = {
    "preset": "mobilebert-mini",
    "vocab_size": 1000,
    "embed_dim": 16,
    "hidden_dim": 32,
    "intra_dim": 16,
    "num_layers": 2,
    "num_heads": 2,
    "ffn_dim": 32,
    "max_position": 64,
}


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory, wiki_validation):
    tmp = tmp_path_factory.mktemp("distill")
    base, result = trained_run(tmp, wiki_validation, TEACHER)
    return tmp, base, result


def _student(base: dict, teacher: str, **distill) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["model"] = STUDENT
    tree["trainer"].update(max_steps=8, val_every=4)
    tree["distill"] = {"teacher": teacher, **distill}
    return tree


@pytest.mark.parametrize("strategy", ["auxiliary", "progressive"])
def test_student_distils_from_a_teacher_run(teacher_run, strategy):
    tmp, base, teacher = teacher_run
    cfg = build_config(_student(base, f"runs:/{teacher.run_id}", strategy=strategy, stage_steps=2))
    result = train(cfg)
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["ablate.teacher_run"] == teacher.run_id
    assert run.data.params["distill.teacher"] == f"runs:/{teacher.run_id}"
    assert run.data.params["distill.strategy"] == strategy
    for name in ("train/fmt_loss", "train/at_loss", "train/kd_loss", "train/mlm_loss", "val/mlm_loss"):
        assert name in run.data.metrics, name
    stages = [(m.step, m.value) for m in client.get_metric_history(result.run_id, "distill/stage")]
    if strategy == "progressive":  # layer 0 [0, 2), layer 1 [2, 4), pd [4, 8)
        assert stages == [(0, 0.0), (2, 1.0), (4, 2.0)]
        assert run.data.tags["ablate.stages"] == "layer 0 [0, 2): fmt+at; layer 1 [2, 4): fmt+at; pd [4, 8): pd"
        kd_steps = [m.step for m in client.get_metric_history(result.run_id, "train/kd_loss")]
        assert kd_steps and min(kd_steps) >= 4  # PD's curve starts at its stage, with no stale values before
    else:
        assert stages == [(0, 0.0)]
    # the student's weights are the run's model, not the teacher's
    names = {f.path for f in client.list_artifacts(result.run_id, "model")}
    assert names == {
        "model/model.safetensors",
        "model/config.yaml",
        "model/tokenizer.json",
        "model/tokenizer_config.json",
    }


def test_cli_errors_name_the_teacher(teacher_run, capsys, tmp_path):
    tmp, base, teacher = teacher_run
    cases = {
        "runs:/0123456789abcdef0123456789abcdef": "distill.teacher: run 0123456789abcdef0123456789abcdef: no such run",
        str(tmp_path / "nowhere"): "distill.teacher: " + str(tmp_path / "nowhere") + ": no such checkpoint folder",
    }
    client = MlflowClient(teacher.tracking_uri)
    before = len(client.search_runs([r.info.experiment_id for r in [client.get_run(teacher.run_id)]]))
    for source, message in cases.items():
        path = tmp_path / "student.yaml"
        path.write_text(yaml.safe_dump(_student(base, source)))
        assert main(["train", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and message in err[-1], err
    after = len(client.search_runs([client.get_run(teacher.run_id).info.experiment_id]))
    assert after == before  # nothing half-written: no run was created


def test_a_teacher_with_another_tokenizer_is_refused(teacher_run):
    tmp, base, teacher = teacher_run
    tree = _student(base, f"runs:/{teacher.run_id}")
    tree["data"]["lowercase"] = not build_config(base).data.lowercase  # a different vocabulary
    with pytest.raises(ConfigError, match="different tokenizer"):
        train(build_config(tree))
