"""Fine-tuning methods end to end on real SST-2 with real MLflow: the kept classifier, task
distillation (TinyBERT's stages, DistilBERT's), augmentation and FastBERT's early exit."""

from __future__ import annotations

import csv
import io

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine.runner import train
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import trained_run

SST2 = SHARED_DATA / "sst2"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, wiki_validation):
    """A tiny pre-trained model and a classifier fine-tuned from it (the teacher)."""
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tmp = tmp_path_factory.mktemp("taskdistill")
    base, pretrained = trained_run(tmp, wiki_validation)
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp / "train.tsv").write_text("\n".join(lines[:401]) + "\n", encoding="utf-8")  # header + 400 rows
    dev = (SST2 / "validation.tsv").read_text(encoding="utf-8").splitlines()
    (tmp / "dev.tsv").write_text("\n".join(dev[:201]) + "\n", encoding="utf-8")  # header + 200 rows
    teacher = train(build_config(_tree(tmp, base, f"runs:/{pretrained.run_id}")))
    return tmp, base, pretrained, teacher


def _tree(tmp, base: dict, source: str, distill: dict | None = None, **task) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["finetune"] = {
        "source": source,
        "task": "sst2",
        "train": str(tmp / "train.tsv"),
        "validation": str(tmp / "dev.tsv"),
        "max_length": 48,
        "batch_size": 32,
        "lr": 1e-3,
        "max_steps": 12,
        "val_every": 4,
        "patience": 5,
        **task,
    }
    if distill is not None:
        tree["distill"] = distill
    return tree


def test_a_finetuning_run_keeps_its_classifier(runs):
    tmp, base, pretrained, teacher = runs
    client = MlflowClient(teacher.tracking_uri)
    names = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(teacher.run_id, "model")}
    assert {"model.safetensors", "config.yaml", "tokenizer.json"} <= names
    where = tmp / "teacher-config"
    where.mkdir()
    config = yaml.safe_load(open(client.download_artifacts(teacher.run_id, "model/config.yaml", str(where))).read())
    assert config["regime"] == "finetune" and config["model"]["hidden_dim"] == base["model"]["hidden_dim"]


def test_task_distillation_runs_intermediate_layers_first_then_the_prediction_layer(runs):
    tmp, base, pretrained, teacher = runs
    distill = {
        "teacher": f"runs:/{teacher.run_id}",
        "strategy": "joint",
        "stage_steps": 4,
        "fmt_weight": 1.0,
        "at_weight": 1.0,
        "at_loss": "mse",
        "kd_weight": 1.0,
        "label_weight": 0.0,
        "temperature": 2.0,
    }
    result = train(build_config(_tree(tmp, base, f"runs:/{pretrained.run_id}", distill)))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["ablate.teacher_run"] == teacher.run_id
    assert run.data.params["distill.at_loss"] == "mse" and run.data.params["regime"] == "finetune"
    assert "transfer [0, 4): fmt+at; pd [4, 12): pd" == run.data.tags["ablate.stages"]

    def steps(name: str) -> list[int]:
        return [m.step for m in client.get_metric_history(result.run_id, name)]

    assert steps("train/fmt_loss") and max(steps("train/fmt_loss")) < 4  # intermediate stage only
    assert steps("train/kd_loss") and min(steps("train/kd_loss")) >= 4  # then the prediction layer
    assert "train/label_loss" in run.data.metrics  # computed, weighted 0 (TinyBERT: KD alone)
    assert steps("sst2/accuracy") and min(steps("sst2/accuracy")) >= 4  # no dev score while the head is untrained
    assert 0.0 <= run.data.metrics["sst2/final_accuracy"] <= 1.0


def test_augmentation_enlarges_the_training_set_and_logs_a_sample(runs, tmp_path):
    tmp, base, pretrained, teacher = runs
    tree = _tree(tmp, base, f"runs:/{pretrained.run_id}", augment_copies=2, augment_prob=0.5, max_steps=4)
    result = train(build_config(tree))
    client = MlflowClient(result.tracking_uri)
    m = client.get_run(result.run_id).data.metrics
    assert m["sst2/train_examples"] == 400 * 3
    text = client.download_artifacts(result.run_id, "augment/sample.tsv", str(tmp_path))
    rows = list(csv.reader(io.StringIO(open(text, encoding="utf-8").read()), delimiter="\t"))
    assert rows[0] == ["example", "copy", "text"] and rows[1][1] == "original" and rows[2][1] == "1"


def test_fastbert_exits_trace_a_speed_curve_whose_threshold_0_is_the_full_model(runs):
    tmp, base, pretrained, teacher = runs
    tree = _tree(
        tmp, base, f"runs:/{pretrained.run_id}", exits=True, exit_steps=6, exit_speeds=[0.0, 0.5, 1.0], exit_at=1.0
    )
    result = train(build_config(tree))
    client = MlflowClient(result.tracking_uri)
    m = client.get_run(result.run_id).data.metrics
    L = base["model"]["num_layers"]
    assert m["sst2/speed_0/accuracy"] == pytest.approx(m["sst2/best_accuracy"], abs=1e-9)  # the full model's
    # used at speed 1 (finetune.exit_at): every example leaves at the first exit, as the curve's speed 1
    assert m["sst2/final_accuracy"] == pytest.approx(m["sst2/speed_1/accuracy"], abs=1e-9)
    assert m["sst2/exit_layers"] == 1 and m["sst2/latency_ms"] > 0
    assert m["sst2/speed_0/layers"] == L and m["sst2/speed_1/layers"] == 1
    assert m["sst2/speed_0/flops"] > m["sst2/speed_1/flops"] > 0
    assert m["sst2/speed_0.5/layers"] <= L and m["sst2/speed_0/latency_ms"] > 0
    # the exits' phase goes on from the fine-tuning's steps (one step counter across a run's phases)
    exit_steps = [x.step for x in client.get_metric_history(result.run_id, "train/exit_loss")]
    dev_steps = [x.step for x in client.get_metric_history(result.run_id, "sst2/accuracy")]
    assert exit_steps and min(exit_steps) >= max(dev_steps) and max(exit_steps) <= 12 + 6
    assert {a.path for a in client.list_artifacts(result.run_id, "fastbert")} == {
        "fastbert/curve.csv",
        "fastbert/curve.png",
    }


def test_task_distillation_errors_name_the_field_and_create_no_run(runs, tmp_path, capsys):
    tmp, base, pretrained, teacher = runs
    client = MlflowClient(teacher.tracking_uri)
    exp = client.get_run(teacher.run_id).info.experiment_id
    before = len(client.search_runs([exp]))
    src = f"runs:/{pretrained.run_id}"
    cases = [
        (_tree(tmp, base, src, {"teacher": f"runs:/{teacher.run_id}"}, num_labels=3), "distill.teacher: the teacher"),
        (_tree(tmp, base, src, {"teacher": src}), "distill.teacher: "),
        (_tree(tmp, base, src, {"teacher": f"runs:/{teacher.run_id}", "layer_map": [0, 5]}), "distill.layer_map"),
        (_tree(tmp, base, src, augment_copies=2, augment_model=f"runs:/{teacher.run_id}"), "finetune.augment_model"),
    ]
    for tree, message in cases:
        path = tmp_path / "ft.yaml"
        path.write_text(yaml.safe_dump(tree))
        assert main(["train", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
        assert "Traceback" not in err[0]
    assert len(client.search_runs([exp])) == before
