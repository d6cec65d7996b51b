"""Fine-tuning end to end: a tiny pre-trained run fine-tuned on (a slice of) real SST-2."""

from __future__ import annotations

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine.runner import train
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import tiny_base, trained_run

SST2 = SHARED_DATA / "sst2"


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, wiki_validation):
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tmp = tmp_path_factory.mktemp("finetune")
    base, result = trained_run(tmp, wiki_validation)
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp / "train.tsv").write_text("\n".join(lines[:1201]) + "\n", encoding="utf-8")  # header + 1200 rows
    return tmp, base, result


def _finetune(tmp, base: dict, source: str, **task) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["finetune"] = {
        "source": source,
        "task": "sst2",
        "train": str(tmp / "train.tsv"),
        "validation": str(SST2 / "validation.tsv"),
        "max_length": 48,
        "batch_size": 32,
        "lr": 1e-3,
        "max_steps": 12,
        "val_every": 6,
        "patience": 3,
        **task,
    }
    return tree


def test_finetune_logs_dev_metrics_and_the_majority_baseline(pretrained):
    tmp, base, source = pretrained
    result = train(build_config(_finetune(tmp, base, f"runs:/{source.run_id}")))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.source_run"] == source.run_id
    m = run.data.metrics
    for name in ("sst2/accuracy", "sst2/f1", "sst2/mcc", "sst2/loss", "sst2/best_accuracy", "sst2/majority_accuracy"):
        assert name in m, name
    assert 0.0 <= m["sst2/accuracy"] <= 1.0 and -1.0 <= m["sst2/mcc"] <= 1.0
    assert m["sst2/best_accuracy"] >= m["sst2/accuracy"]
    assert m["sst2/final_accuracy"] == m["sst2/best_accuracy"]  # the run leaves its best validation's weights
    backbone = client.get_run(source.run_id).data.metrics["params.backbone"]
    H = int(run.data.params["model.hidden_dim"])
    assert m["model_bytes"] == 4 * (backbone + H * H + H + 2 * H + 2)  # the classifier's: backbone, pooler, 2 labels
    assert m["sst2/majority_accuracy"] == pytest.approx(428 / 872, abs=0.03)  # SST-2 dev: 444 pos / 428 neg
    steps = [h.step for h in client.get_metric_history(result.run_id, "sst2/accuracy")]
    assert len(steps) == 2  # validated every 6 of 12 steps
    assert run.data.params["finetune.task"] == "sst2"


def test_finetune_errors_are_one_line_and_create_no_run(pretrained, tmp_path, capsys):
    tmp, base, source = pretrained
    client = MlflowClient(source.tracking_uri)
    exp = client.get_run(source.run_id).info.experiment_id
    before = len(client.search_runs([exp]))
    cases = {
        "runs:/0123456789abcdef0123456789abcdef": ({}, "finetune.source: run 0123456789abcdef0123456789abcdef"),
        "column": ({"text_fields": ["text"]}, "text"),
        "positions": ({"max_length": 4096}, "finetune.max_length: 4096 is more than the "),
    }
    for source_or_case, (task, message) in cases.items():
        src = source_or_case if source_or_case.startswith("runs:/") else f"runs:/{source.run_id}"
        path = tmp_path / "ft.yaml"
        path.write_text(yaml.safe_dump(_finetune(tmp, base, src, **task)))
        assert main(["train", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) >= 1 and err[-1].startswith("error: ") and message in err[-1], err
    assert len(client.search_runs([exp])) == before


def test_intrinsic_scores_are_logged_after_pretraining(tmp_path, wiki_validation):
    base = tiny_base(tmp_path, wiki_validation)
    base["trainer"].update(measure=False, intrinsic=True)
    base["objective"]["sentence"] = "none"  # scored on NSP and SOP all the same
    result = train(build_config(base))
    metrics = MlflowClient(result.tracking_uri).get_run(result.run_id).data.metrics
    for name in ("intrinsic/mlm_acc", "intrinsic/nsp_acc", "intrinsic/sop_acc"):
        assert 0.0 <= metrics[name] <= 1.0 and result.metrics[name] == metrics[name]


def test_a_compiled_fine_tuning_run_ends_where_an_eager_one_does(pretrained):
    """``trainer.compile``: the classifier's step compiled (one graph per bucketed width), validation
    eager; the same dev metrics and training loss as the eager run's."""
    tmp, base, source = pretrained
    ends = []
    for compiled in (False, True):
        tree = _finetune(tmp, base, f"runs:/{source.run_id}", max_steps=6, val_every=6)
        tree["trainer"] = {**tree["trainer"], "compile": compiled}
        result = train(build_config(tree))
        ends.append(result.metrics)
    eager, compiled_ = ends
    for name in ("sst2/accuracy", "sst2/loss", "train/loss"):
        assert compiled_[name] == pytest.approx(eager[name], rel=1e-3, abs=1e-4), name


def test_a_task_teacher_with_fewer_positions_is_refused_before_the_run():
    """Task distillation feeds the teacher the student's batches: finetune.max_length must fit its positions
    too (else a tensor-size error mid-run), one line naming distill.teacher."""
    from ablate.lightning_modules.config.errors import ConfigError
    from ablate.lightning_modules.config.model import ModelConfig
    from ablate.sweeps.engine.finetune import check_positions

    short = ModelConfig(max_position=64)
    check_positions(64, short, "distill.teacher", "runs:/t")
    with pytest.raises(
        ConfigError, match=r"^finetune.max_length: 128 is more than the 64 positions of distill.teacher"
    ):
        check_positions(128, short, "distill.teacher", "runs:/t")
