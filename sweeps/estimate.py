"""A GPU study's estimated wall time, said before it starts (``ablate sweep``, ``sweep check``):
``~N min (T trials x S steps x M ms/step + R runs x F s fixed cost + C configurations x K s
compiling)``, M timed here and now (:data:`TIMED_STEPS` after :data:`WARMUP_STEPS`), F from
:data:`FIXED_COST_S`, K :data:`COMPILE_S` (docs/studies.md, "Shipped studies")."""

from __future__ import annotations

import dataclasses
import time
import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.sweeps.base import StudyBase
from ablate.sweeps.spec import StudySpec, corner_trials, study_model_config
from ablate.sweeps.study_models import PLACEHOLDER_SOURCE

if TYPE_CHECKING:  # torch and the engine are imported when a study is estimated: ``ablate sweep``'s errors come first
    import torch

FIXED_COST_S = {
    "cpu": 1.5,  # a tiny study's trials on a 2-core CPU: 1.2 to 1.6 s each, start to end, their 6 steps aside
    "cuda": 5.0,  # one NVIDIA H200: `ablate bench study fastbert_gpu.yaml --smoke`, a repeat run of a shape
}
"""A run's fixed cost, seconds, by device type: what a run takes besides its training steps and its
compilation (measured by ``ablate bench study``, 2026-11-26; docs/performance.md)."""
COMPILE_S = {
    "cpu": 30.0,  # a tiny classifier's step and validation on a 2-core CPU: 25 s more than eager
    "cuda": 15.0,  # one NVIDIA H200: 8 to 18 s for a new shape's first step (bert-small, bf16)
}
"""A compiled configuration's first compilation, seconds, by device type (once per configuration)."""
WARMUP_STEPS = 2
TIMED_STEPS = 10
GPU_ACCELERATORS = ("gpu", "cuda")
AUTOCAST = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}
"""``trainer.precision`` -> the autocast dtype (torch's name) its steps run in."""


@dataclass(frozen=True)
class Workload:
    """What a study trains: its trials, all its runs' optimizer steps and runs, and its largest shape."""

    trials: int
    steps: int
    runs: int
    largest: ExperimentConfig
    configurations: int
    """Runs that compile a shape of their own (the runs over the seeds: a seed's repeat reuses the graphs)."""


def wants_estimate(spec: StudySpec, base: StudyBase, where: str | Path) -> bool:
    """Whether the study is a GPU study: its file is ``*_gpu.yaml`` or it trains on a GPU."""
    trainer = base.section("trainer")
    accelerator = str(trainer.get("accelerator", "auto")).lower()
    return str(where).endswith("_gpu.yaml") or accelerator in GPU_ACCELERATORS


def _steps(cfg: ExperimentConfig) -> int:
    from ablate.sweeps.engine.runner import plan

    return sum(phase.steps for phase in plan(cfg).phases)


def _size(cfg: ExperimentConfig) -> int:
    """A shape's work per step, roughly: parameters x tokens per batch (the model built on the meta device)."""
    import torch

    from ablate.lightning_modules.model.heads import build_pretraining_model

    with torch.device("meta"):
        params = sum(p.numel() for p in build_pretraining_model(cfg.model, cfg.objective).parameters())
    return params * cfg.data.batch_size * cfg.data.max_length


def workload(spec: StudySpec, base: StudyBase) -> Workload:
    """The study's trials, steps and runs (its trials' average times their number, plus the runs it trains once)."""
    trials = corner_trials(spec, base)
    shapes = [cfg for _, cfg in trials]
    steps, runs = 0, 0
    for params, cfg in trials:
        if spec.source is None:  # a study with source: pre-trains nothing
            steps, runs = steps + _steps(cfg), runs + 1
        for task in spec.tasks:
            if task.runs_for(params.get("variant")):
                seeds = len(task.seeds or [None])
                ft = task.config(cfg, PLACEHOLDER_SOURCE, teacher=PLACEHOLDER_SOURCE)
                steps, runs = steps + seeds * _steps(ft), runs + seeds
    total = spec.total_trials()
    steps, runs = round(steps * total / len(trials)), round(runs * total / len(trials))
    model = spec.study_model
    if model is not None and model.model is not None:
        once = study_model_config(base, spec)
        shapes.append(once)
        steps, runs = steps + _steps(once), runs + 1
        seen: set[str] = set()  # tasks with the same data and schedule share one teacher
        for teacher in [t.teacher_task() for t in spec.tasks if t.study_teacher]:
            key = repr(dataclasses.replace(teacher, task="-"))
            if key not in seen:
                seen.add(key)
                steps, runs = steps + _steps(teacher.config(shapes[0], PLACEHOLDER_SOURCE)), runs + 1
    largest = max(shapes, key=_size)
    return Workload(total, steps, runs, largest, round(runs / len(spec.seeds)) if largest.trainer.compile else 0)


def _autocast(cfg: ExperimentConfig, device: torch.device) -> AbstractContextManager[object]:
    import torch

    dtype = AUTOCAST.get(cfg.trainer.precision)
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=getattr(torch, dtype))


def step_seconds(cfg: ExperimentConfig, device: torch.device) -> float:
    """The median of :data:`TIMED_STEPS` pre-training steps of ``cfg``'s model on ``device`` (after
    :data:`WARMUP_STEPS`), on random tokens at its batch size and sequence length, in its precision and
    compiled as ``trainer.compile`` says."""
    import torch

    from ablate.lightning_modules.measure.measuring import FIRST_ID
    from ablate.lightning_modules.methods.pretrain import PretrainModule
    from ablate.lightning_modules.model.heads import build_pretraining_model

    torch.manual_seed(0)
    b, t, vocab = cfg.data.batch_size, cfg.data.max_length, cfg.model.vocab_size
    ids = torch.randint(FIRST_ID, vocab, (b, t), device=device)
    labels = torch.where(torch.rand(b, t, device=device) < 0.15, ids, torch.full_like(ids, -100))
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "token_type_ids": torch.zeros_like(ids),
        "mlm_labels": labels,
        "sentence_label": torch.zeros(b, dtype=torch.long, device=device),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a Trainer
        module = PretrainModule(cfg, build_pretraining_model(cfg.model, cfg.objective)).to(device).train()
        optimizer, _ = module.optimizer_and_schedule()
        times = []
        for i in range(WARMUP_STEPS + TIMED_STEPS):
            start = time.perf_counter()
            with _autocast(cfg, device):
                loss = module.training_step(batch, 0)
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            float(loss)  # waits for the device
            if i >= WARMUP_STEPS:
                times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def estimate_line(spec: StudySpec, base: StudyBase) -> str:
    """The line, measured on this machine (or saying why it cannot be)."""
    from ablate.lightning_modules.measure.measuring import training_device

    work = workload(spec, base)
    counts = f"{work.trials} trials, {work.steps:,} steps, {work.runs} runs"
    accelerator = work.largest.trainer.accelerator.lower()
    device = training_device(accelerator)
    if accelerator in GPU_ACCELERATORS and device.type != "cuda":
        return (
            f"estimated wall time: cannot estimate on this machine ({counts}): the study trains on a CUDA GPU "
            f"(trainer.accelerator: {accelerator}) and this machine has none to time its step on"
        )
    if device.type not in FIXED_COST_S:
        return f"estimated wall time: cannot estimate on this machine ({counts}): no fixed cost known for {device.type}"
    step_s, fixed_s, compile_s = step_seconds(work.largest, device), FIXED_COST_S[device.type], COMPILE_S[device.type]
    per_trial = work.steps / work.trials
    minutes = (work.steps * step_s + work.runs * fixed_s + work.configurations * compile_s) / 60
    compiled = f" + {work.configurations} configurations x {compile_s:g} s compiling" if work.configurations else ""
    return (
        f"estimated wall time: ~{max(minutes, 0.1):.1f} min ({work.trials} trials x {per_trial:,.0f} steps x "
        f"{step_s * 1e3:.1f} ms/step + {work.runs} runs x {fixed_s:g} s fixed cost{compiled})"
    )


def print_estimate(spec: StudySpec, base: StudyBase, where: str | Path) -> None:
    """Print the estimate of a GPU study (:func:`wants_estimate`); nothing for another study."""
    if wants_estimate(spec, base, where):
        print(estimate_line(spec, base), flush=True)
