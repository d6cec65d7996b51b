"""One training run: data, model, its phases and finishers, one MLflow run (``ablate train``, sweeps, a study's
trials). A regime is a row of :data:`REGIMES`: its preparation (everything checked and loaded before the run
exists) and its plan; :func:`plan` (the regime's phases and finishers, then the weights) is what
``ablate train print-plan`` prints and what :func:`train` builds once and executes (docs/development.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl

from ablate.lightning_modules.config.experiment import ExperimentConfig, Regime
from ablate.lightning_modules.measure.measuring import training_device
from ablate.lightning_modules.methods.precision import matmul_precision, resolved
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import ActiveRun, Prepare, RunContext, RunResult, tracked_run
from ablate.sweeps.engine.finetune import finetune_plan, prepare_finetune
from ablate.sweeps.engine.phases import RunPlan, execute, weights_finisher
from ablate.sweeps.engine.pretrain import prepare_distill, prepare_pretrain, pretrain_plan
from ablate.sweeps.engine.prune import prepare_prune, prune_plan
from ablate.sweeps.engine.quant import prepare_quant, quant_plan

MATMUL_PRECISION = "measure.matmul_precision"  # param: the fp32 matmul precision the run trained and was timed at

SHORT = {
    "model.embed_dim": "E",
    "model.hidden_dim": "H",
    "model.num_layers": "L",
    "model.num_heads": "A",
    "model.num_ffn": "F",
    "model.ffn_dim": "ffn",
}
"""Short names for run names: ``E=64 sharing=all F=1 seed=0``."""


def run_name(changes: Mapping[str, object]) -> str:
    """A run name saying what the run changes, e.g. ``E=64 sharing=all seed=1``."""
    return " ".join(f"{SHORT.get(k, k.rsplit('.', 1)[-1])}={v}" for k, v in changes.items()) or "run"


@dataclass(frozen=True)
class RegimeRow:
    """What runs a regime: its preparation (which checks and loads everything before the run exists)
    and its plan (the phases and finishers its config makes)."""

    prepare: Prepare
    plan: Callable[[ExperimentConfig], RunPlan[Any, Any]]


REGIMES: Mapping[Regime, RegimeRow] = {
    "pretrain": RegimeRow(prepare_pretrain, pretrain_plan),
    "distill": RegimeRow(prepare_distill, pretrain_plan),
    "prune": RegimeRow(prepare_prune, prune_plan),
    "quant": RegimeRow(prepare_quant, quant_plan),
    "finetune": RegimeRow(prepare_finetune, finetune_plan),
}
"""Every regime's preparation and plan."""


def plan(cfg: ExperimentConfig) -> RunPlan[Any, Any]:
    """The phases and finishers ``cfg`` makes, then the weights (every run's last finisher), read from the
    config alone: what ``ablate train --print-plan`` prints and :func:`train` executes."""
    assert cfg.regime is not None  # resolved by the config's validation
    return REGIMES[cfg.regime].plan(cfg).then(weights_finisher())


def train(cfg: ExperimentConfig, ctx: RunContext = RunContext()) -> RunResult:  # noqa: B008 - frozen
    """Train ``cfg`` as one MLflow run placed as ``ctx`` says, as its ``regime`` says (the
    :data:`REGIMES` table: pre-training, distillation, pruning, quantization or fine-tuning);
    return its final metrics.

    With ``ctx.checkpoint``, every phase keeps its checkpoints where it says; ``ctx.resume`` is a
    ``last.ckpt`` to start from, or True: what an earlier attempt at the same config left (a study
    trial's retry), from which the run goes on in the phase it was in. The run's fp32 matmul
    precision (``trainer.matmul_precision``) holds from its preparation (latency is measured
    there) to its end, and the process's own is restored after.

    Corpus, store, teacher and source problems raise before the MLflow run is created. The run is
    RUNNING until its last phase, evaluation and artifact are done; any failure marks it FAILED, a
    signal (SIGINT, SIGTERM) KILLED, re-raised as :class:`~ablate.sweeps.engine.interrupt.Interrupted`.
    """
    assert cfg.regime is not None  # resolved by the config's validation
    uri = tracking.resolve_tracking_uri(ctx.tracking_uri or cfg.tracking.tracking_uri, cfg.tracking.root)
    precision = resolved(cfg.trainer.matmul_precision, training_device(cfg.trainer.accelerator).type)
    with ctx.timing("run"), ExitStack() as stack, matmul_precision(precision):
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        ready = REGIMES[cfg.regime].prepare(cfg, ctx, uri, stack)
        steps = plan(ready.cfg)  # built once: what --print-plan shows is what runs

        def work(run: ActiveRun) -> dict[str, float]:
            if ready.begin is not None:
                ready.begin(run, ctx.reopen is not None)
            return execute(steps, ready, run, ctx)

        return tracked_run(
            ready.cfg,
            uri,
            work,
            ctx,
            tags=ready.tags,
            inputs=ready.inputs,
            tokenizer=ready.tokenizer,
            params={**ready.params, MATMUL_PRECISION: precision},
        )
