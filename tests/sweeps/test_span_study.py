"""A chained study names SQuAD as one of its tasks beside a GLUE task: ``sweep --check`` builds the span
arm on the meta device, each trial fine-tunes both, and the trial carries each task's metrics and
their average."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from ablate.cli import main
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import write_study


def _squad_parts(tmp: Path) -> tuple[str, str]:
    """Two small official-JSON files cut from SQuAD v1.1 dev: a paragraph's worth to train, another to score."""
    path = SHARED_DATA / "squad" / "dev-v1.1.json"
    if not path.exists():
        pytest.skip(f"shared test data not found at {path}")
    tree = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for part, article in (("train", 0), ("dev", 10)):
        paragraphs = tree["data"][article]["paragraphs"][:3]
        file = tmp / f"squad-{part}.json"
        data = [{"title": tree["data"][article]["title"], "paragraphs": paragraphs}]
        file.write_text(json.dumps({"version": tree["version"], "data": data}), encoding="utf-8")
        out.append(str(file))
    return out[0], out[1]


def test_a_chained_study_fine_tunes_squad_beside_a_glue_task(tmp_path, wiki_validation, capsys):
    train, dev = _squad_parts(tmp_path)
    span = {"task": "squad", "kind": "span", "train": train, "validation": dev, "metric": "f1", "max_length": 64}
    span["max_query_length"] = 24
    steps = {"batch_size": 8, "lr": 1e-3, "max_steps": 4, "val_every": 4}
    tasks = [
        {**span, **steps, "doc_stride": 32, "seeds": [0, 1]},
        {"glue": "rte", **steps, "max_length": 64, "train_examples": 64, "validation_examples": 32},
    ]
    path = write_study(
        tmp_path,
        wiki_validation,
        name="squad-chain",
        search={"model.sharing": {"choices": ["all"]}},
        tasks=tasks,
        optimize={"metric": "downstream/avg", "direction": "maximize"},
    )
    assert main(["sweep", "--check", str(path)]) == 0
    assert "fine-tuned on squad, rte" in capsys.readouterr().out
    assert main(["sweep", str(path)]) == 0
    (trial,) = optuna.load_study(
        study_name="squad-chain", storage=f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
    ).trials
    assert trial.state == optuna.trial.TrialState.COMPLETE
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("squad-chain")
    runs = client.search_runs([exp.experiment_id])
    (run,) = [r for r in runs if r.data.tags.get("ablate.role") == "trial"]
    m = run.data.metrics
    for name in ("squad/best_f1", "squad/best_exact", "rte/best_accuracy", "downstream/avg"):
        assert 0.0 <= m[name] <= 1.0, name
    assert "squad/best_f1_std" in m  # two seeds of the span task
    assert m["downstream/avg"] == pytest.approx((m["squad/best_f1"] + m["rte/best_accuracy"]) / 2)
    stages = [r for r in runs if r.data.tags.get("ablate.stage", "").startswith("finetune:squad")]
    assert sorted(r.data.params["seed"] for r in stages) == ["0", "1"]
    assert all(r.info.status == "FINISHED" for r in runs)


def test_a_span_task_whose_question_fills_the_window_is_refused_by_check(tmp_path, wiki_validation, capsys):
    train, dev = _squad_parts(tmp_path)
    task = {"task": "squad", "kind": "span", "train": train, "validation": dev, "metric": "f1", "max_length": 64}
    path = write_study(tmp_path, wiki_validation, name="squad-bad", tasks=[task])
    assert main(["sweep", "--check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "finetune.max_query_length: 64 question tokens leave no room" in err[0], err
    assert not (tmp_path / "runs").exists()
