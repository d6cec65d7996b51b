"""GPU-only checks (marked ``cuda``: skipped without CUDA, and CI has none). On a GPU machine:
``pytest -m cuda`` (or ``pytest tests/test_gpu.py``).

- a run measures latency and activation memory on the GPU it trains on, and says so;
- a trial killed at half its steps and resumed from its checkpoint ends where an uninterrupted
  one does (the CUDA generator is in the checkpoint: dropout on a GPU draws from it);
- bf16 autocast stays within 2% of fp32's loss after 300 steps.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from ablate.benchmarks.cases import bert_small
from ablate.benchmarks.sides import build_sides
from ablate.benchmarks.train_speed import batches, race
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.measure.accounting import MEASURED_ON
from ablate.lightning_modules.measure.measuring import training_device
from ablate.lightning_modules.measure.profiling import measure
from ablate.lightning_modules.model.heads import build_pretraining_model
from ablate.sweeps.engine import checkpoints
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.runner import train
from tests.conftest import requires_cuda
from tests.sweeps.conftest import InterruptAt

pytestmark = requires_cuda
STEPS = 60


def _config(tmp_path: Path, corpus: Path, **trainer: object):
    return build_config(
        {
            "model": {"preset": "bert-tiny", "vocab_size": 2048, "dropout": 0.1},
            "data": {"corpus": str(corpus), "max_length": 64, "batch_size": 32, "num_workers": 1},
            "trainer": {
                "max_steps": STEPS,
                "val_every": STEPS // 2,
                "val_batches": 4,
                "accelerator": "gpu",
                "progress": False,
                "measure": False,
                **trainer,
            },
            "tracking": {"root": str(tmp_path / "runs")},
        }
    )


def test_measuring_runs_on_the_gpu_under_the_runs_autocast_and_leaves_the_streams_alone() -> None:
    cfg = build_config({"model": {"preset": "bert-tiny", "vocab_size": 2048, "dropout": 0.1}})
    model = build_pretraining_model(cfg.model, cfg.objective)  # on the CPU, as a run builds it
    device = training_device("auto")
    assert device == torch.device("cuda", 0)
    torch.manual_seed(0)
    cuda_rng, cpu_rng = torch.cuda.get_rng_state(device), torch.get_rng_state()
    fp32 = measure(model, 2048, seq_len=64, device=device, repeats=3, warmup=1, memory_batch=32)
    bf16 = measure(model, 2048, seq_len=64, device=device, repeats=3, warmup=1, memory_batch=32, precision="bf16-mixed")
    assert torch.equal(torch.cuda.get_rng_state(device), cuda_rng) and torch.equal(torch.get_rng_state(), cpu_rng)
    assert fp32.device == bf16.device == f"cuda:0 ({torch.cuda.get_device_name(0)})"
    assert next(model.parameters()).device.type == "cpu"  # moved back: the Trainer places it
    assert 0 < fp32.latency_ms_b1 and 0 < bf16.latency_ms_b1
    # bf16 activations are half the bytes of fp32 ones (plus autocast's bf16 weight copies)
    assert 0 < bf16.train_activation_mb < 0.8 * fp32.train_activation_mb


@pytest.mark.parametrize(("precision", "compile_mode"), [("32-true", "eager"), ("bf16-mixed", "reduce-overhead")])
def test_a_resumed_gpu_trial_ends_where_an_uninterrupted_one_does(
    tmp_path: Path, wiki_validation: Path, precision: str, compile_mode: str
) -> None:
    compiled = {} if compile_mode == "eager" else {"compile": True, "compile_mode": compile_mode}
    cfg = _config(tmp_path, wiki_validation, precision=precision, **compiled)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # measured (on the GPU, before training): measuring must not shift the run's random streams
    measured = _config(tmp_path, wiki_validation, precision=precision, measure=True, **compiled)
    straight = train(measured, RunContext(tracking_uri=uri, experiment="straight"))
    on = MlflowClient(uri).get_run(straight.run_id).data.params[MEASURED_ON]
    assert on == f"cuda:0 ({torch.cuda.get_device_name(0)})"
    folder = tmp_path / "ckpt"
    plan = checkpoints.CheckpointPlace.at(str(folder), tmp_path, cfg)
    with pytest.raises(KeyboardInterrupt):  # killed after the checkpoint at STEPS // 2
        train(
            cfg,
            RunContext(
                tracking_uri=uri,
                experiment="resumed",
                checkpoint=plan,
                resume=True,
                callbacks=(InterruptAt(STEPS // 2 + 5),),
            ),
        )
    ckpt = torch.load(folder / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == STEPS // 2
    assert len(ckpt["ablate_rng"]["cuda"]) == torch.cuda.device_count()
    resumed = train(cfg, RunContext(tracking_uri=uri, experiment="resumed", checkpoint=plan, resume=True))
    assert resumed.metrics["val/loss"] == pytest.approx(straight.metrics["val/loss"], rel=1e-5, abs=1e-6)


def test_bf16_stays_within_two_percent_of_fp32_after_300_steps() -> None:
    case = replace(bert_small(), batch=32)
    device = torch.device("cuda")
    data = batches(case, "norvig-big", 300, device)
    sides = build_sides(case, ["ablate:fp32", "ablate:bf16", "ablate:bf16:compile:cudagraphs"], device, 300)
    race(sides, data, warmup=3, progress=lambda: None)
    fp32 = statistics.mean(sides[0].losses[-20:])  # benchmarks/precision.py's measure: the last 20 steps
    for side in sides[1:]:
        assert statistics.mean(side.losses[-20:]) == pytest.approx(fp32, rel=0.02), side.name
