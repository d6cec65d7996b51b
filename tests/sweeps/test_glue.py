"""GLUE end to end on the local copies: STS-B as regression (Pearson, Spearman), MRPC's F1 and accuracy
and their mean as the task's score, MNLI scored on both dev sets, the GLUE score of a chained study,
and bad GLUE input refused in one line before any run exists."""

from __future__ import annotations

import statistics

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine.runner import train
from ablate.sweeps.spec import load_study
from tests.conftest import CATALOG_ENV, SHARED_DATA
from tests.sweeps.conftest import trained_run, write_study

GLUE_DATA = SHARED_DATA / "glue"
SMALL = {"train_examples": 300, "validation_examples": 200, "max_length": 48, "batch_size": 16, "lr": 1e-3}


@pytest.fixture(scope="module")
def glue(tmp_path_factory, wiki_validation, data_catalog):
    """A tiny pre-trained model, and a catalog that adds an MNLI training split and a mismatched dev set
    (written from the local matched one, which is all the copy has) to the session's."""
    if data_catalog is None or not (GLUE_DATA / "mnli" / "validation_matched.tsv").is_file():
        pytest.skip(f"shared GLUE data not found at {GLUE_DATA}")
    tmp = tmp_path_factory.mktemp("glue")
    lines = (GLUE_DATA / "mnli" / "validation_matched.tsv").read_text(encoding="utf-8").splitlines()
    (tmp / "mnli_train.tsv").write_text("\n".join(lines[:301]) + "\n", encoding="utf-8")
    (tmp / "mnli_mm.tsv").write_text("\n".join([lines[0], *lines[301:501]]) + "\n", encoding="utf-8")
    catalog = yaml.safe_load(data_catalog.read_text(encoding="utf-8"))
    catalog["datasets"]["nyu-mll/glue:mnli"].update(
        train=str(tmp / "mnli_train.tsv"), validation_mismatched=str(tmp / "mnli_mm.tsv")
    )
    (tmp / "catalog.yaml").write_text(yaml.safe_dump(catalog), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CATALOG_ENV, str(tmp / "catalog.yaml"))
        base, source = trained_run(tmp, wiki_validation)
        yield tmp, base, source


def _run(base: dict, source, name: str, **task) -> tuple[dict[str, float], MlflowClient, str]:
    from ablate.lightning_modules.config.glue import GLUE

    fields = GLUE[name].finetune_fields()
    fields["extra_validation"] = [dict(d) for d in fields["extra_validation"]]
    fields["label_names"] = list(fields["label_names"] or []) or None
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["finetune"] = {**fields, **SMALL, "source": f"runs:/{source.run_id}", "max_steps": 8, "val_every": 4, **task}
    result = train(build_config(tree))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    return run.data.metrics, client, result.run_id


def test_stsb_is_a_regression_scored_by_pearson_and_spearman(glue):
    _, base, source = glue
    m, client, run_id = _run(base, source, "stsb")
    for name in ("stsb/pearson", "stsb/spearman", "stsb/loss", "stsb/score", "stsb/best_pearson", "stsb/best_score"):
        assert name in m, name
    assert "stsb/accuracy" not in m and "stsb/majority_accuracy" not in m
    assert -1.0 <= m["stsb/pearson"] <= 1.0 and -1.0 <= m["stsb/spearman"] <= 1.0
    assert m["stsb/score"] == pytest.approx((m["stsb/pearson"] + m["stsb/spearman"]) / 2, abs=1e-6)
    assert m["stsb/best_score"] == pytest.approx((m["stsb/best_pearson"] + m["stsb/best_spearman"]) / 2, abs=1e-6)
    assert (
        m["stsb/final_pearson"]
        == m["stsb/best_pearson"]
        == max(h.value for h in client.get_metric_history(run_id, "stsb/pearson"))
    )
    backbone = client.get_run(source.run_id).data.metrics["params.backbone"]
    H = int(client.get_run(run_id).data.params["model.hidden_dim"])
    assert m["model_bytes"] == 4 * (backbone + H * H + H + H + 1)  # one output: a regression head


def test_mrpc_logs_f1_and_accuracy_and_scores_their_mean(glue):
    _, base, source = glue
    m, client, run_id = _run(base, source, "mrpc")
    for name in ("mrpc/f1", "mrpc/accuracy", "mrpc/mcc", "mrpc/score", "mrpc/best_f1", "mrpc/best_accuracy"):
        assert name in m, name
    for step_f1, step_acc, step_score in zip(
        *(client.get_metric_history(run_id, f"mrpc/{k}") for k in ("f1", "accuracy", "score")), strict=True
    ):
        assert step_score.value == pytest.approx((step_f1.value + step_acc.value) / 2, abs=1e-6)
    assert m["mrpc/best_score"] == pytest.approx((m["mrpc/best_f1"] + m["mrpc/best_accuracy"]) / 2, abs=1e-6)
    assert m["mrpc/majority_accuracy"] == pytest.approx(137 / 200, abs=0.05)  # the first 200 dev pairs


def test_mnli_is_scored_on_both_dev_sets(glue):
    _, base, source = glue
    m, client, run_id = _run(base, source, "mnli")
    for name in ("mnli/accuracy", "mnli-mm/accuracy", "mnli/loss", "mnli-mm/loss", "mnli-mm/best_accuracy"):
        assert name in m, name
    matched, mismatched = (client.get_metric_history(run_id, k) for k in ("mnli/accuracy", "mnli-mm/accuracy"))
    assert len(matched) == len(mismatched) == 2  # each validation scores both
    assert m["mnli/score"] == pytest.approx((m["mnli/accuracy"] + m["mnli-mm/accuracy"]) / 2, abs=1e-6)
    tags = client.get_run(run_id).data.tags
    assert "validation_matched" in tags["ablate.data.finetune.validation"]


def _glue_study(tmp, corpus, tasks, small: bool = True, **extra):
    small = {**SMALL, "max_steps": 4, "val_every": 4} if small else {}
    return write_study(
        tmp,
        corpus,
        name="glue",
        search={"model.sharing": {"choices": ["all"]}},
        trainer={"measure": False},
        tasks=[task if isinstance(task, str) else {**small, **task} for task in tasks] if tasks != "glue" else tasks,
        optimize={"metric": "glue/score", "direction": "maximize"},
        **extra,
    )


def test_a_chained_study_reports_the_glue_score(glue, tmp_path, wiki_validation, capsys):
    sst2 = {"task": "mine", "train": "nyu-mll/glue:sst2", "text_fields": ["sentence"]}  # not a GLUE entry: not counted
    tasks = [{"glue": "mrpc"}, {"glue": "stsb", "lr": 3e-3}, sst2]
    path = _glue_study(tmp_path, wiki_validation, tasks)
    assert main(["sweep", str(path)]) == 0, capsys.readouterr().err
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("glue").experiment_id
    (trial,) = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    m = trial.data.metrics
    assert m["glue/tasks"] == 2
    assert m["glue/score"] == pytest.approx(statistics.fmean([m["mrpc/best_score"], m["stsb/best_score"]]))
    assert m["glue/bert_avg"] == pytest.approx(statistics.fmean([m["mrpc/best_f1"], m["stsb/best_spearman"]]))
    assert m["mrpc/best_score"] == pytest.approx((m["mrpc/best_f1"] + m["mrpc/best_accuracy"]) / 2)
    best = [m["mrpc/best_f1"], m["stsb/best_pearson"], m["mine/best_accuracy"]]
    assert m["downstream/avg"] == pytest.approx(statistics.fmean(best))
    stages = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{trial.info.run_id}'")
    assert sorted(s.data.tags["ablate.stage"] for s in stages) == [
        "finetune:mine",
        "finetune:mrpc",
        "finetune:stsb",
        "pretrain",
    ]
    stsb = next(s for s in stages if s.data.tags["ablate.stage"] == "finetune:stsb")
    assert stsb.data.params["finetune.kind"] == "regression" and stsb.data.params["finetune.lr"] == "0.003"


def test_tasks_glue_is_the_benchmark_without_wnli_unless_asked(tmp_path, wiki_validation):
    spec, _ = load_study(_glue_study(tmp_path, wiki_validation, [{"glue": "rte", "max_steps": 50}], small=False))
    (rte,) = spec.tasks
    assert (rte.glue, rte.train, rte.lr, rte.max_steps, rte.val_every) == ("rte", "nyu-mll/glue:rte", 3e-5, 50, 5)
    path = _glue_study(tmp_path, wiki_validation, "glue")
    spec, _ = load_study(path)
    assert [t.glue for t in spec.tasks] == ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte"]
    assert spec.tasks[5].extra_validation[0].split == "validation_mismatched" and not spec.glue_wnli
    study = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**study, "glue_wnli": True}))
    assert [t.glue for t in load_study(path)[0].tasks][-1] == "wnli"


def _tsv(path, rows):
    path.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows))
    return str(path)


@pytest.mark.parametrize(
    ("task", "needle"),
    [
        ({"glue": "mrcp"}, "tasks[0].glue: Input should be 'cola', 'sst2', 'mrpc'"),
        (
            {"glue": "mrpc", "text_fields": ["sentence1", "question"]},
            "tasks[0].text_fields: 'question' is not",
        ),
        ({"glue": "mrpc", "label_field": "gold"}, "tasks[0].label_field: 'gold' is not a column of nyu-mll/glue:mrpc"),
        (
            {"glue": "rte", "train": "LOCAL", "validation": "LABEL3"},
            "tasks[0].num_labels: {dir}/label3.tsv",
        ),
        (
            {"glue": "stsb", "train": "LOCAL", "validation": "WORD"},
            "tasks[0].label_field: {dir}/word.tsv has a label 'hi'",
        ),
        ({"glue": "stsb", "metric": "accuracy"}, "tasks[0].metric: 'accuracy' does not score a regression task"),
        ("superglue", "tasks: 'superglue': give glue (the GLUE benchmark) or a list of tasks"),
        (
            {"task": "mine", "train": "nyu-mll/glue:sst2"},
            "optimize.metric: 'glue/score' is logged by",
        ),
    ],
)
def test_bad_glue_input_is_one_line_before_any_run(glue, tmp_path, wiki_validation, capsys, task, needle):
    files = {
        "LOCAL": _tsv(tmp_path / "ok.tsv", [("a", "b", 1)]),
        "LABEL3": _tsv(tmp_path / "label3.tsv", [("a", "b", 1), ("c", "d", 3)]),
        "WORD": _tsv(tmp_path / "word.tsv", [("a", "b", 1.5), ("c", "d", "hi")]),
    }
    if isinstance(task, dict):
        task = {k: files.get(v, v) if isinstance(v, str) else v for k, v in task.items()}
        path = _glue_study(tmp_path, wiki_validation, [task])
    else:
        path = _glue_study(tmp_path, wiki_validation, [])
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "tasks": task}))
    for args in (["sweep", str(path), "--check"], ["sweep", str(path)]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and needle.format(dir=tmp_path) in err[-1], err
    assert not (tmp_path / "runs").exists()  # no store, no run


def test_a_study_may_optimize_a_further_dev_sets_metric(glue, tmp_path, wiki_validation, capsys):
    path = _glue_study(tmp_path, wiki_validation, [{"glue": "mnli"}])
    study = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**study, "optimize": {"metric": "mnli-mm/best_accuracy", "direction": "maximize"}}))
    assert main(["sweep", str(path), "--check"]) == 0, capsys.readouterr().err
    assert "mnli" in capsys.readouterr().out
