"""Chained trials: pre-train, score intrinsically, fine-tune on each task (once per task seed), as one
trial: a trial run with its stages nested under it, carrying every stage's final metrics,
``downstream/avg``, ``glue/score`` where it fine-tunes GLUE tasks, and the ``technique.<name>``
params (docs/guides/finetuning.md, "Chained studies")."""

from __future__ import annotations

import statistics

from mlflow.entities import Param

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.glue import CONVENTIONS, counted
from ablate.lightning_modules.config.metric_names import DOWNSTREAM_AVG, GLUE_SCORE, GLUE_TASKS
from ablate.lightning_modules.methods.techniques import stages_of
from ablate.sweeps.attempts import stopped_stage
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import ActiveRun, RunContext, RunResult, tracked_run
from ablate.sweeps.engine.runner import train
from ablate.sweeps.engine.tracking import resolve_tracking_uri
from ablate.sweeps.engine.weights import RUNS
from ablate.sweeps.study_models import FinetuneTask

STAGE = tracking.STAGE
PRETRAIN_RUN = "ablate.pretrain_run"


def chained_trial(
    cfg: ExperimentConfig,
    tasks: list[FinetuneTask],
    ctx: RunContext,
    *,
    task_teachers: dict[int, str] | None = None,
    study_model: str | None = None,
    wnli: bool = False,
    source: str | None = None,
) -> RunResult:
    """Pre-train ``cfg`` (with ``ctx``'s callbacks, checkpoints and resume), then fine-tune it on each
    task (task ``i`` distilled from ``task_teachers[i]`` when it distils from the study's model,
    augmented with ``study_model``'s MLM head when it augments), as one trial run placed as ``ctx`` says
    (``ctx.reopen``: a stopped attempt's trial run, whose pre-training stage run goes on too); ``wnli``:
    WNLI counts in ``glue/score``; ``source``: no pre-training, each task fine-tunes this model
    (``runs:/RUN_ID`` or a folder: a study's ``source:``)."""

    def work(trial: ActiveRun) -> dict[str, float]:
        pretrained, pre_run, metrics = _pretrained(cfg, ctx, trial, source)
        best, configs = [], []
        glue: dict[str, tuple[str, ...]] = {}  # GLUE task -> its dev sets' names, as the runs logged them
        for i, task in enumerate(tasks):
            runs: list[dict[str, float]] = []
            for seed in task.seeds or [None]:
                teacher = (task_teachers or {}).get(i)
                ft_cfg = task.config(cfg, pretrained, seed, teacher=teacher, study_model=study_model)
                f = ft_cfg.finetune
                configs.append(ft_cfg)
                suffix = "" if seed is None else f" seed={seed}"
                tags = {STAGE: f"finetune:{f.task}", **({PRETRAIN_RUN: pre_run} if pre_run else {})}
                result = train(ft_cfg, ctx.nested(trial.run_id, f"{ctx.name} | {f.task}{suffix}", tags))
                devs = tuple(f"{name}/" for name in (f.task, *(d.name for d in f.extra_validation)))
                runs.append({k: v for k, v in result.metrics.items() if k.startswith(devs)})
            metrics.update(_mean(runs))
            key = f"{f.task}/best_{f.metric}"
            if len(runs) > 1:
                metrics[f"{key}_std"] = statistics.stdev(r[key] for r in runs)
            best.append(metrics[key])
            if task.glue is not None:
                glue[task.glue] = (f.task, *(d.name for d in f.extra_validation))
        if best:
            metrics[DOWNSTREAM_AVG] = sum(best) / len(best)
        for convention in CONVENTIONS:  # the leaderboard's glue/score, BERT's glue/bert_avg
            value = convention.average(metrics, glue, wnli)
            if value is not None:
                metrics[convention.metric] = value
        if GLUE_SCORE in metrics:
            metrics[GLUE_TASKS] = float(len(counted(glue, wnli)))
        techniques = [Param(k, v) for k, v in stages_of(cfg, configs).items()]  # the overview's columns
        trial.client.log_batch(trial.run_id, params=techniques)
        trial.log(metrics)
        return metrics

    uri = resolve_tracking_uri(ctx.tracking_uri or cfg.tracking.tracking_uri, cfg.tracking.root)
    return tracked_run(cfg, uri, work, ctx, tags={STAGE: "trial"}, inputs={}, tokenizer=None)


def _pretrained(
    cfg: ExperimentConfig, ctx: RunContext, trial: ActiveRun, source: str | None
) -> tuple[str, str | None, dict[str, float]]:
    """The trial's pre-trained model (the tasks' ``finetune.source``), its run id (None: a folder) and
    the metrics it hands on to the trial: pre-trained now as the trial's first stage, or ``source`` as
    given (a run's metrics copied)."""
    if source is not None:
        if not source.startswith(RUNS):
            return source, None, {}
        run_id = source.removeprefix(RUNS).strip("/")
        trial.tag(PRETRAIN_RUN, run_id)
        return source, run_id, dict(trial.client.get_run(run_id).data.metrics)
    earlier = stopped_stage(trial.client, trial.run_id) if ctx.reopen else None  # went on in the trial's run
    stage = ctx.nested(trial.run_id, f"{ctx.name} | {cfg.regime}", {STAGE: "pretrain"}, trains=True, reopen=earlier)
    pre = train(cfg, stage)  # | pretrain, | distill, | prune, | quant
    trial.tag(PRETRAIN_RUN, pre.run_id)
    # everything the stage logged (params.*, flops_per_token, latency, probes), not only the trainer's
    return RUNS + pre.run_id, pre.run_id, {**pre.metrics, **trial.client.get_run(pre.run_id).data.metrics}


def _mean(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the runs that logged it."""
    names = {k for r in runs for k in r}
    return {k: statistics.fmean(r[k] for r in runs if k in r) for k in sorted(names)}
