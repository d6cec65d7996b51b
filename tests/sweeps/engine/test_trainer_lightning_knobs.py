"""The Lightning knobs of ``trainer.*`` reach the Trainer (accumulation, nodes, determinism, profiler),
``--print-config`` prints a config that loads back equal, and ``MLFLOW_EXPERIMENT_NAME`` picks the
experiment when ``tracking.experiment`` is not set."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.profilers import SimpleProfiler
from mlflow import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config, load_config
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.runner import train
from ablate.sweeps.engine.trainer import build_trainer
from ablate.sweeps.spec import corner_configs, load_study
from tests.sweeps.conftest import tiny_base, write_study


class Batches(pl.Callback):
    """Counts the training batches read and the LR scheduler's steps."""

    def __init__(self) -> None:
        self.batches = 0
        self.scheduler_steps = -1
        self.matmul_precision = ""

    def on_train_start(self, trainer, pl_module) -> None:
        self.matmul_precision = torch.get_float32_matmul_precision()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def on_train_end(self, trainer, pl_module) -> None:
        self.scheduler_steps = trainer.lr_scheduler_configs[0].scheduler.last_epoch


@pytest.fixture(scope="module")
def knob_run(tmp_path_factory, wiki_validation):
    """One tiny run with 2 batches per step, a deterministic Trainer and the simple profiler, its
    experiment named only by MLFLOW_EXPERIMENT_NAME."""
    tmp = tmp_path_factory.mktemp("knobs")
    knobs = {
        "accumulate_grad_batches": 2,
        "deterministic": True,
        "profiler": "simple",
        "measure": False,
        "matmul_precision": "medium",
    }
    cfg = build_config(tiny_base(tmp, wiki_validation, **{**knobs, "max_steps": 4, "val_every": 2}))
    counter = Batches()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_EXPERIMENT_NAME", "from-the-environment")
        mp.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # Lightning's deterministic=True sets it
        try:
            result = train(cfg, RunContext(callbacks=(counter,)))
            deterministic = torch.are_deterministic_algorithms_enabled()
        finally:
            torch.use_deterministic_algorithms(False)
    return result, counter, deterministic


def test_accumulation_reads_more_batches_for_the_same_optimizer_steps(knob_run):
    result, counter, _ = knob_run
    client = MlflowClient(result.tracking_uri)
    assert counter.batches == 8  # 4 optimizer steps of 2 batches
    assert counter.scheduler_steps == 4  # the LR schedule counts optimizer steps
    # every val_every=2 optimizer steps, logged (as Lightning does without accumulation) at steps 1 and 3
    assert [m.step for m in client.get_metric_history(result.run_id, "val/loss")] == [1, 3]


def test_a_deterministic_run_trains_with_deterministic_algorithms(knob_run):
    result, _, deterministic = knob_run
    assert deterministic and MlflowClient(result.tracking_uri).get_run(result.run_id).info.status == "FINISHED"


def test_the_profiler_report_is_a_run_artifact(knob_run):
    result, _, _ = knob_run
    client = MlflowClient(result.tracking_uri)
    files = [a.path for a in client.list_artifacts(result.run_id, "profiler")]
    assert files == ["profiler/fit-profile.txt"]
    local = client.download_artifacts(result.run_id, "profiler/fit-profile.txt")
    assert "run_training_batch" in Path(local).read_text()


def test_the_matmul_precision_holds_for_the_run_is_logged_and_is_given_back(knob_run):
    result, counter, _ = knob_run
    assert counter.matmul_precision == "medium"  # while training
    assert torch.get_float32_matmul_precision() == "highest"  # torch's default, as before the run
    params = MlflowClient(result.tracking_uri).get_run(result.run_id).data.params
    assert params["trainer.matmul_precision"] == params["measure.matmul_precision"] == "medium"


def test_mlflow_experiment_name_picks_the_experiment(knob_run):
    result, _, _ = knob_run
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert client.get_experiment(run.info.experiment_id).name == "from-the-environment"
    assert run.data.params["tracking.experiment"] == "from-the-environment"  # the resolved name, not None


def test_experiment_name_resolution(monkeypatch):
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    assert tracking.experiment_name(None) == "ablate"
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "env")
    assert (tracking.experiment_name(None), tracking.experiment_name("mine")) == ("env", "mine")


def test_build_trainer_passes_the_knobs_through(tmp_path, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    knobs = {"accumulate_grad_batches": 3, "num_nodes": 2, "profiler": "simple", "val_every": 5, "max_steps": 20}
    cfg = build_config({"trainer": {"accelerator": "cpu", "progress": False, **knobs}})
    trainer = build_trainer(cfg, None, [])
    Path(trainer.profiler.dirpath).rmdir()  # the profiler's reports go there (fit logs and removes it)
    assert isinstance(trainer.profiler, SimpleProfiler)
    assert (trainer.accumulate_grad_batches, trainer.num_nodes) == (3, 2)
    assert trainer.val_check_interval == 15  # Lightning counts batches: val_every steps x 3
    try:
        build_trainer(build_config({"trainer": {"accelerator": "cpu", "deterministic": True}}), None, [])
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_train_print_config_loads_back_equal(tmp_path, capsys):
    args = ["albert-tiny", "trainer.accumulate_grad_batches=2", "trainer.profiler=advanced", "tracking.experiment=x"]
    assert main(["train", *args, "--print-config"]) == 0
    (tmp_path / "printed.yaml").write_text(capsys.readouterr().out, encoding="utf-8")
    expected = build_config({"model": {"preset": "albert-tiny"}}, dict(a.split("=") for a in args[1:]))
    assert load_config(tmp_path / "printed.yaml") == expected


def test_a_bad_knob_is_one_error_line(capsys):
    assert main(["train", "albert-tiny", "trainer.profiler=fancy", "--print-config"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: trainer.profiler:") and "\n" not in err


_NO_TORCH = "import sys; from ablate.cli import main; code = main(sys.argv[1:]); print('torch' in sys.modules, code)"


def test_sweep_print_config_is_the_first_grid_point_without_torch(tmp_path, wiki_validation):
    path = write_study(tmp_path, wiki_validation, trainer={"accumulate_grad_batches": 2})
    done = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, "sweep", str(path), "--print-config"], capture_output=True, text=True
    )
    *printed, last = done.stdout.strip().splitlines()
    assert last == "False 0", done.stdout + done.stderr
    spec, base = load_study(path)
    cfg = build_config(yaml.safe_load("\n".join(printed)))
    assert cfg == corner_configs(spec, base)[0] and cfg.trainer.accumulate_grad_batches == 2
    assert not (tmp_path / "runs").exists()  # nothing written
