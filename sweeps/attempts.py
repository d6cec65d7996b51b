"""A trial's earlier attempts: the run a retried trial goes on in (:func:`stopped_attempt`: a KILLED run
of the same config that kept a checkpoint, RUNNING again, tagged ``ablate.resumed_from``), or the run of
an attempt that finished before its worker died (:func:`finished_attempt`); docs/studies.md,
"Stopping and resuming"."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ablate.sweeps.engine import checkpoints, tracking
from ablate.sweeps.engine.checkpoints import CheckpointPlace

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

FINISHED_BEFORE = "ablate.finished_before_retry"
"""On a run whose trial's worker died after it finished, taken by the retry: the dead trial's number."""


def _killed_with(client: MlflowClient, exp_id: str, digest: str) -> list[Run]:
    """The KILLED runs that kept checkpoints of config ``digest``, newest first."""
    return list(
        client.search_runs(
            [exp_id],
            filter_string=f"tags.`{checkpoints.CONFIG}` = '{digest}' and attributes.status = 'KILLED'",
            order_by=["attributes.start_time DESC"],
        )
    )


def _has_checkpoint(plan: CheckpointPlace, client: MlflowClient, run_id: str) -> bool:
    """Whether the run's ``last.ckpt`` is where a retry looks: the plan's folder, or its upload."""
    if not plan.mirror:
        return bool(checkpoints.resume_path(plan, client, run_id))
    return checkpoints.resumable(client, run_id)


def stopped_attempt(client: MlflowClient, exp_id: str, plan: CheckpointPlace | None, *, chained: bool) -> str | None:
    """The run (a trial's, in experiment ``exp_id``) that a retry of the trial checkpointed by ``plan``
    goes on in: the newest KILLED run of the same config that left a checkpoint (for a ``chained`` trial
    the checkpoint is its pre-training stage's, and the run its parent, the trial run); None: a new run."""
    if plan is None:
        return None
    for run in _killed_with(client, exp_id, plan.digest):
        if not _has_checkpoint(plan, client, run.info.run_id):
            continue
        if not chained:
            return str(run.info.run_id)
        parent = run.data.tags.get(tracking.PARENT)
        if parent is not None and client.get_run(parent).info.status == "KILLED":
            return str(parent)
    return None


def stopped_stage(client: MlflowClient, trial_run: str) -> str | None:
    """The KILLED pre-training stage run of a chained trial's run, to go on in (None: none)."""
    exp_id = client.get_run(trial_run).info.experiment_id
    found = client.search_runs(
        [exp_id],
        filter_string=(
            f"tags.`{tracking.PARENT}` = '{trial_run}' and tags.`{tracking.STAGE}` = 'pretrain' "
            "and attributes.status = 'KILLED'"
        ),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return str(found[0].info.run_id) if found else None


def finished_attempt(
    client: MlflowClient, exp_id: str, study: str, numbers: list[int], metric: str
) -> tuple[str, float] | None:
    """The run of an earlier attempt of a retried trial (trial ``numbers``, newest last) that FINISHED
    with ``metric`` logged before its worker died, its Optuna outcome never recorded (a SIGKILL between
    the run's end and the trial's): the run and its value, which the retry takes instead of training
    the configuration again; None when no attempt got that far."""
    for number in reversed(numbers):
        found = client.search_runs(
            [exp_id],
            filter_string=(
                f"tags.`{tracking.STUDY}` = '{study}' and tags.`{tracking.TRIAL}` = '{number}' "
                f"and tags.`{tracking.ROLE}` = 'trial' and attributes.status = 'FINISHED'"
            ),
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if found and metric in found[0].data.metrics:
            return str(found[0].info.run_id), float(found[0].data.metrics[metric])
    return None
