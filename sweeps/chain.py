"""Chained trials: pre-train, score intrinsically, fine-tune on each task, as one trial.

The trial is an MLflow run (nested under the study's parent) whose stages are runs nested
under it, tagged ``ablate.stage`` (``pretrain``, ``finetune:<task>``) and linked by
``ablate.pretrain_run``; the trial run carries every stage's final metrics plus
``downstream/avg`` (the mean over tasks of each task's best ``finetune.metric``), so the
study's objective and reports can use any of them, and the params ``technique.<name>``: the
compression techniques its stages apply, read from their configs (:mod:`~ablate.lightning_modules.techniques`).

A task may list fine-tuning ``seeds`` (e.g. ``[0, 1, 2]``): the pre-trained model is then
fine-tuned once per seed (one stage run each) and the trial carries each ``<task>/...``
metric's mean over them, plus ``<task>/best_<metric>_std`` (sample standard deviation).
"""

from __future__ import annotations

import statistics
from typing import Any

from lightning.pytorch.callbacks import Callback
from mlflow.entities import Metric, Param

from ablate.lightning_modules.config import ExperimentConfig
from ablate.lightning_modules.techniques import stages_of
from ablate.sweeps.checkpoints import Plan
from ablate.sweeps.runner import train
from ablate.sweeps.spec import FinetuneTask
from ablate.sweeps.tracking import RunResult, tracked_run
from ablate.sweeps.weights import RUNS

STAGE = "ablate.stage"
PRETRAIN_RUN = "ablate.pretrain_run"


def chained_trial(
    cfg: ExperimentConfig,
    tasks: list[FinetuneTask],
    *,
    tracking_uri: str,
    experiment: str,
    parent_run_id: str,
    tags: dict[str, str],
    name: str,
    callbacks: list[Callback],
    extra_params: dict[str, str] | None = None,
    checkpoint: Plan | None = None,
    resume: str | bool = False,
    task_teachers: dict[int, str] | None = None,
    study_model: str | None = None,
) -> RunResult:
    """Pre-train ``cfg`` (with the pruning callbacks), then fine-tune it on each task (task ``i``
    distilled from ``task_teachers[i]`` when it distils from the study's model, augmented with
    ``study_model``'s MLM head when it augments), as one trial run."""

    def work(client: Any, trial_run: str) -> dict[str, float]:
        pre = train(
            cfg,
            tracking_uri=tracking_uri,
            experiment=experiment,
            parent_run_id=trial_run,
            tags={STAGE: "pretrain"},
            name=f"{name} | {cfg.regime}",  # | pretrain, | distill, | prune, | quant
            callbacks=callbacks,
            checkpoint=checkpoint,
            resume=resume,
        )
        client.set_tag(trial_run, PRETRAIN_RUN, pre.run_id)
        # everything the stage logged (params.*, flops_per_token, latency, probes), not only the trainer's
        metrics = {**pre.metrics, **client.get_run(pre.run_id).data.metrics}
        best, configs = [], []
        for i, task in enumerate(tasks):
            runs: list[dict[str, float]] = []
            for seed in task.seeds or [None]:
                teacher = (task_teachers or {}).get(i)
                ft_cfg = task.config(cfg, RUNS + pre.run_id, seed, teacher=teacher, study_model=study_model)
                f = ft_cfg.finetune
                configs.append(ft_cfg)
                suffix = "" if seed is None else f" seed={seed}"
                result = train(
                    ft_cfg,
                    tracking_uri=tracking_uri,
                    experiment=experiment,
                    parent_run_id=trial_run,
                    tags={STAGE: f"finetune:{f.task}", PRETRAIN_RUN: pre.run_id},
                    name=f"{name} | {f.task}{suffix}",
                )
                runs.append({k: v for k, v in result.metrics.items() if k.startswith(f"{f.task}/")})
            metrics.update(_mean(runs))
            key = f"{f.task}/best_{f.metric}"
            if len(runs) > 1:
                metrics[f"{key}_std"] = statistics.stdev(r[key] for r in runs)
            best.append(metrics[key])
        if best:
            metrics["downstream/avg"] = sum(best) / len(best)
        techniques = [Param(k, v) for k, v in stages_of(cfg, configs).items()]  # the overview's columns
        client.log_batch(trial_run, metrics=[Metric(k, float(v), 0, 0) for k, v in metrics.items()], params=techniques)
        return metrics

    return tracked_run(
        cfg,
        tracking_uri,
        work,
        experiment=experiment,
        name=name,
        parent_run_id=parent_run_id,
        tags={**tags, STAGE: "trial"},
        inputs={},
        tokenizer=None,
        extra_params=extra_params,
    )


def _mean(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the runs that logged it."""
    names = {k for r in runs for k in r}
    return {k: statistics.fmean(r[k] for r in runs if k in r) for k in sorted(names)}
