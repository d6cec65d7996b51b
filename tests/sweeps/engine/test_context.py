"""A run's context and its one channel for metrics: nested stages keep the store and drop what only
the trial trains with; metric names outside the registry are refused before anything is logged."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from ablate.lightning_modules.config.metric_names import check_name
from ablate.lightning_modules.methods.precision import matmul_precision, resolved
from ablate.sweeps.engine.context import ActiveRun, RunContext


def test_a_nested_stage_keeps_the_store_and_only_a_training_stage_keeps_the_callbacks() -> None:
    def timed(what: str, start: float, end: float) -> None: ...

    clock = object()  # any callback: only its identity matters here
    trial = RunContext(
        tracking_uri="sqlite:///x.db",
        experiment="study",
        parent_run_id="parent",
        name="E=64",
        tags={"ablate.role": "trial"},
        params={"variant": "a"},
        callbacks=(object(),),  # type: ignore[arg-type]  # any callback: only its identity matters here
        clocks=(clock,),  # type: ignore[arg-type]
        timed=timed,
        resume=True,
    )
    pre = trial.nested("trial-run", "E=64 | pretrain", {"ablate.stage": "pretrain"}, trains=True)
    task = trial.nested("trial-run", "E=64 | sst2", {"ablate.stage": "finetune:sst2"})
    for stage in (pre, task):
        assert (stage.tracking_uri, stage.experiment, stage.parent_run_id) == ("sqlite:///x.db", "study", "trial-run")
        assert stage.params == {}  # the variant is the trial's param, not each stage's
    assert pre.callbacks == trial.callbacks and pre.resume is True
    assert task.callbacks == () and task.resume is False and task.checkpoint is None
    for stage in (pre, task):  # a benchmark's clocks are in every stage
        assert stage.clocks == (clock,) and stage.timed is timed
    assert trial.parent_run_id == "parent"  # frozen: the trial's own context is unchanged


def test_a_studys_hooks_come_after_a_runs_own() -> None:
    def timed(what: str, start: float, end: float) -> None: ...

    own, clock, pruning = object(), object(), object()  # any callbacks: only their identity matters here
    run = RunContext(name="E=64", callbacks=(pruning,), clocks=(own,))  # type: ignore[arg-type]
    hooked = run.hooked(RunContext(clocks=(clock,), timed=timed))  # type: ignore[arg-type]
    assert (hooked.name, hooked.callbacks, hooked.clocks, hooked.timed) == ("E=64", (pruning,), (own, clock), timed)
    assert run.hooked(RunContext()).timed is None


@pytest.mark.parametrize("name", ["val/mlm_acc", "sst2/best_accuracy", "params.backbone", "latency_ms_b1", "lr-AdamW"])
def test_the_registry_knows_the_names_runs_log(name: str) -> None:
    check_name(name)


@pytest.mark.parametrize("name", ["accuracy", "mlm_acc", "/x", "val/"])
def test_the_registry_refuses_names_no_run_logs(name: str) -> None:
    with pytest.raises(ValueError, match="not in ablate's registry"):
        check_name(name)


def test_an_active_run_logs_registered_metrics_in_one_batch_and_refuses_the_rest(tmp_path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("context")).info.run_id
    run = ActiveRun(client, run_id, uri)
    run.log({"val/mlm_acc": 0.25, "params.backbone": 1000}, step=7)
    with pytest.raises(ValueError, match="'accuracy'"):
        run.log({"val/loss": 1.0, "accuracy": 0.5})
    data = client.get_run(run_id).data
    assert data.metrics == {"val/mlm_acc": 0.25, "params.backbone": 1000.0}  # nothing of the refused batch
    assert [m.step for m in client.get_metric_history(run_id, "val/mlm_acc")] == [7]


def test_the_matmul_precision_is_the_runs_inside_and_the_processes_after() -> None:
    import torch

    before = torch.get_float32_matmul_precision()
    with matmul_precision(resolved("medium", "cpu")):
        assert torch.get_float32_matmul_precision() == "medium"
    assert torch.get_float32_matmul_precision() == before
    assert resolved("auto", "cuda") == "high" and resolved("auto", "cpu") == "highest"
