"""Chained trials: pretrain -> intrinsic probes -> fine-tune, each stage a run nested in the trial's."""

from __future__ import annotations

import statistics

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.sweeps.spec import load_study
from ablate.sweeps.study import run_study
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import write_study

SST2 = SHARED_DATA / "sst2"


def _study(tmp_path, corpus, choices=("sop", "nsp"), **finetune):
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:601]) + "\n", encoding="utf-8")
    task = {
        "task": "sst2",
        "train": str(tmp_path / "train.tsv"),
        "validation": str(SST2 / "validation.tsv"),
        "max_length": 32,
        "batch_size": 32,
        "lr": 1e-3,
        "max_steps": 4,
        "val_every": 4,
        **finetune,
    }
    return write_study(
        tmp_path,
        corpus,
        name="chain",
        search={"objective.sentence": {"choices": list(choices)}},
        trainer={"measure": False, "intrinsic": True},
        tasks=[task],
        optimize={"metric": "downstream/avg", "direction": "maximize"},
    )


def test_a_chained_trial_nests_its_stages_and_carries_their_metrics(tmp_path, wiki_validation):
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    spec, base = load_study(_study(tmp_path, wiki_validation))
    result = run_study(spec, base)
    client = MlflowClient(result.tracking_uri)
    exp = client.get_experiment_by_name("chain").experiment_id
    trials = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    assert len(trials) == 2
    for trial in trials:
        assert trial.info.status == "FINISHED" and trial.data.tags["mlflow.parentRunId"] == result.parent_run_id
        m = trial.data.metrics
        for name in (
            "val/mlm_acc",
            "intrinsic/nsp_acc",
            "intrinsic/sop_acc",
            "sst2/best_accuracy",
            "downstream/avg",
            "params.backbone",
            "flops_per_token",
        ):
            assert name in m, name
        assert m["downstream/avg"] == m["sst2/best_accuracy"]
        stages = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{trial.info.run_id}'")
        assert sorted(s.data.tags["ablate.stage"] for s in stages) == ["finetune:sst2", "pretrain"]
        pre = next(s for s in stages if s.data.tags["ablate.stage"] == "pretrain")
        ft = next(s for s in stages if s.data.tags["ablate.stage"] != "pretrain")
        assert (
            pre.info.run_name == f"{trial.info.run_name} | {pre.data.params['regime']}"
            and pre.data.params["regime"] == "pretrain"
        )  # the model's stage is named by its regime (| distill, | prune, | quant elsewhere)
        assert trial.data.tags["ablate.pretrain_run"] == pre.info.run_id == ft.data.tags["ablate.pretrain_run"]
        assert ft.data.params["finetune.source"] == f"runs:/{pre.info.run_id}"
        assert {k: m.get(k) for k in pre.data.metrics} == pre.data.metrics  # the trial carries the stage's figures
    values = sorted(t.value for t in result.study.trials)
    assert values == sorted(t.data.metrics["downstream/avg"] for t in trials)


def test_a_missing_task_file_fails_before_anything_runs(tmp_path, wiki_validation, capsys):
    path = _study(tmp_path, wiki_validation, validation=str(tmp_path / "nope.tsv"))
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "tasks[0].validation" in err and "no such file" in err
    assert not (tmp_path / "runs").exists()


def test_fine_tuning_seeds_give_mean_and_std(tmp_path, wiki_validation):
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    spec, base = load_study(_study(tmp_path, wiki_validation, choices=["sop"], seeds=[3, 4], val_every=2))
    result = run_study(spec, base)
    client = MlflowClient(result.tracking_uri)
    exp = client.get_experiment_by_name("chain").experiment_id
    (trial,) = client.search_runs([exp], "tags.`ablate.role` = 'trial'")
    stages = client.search_runs([exp], "tags.`ablate.stage` = 'finetune:sst2'")
    assert sorted(s.info.run_name.rsplit("| ", 1)[1] for s in stages) == ["sst2 seed=3", "sst2 seed=4"]
    assert sorted(s.data.params["seed"] for s in stages) == ["3", "4"]
    best = [s.data.metrics["sst2/best_accuracy"] for s in stages]
    m = trial.data.metrics
    assert m["sst2/best_accuracy"] == pytest.approx(statistics.fmean(best))
    assert m["sst2/best_accuracy_std"] == pytest.approx(statistics.stdev(best))
    assert m["downstream/avg"] == m["sst2/best_accuracy"]


@pytest.mark.parametrize(
    ("seeds", "needle"),
    [
        ([], "tasks[0].seeds: Tuple should have at least 1 item"),
        ([1, 1], "tasks[0].seeds: [1, 1]: repeated seeds"),
        ([-1], "tasks[0].seeds[0]: Input should be greater than or equal to 0"),
        ("0,1", "tasks[0].seeds: Input should be a valid tuple"),
        ([0.5], "tasks[0].seeds[0]: Input should be a valid integer"),
        ([True], "tasks[0].seeds[0]: Input should be a valid integer"),
    ],
)
def test_bad_fine_tuning_seeds_are_refused(tmp_path, wiki_validation, capsys, seeds, needle):
    path = _study(tmp_path, wiki_validation, seeds=seeds)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: ") and needle in err[0], err


@pytest.mark.parametrize(
    ("extra", "task", "needle"),
    [
        ({}, {"source": "runs:/x"}, "tasks[0].source: set by the chain"),
        ({}, {"lr": -1}, "tasks[0].lr: Input should be greater than 0"),
        ({}, {"colour": 1}, "tasks[0].colour"),
        ({"overrides": {"finetune.lr": 1e-3}}, {}, "overrides.finetune.lr: a chained study's fine-tuning is its"),
    ],
)
def test_bad_fine_tuning_tasks_are_refused(tmp_path, wiki_validation, capsys, extra, task, needle):
    path = _study(tmp_path, wiki_validation, **task)
    if extra:
        raw = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**raw, **extra}, sort_keys=False))
    assert main(["sweep", "--check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: ") and needle in err[0], err


def test_check_validates_a_chained_study_and_writes_nothing(tmp_path, wiki_validation, capsys):
    path = _study(tmp_path, wiki_validation, seeds=[0, 1])
    assert main(["sweep", "--check", str(path)]) == 0
    assert (
        capsys.readouterr().out.strip()
        == "study chain: valid; 2 trials, fine-tuned on sst2, maximizing downstream/avg; report: tiny"
    )
    assert not (tmp_path / "runs").exists()


def _variant_study(tmp_path, corpus, tasks):
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:201]) + "\n", encoding="utf-8")
    common = {"task": "sst2", "train": str(tmp_path / "train.tsv"), "validation": str(SST2 / "validation.tsv")}
    common |= {"max_length": 32, "batch_size": 32, "lr": 1e-3, "max_steps": 4, "val_every": 4}
    return write_study(
        tmp_path,
        corpus,
        name="by-variant",
        search={"model.num_layers": {"choices": [2]}},  # one point: the trials are the variants
        variants={"plain": {"model.sharing": "none", "model.embed_dim": 32}, "shared": {}},  # albert-tiny: E=16, shared
        trainer={"measure": False},
        tasks=[{**common, **task} for task in tasks],
        optimize={"metric": "sst2/final_accuracy", "direction": "maximize"},
    )


def test_each_variant_is_fine_tuned_its_own_way_and_logs_its_techniques(tmp_path, wiki_validation):
    """Tasks of one name for different variants (the overview study's FastBERT and TinyBERT arms):
    each trial runs its own, under the same metric names; the trial records the techniques its
    stages' configs apply."""
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tasks = [{"variants": ["plain"]}, {"variants": ["shared"], "lr": 5e-4, "max_steps": 6, "val_every": 3}]
    spec, base = load_study(_variant_study(tmp_path, wiki_validation, tasks))
    result = run_study(spec, base)
    client = MlflowClient(result.tracking_uri)
    exp = client.get_experiment_by_name("by-variant").experiment_id
    trials = {t.data.params["variant"]: t for t in client.search_runs([exp], "tags.`ablate.role` = 'trial'")}
    assert set(trials) == {"plain", "shared"}
    for variant, steps in (("plain", "4"), ("shared", "6")):
        trial = trials[variant]
        stages = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{trial.info.run_id}'")
        (ft,) = [s for s in stages if s.data.tags["ablate.stage"] == "finetune:sst2"]  # its own task, once
        assert ft.data.params["finetune.max_steps"] == steps
        assert "sst2/final_accuracy" in trial.data.metrics
    plain, shared = (trials[v].data.params for v in ("plain", "shared"))
    assert plain["technique.sharing"] == "-" and shared["technique.sharing"] == "pre-training"
    assert shared["technique.factorization"] == "pre-training" and plain["technique.factorization"] == "-"
    for params in (plain, shared):
        assert params["technique.pruning"] == params["technique.distillation"] == "-"
        assert params["technique.quantization"] == "-"


@pytest.mark.parametrize(
    ("tasks", "needle"),
    [
        ([{"variants": ["plain", "nope"]}], "tasks[0].variants: 'nope' is not one of the study's variants"),
        ([{}, {"variants": ["shared"]}], "tasks[1].variants: variant 'shared' is already fine-tuned on task 'sst2'"),
        ([{"variants": []}], "tasks[0].variants: Tuple should have at least 1 item"),
    ],
)
def test_bad_task_variants_are_refused(tmp_path, wiki_validation, capsys, tasks, needle):
    path = _variant_study(tmp_path, wiki_validation, tasks)
    assert main(["sweep", "--check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: ") and needle in err[0], err
