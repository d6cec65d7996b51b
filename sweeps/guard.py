"""An accuracy guard on a study's objective (``optimize.guard``): the fastest or smallest configuration
whose task metric stays within a bound of a reference, as the Optuna constraint :data:`GUARD`; the
chosen configuration the best feasible trial, else the closest to the bound (:func:`choose`); the
tags the report reads, :data:`PARENT_TAGS` (docs/guides/quantization.md, "Accuracy-guarded compression")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass as plain_dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT, ConfigError, FieldError

if TYPE_CHECKING:
    import optuna
    from mlflow import MlflowClient

    from ablate.sweeps.study_models import FinetuneTask, StudyModel

GUARD = "guard"
"""The Optuna constraint's key and the namespace of the trial run's metrics (``guard/value`` ...)."""
MET_TAG = "ablate.guard"
"""On a trial run: ``met`` or ``missed``."""
PARENT_TAGS = {
    "metric": "ablate.guard.metric",
    "direction": "ablate.guard.direction",
    "reference": "ablate.guard.reference",
    "reference_from": "ablate.guard.reference_from",
    "bound": "ablate.guard.bound",
    "objective": "ablate.guard.objective",
    "objective_direction": "ablate.guard.objective_direction",
}
"""On a guarded study's parent run: what the guard is, so that a report reads it back from MLflow."""
RUNS = "runs:/"
Direction = Literal["maximize", "minimize"]


@dataclass(frozen=True, config=STRICT)
class GuardSpec:
    """The accuracy bound of a study's objective (``optimize.guard``).

    Attributes:
        metric: the metric that must stay within the bound (a trial's: ``sst2/final_accuracy``, ``val/mlm_acc``).
        direction: ``maximize`` where higher is better (an accuracy: the bound is a drop),
            ``minimize`` where lower is (a loss: the bound is a rise).
        max_drop: the largest drop from the reference allowed, in the metric's units.
        max_relative_drop: or the largest drop as a fraction of the reference (0.01 = 1%).
        reference: the reference's value, given; None: the study model's, read from its run
            (a ``reference``, ``teacher`` or ``prune_source`` trained by the study or given as ``runs:/ID``).
    """

    metric: str = Field(min_length=1)
    direction: Direction = "maximize"
    max_drop: float | None = Field(default=None, ge=0.0)
    max_relative_drop: float | None = Field(default=None, ge=0.0, lt=1.0)
    reference: float | None = None

    @model_validator(mode="after")
    def _one_bound(self) -> GuardSpec:
        if (self.max_drop is None) == (self.max_relative_drop is None):
            which = "both" if self.max_drop is not None else "neither"
            raise FieldError("max_drop", f"give one of max_drop (absolute) and max_relative_drop, not {which}")
        return self

    def bound(self, reference: float) -> float:
        """The worst value a trial's metric may take: the reference less the drop (plus, for ``minimize``)."""
        drop = self.max_drop if self.max_drop is not None else abs(reference) * (self.max_relative_drop or 0.0)
        return reference - drop if self.direction == "maximize" else reference + drop

    def violation(self, value: float, reference: float) -> float:
        """Optuna's constraint value: how far ``value`` is past the bound (0 or below: within it)."""
        bound = self.bound(reference)
        return bound - value if self.direction == "maximize" else value - bound

    def describe(self) -> str:
        """``sst2/accuracy at most 0.01 below the reference``."""
        way = "below" if self.direction == "maximize" else "above"
        drop = f"{self.max_drop:g}" if self.max_drop is not None else f"{100 * (self.max_relative_drop or 0.0):g}%"
        return f"{self.metric} at most {drop} {way} the reference"


def check_reference(guard: GuardSpec | None, study_model: StudyModel | None) -> None:
    """A guard has a reference: a given value, or a study model whose run records its metric
    (FieldError naming ``optimize.guard.reference``)."""
    if guard is None or guard.reference is not None:
        return
    if study_model is None:
        raise FieldError(
            "optimize.guard.reference",
            f"the bound on {guard.metric} needs a reference: give its value (reference: 0.91) or a study model "
            "(reference:, teacher: or prune_source:) whose run logs it",
        )
    source = study_model.source
    if source is not None and not source.startswith(RUNS):
        raise FieldError(
            "optimize.guard.reference",
            f"{study_model.SECTION}.source {source} is a folder, which records no {guard.metric}; give the "
            "reference's value (reference: 0.91) or the source as runs:/RUN_ID",
        )


def reference_task(guard: GuardSpec, tasks: Sequence[FinetuneTask]) -> int | None:
    """The index of the task whose fine-tuned study model (its task teacher) gives the reference
    of a task metric (``sst2/...``: a task ``sst2`` that distils from the study model), else None."""
    namespace = guard.metric.partition("/")[0]
    return next((i for i, t in enumerate(tasks) if t.task == namespace and t.study_teacher), None)


@plain_dataclass(frozen=True)
class Reference:
    """The reference value a guard bounds against, and where it came from (``0.91 (given)``, a run id)."""

    value: float
    source: str


def reference_of(
    guard: GuardSpec,
    client: MlflowClient,
    study_model: str | None,
    tasks: Sequence[FinetuneTask],
    task_teachers: dict[int, str],
) -> Reference:
    """The guard's reference: given, else read from the run of the task teacher of the guard
    metric's task (:func:`reference_task`) or of the study model.

    Raises:
        ConfigError: naming ``optimize.guard``, when that run did not log the metric.
    """
    if guard.reference is not None:
        return Reference(guard.reference, "given")
    task = reference_task(guard, tasks)
    source = task_teachers.get(task) if task is not None else None
    source = source or study_model
    if source is None or not source.startswith(RUNS):  # checked by check_reference before anything ran
        raise ConfigError(f"optimize.guard.reference: no run to read {guard.metric} from ({source})")
    run_id = source.removeprefix(RUNS).strip("/")
    logged = client.get_run(run_id).data.metrics
    if guard.metric not in logged:
        named = ", ".join(sorted(k for k in logged if "/" in k and not k.startswith("train/")))
        raise ConfigError(
            f"optimize.guard.metric: {guard.metric!r} was not logged by the reference's run {run_id} (it logged "
            f"{named}); give the reference's value (optimize.guard.reference) or a metric it logs"
        )
    return Reference(float(logged[guard.metric]), run_id)


@plain_dataclass(frozen=True)
class Verdict:
    """A trial's guard: its metric's value against the bound."""

    value: float
    bound: float
    violation: float

    @property
    def met(self) -> bool:
        return self.violation <= 0.0


@plain_dataclass(frozen=True)
class GuardRun:
    """A guarded study at run time: the guard, its reference and the objective, recording each trial."""

    guard: GuardSpec
    reference: Reference
    objective: str
    objective_direction: Direction

    def parent_tags(self) -> dict[str, str]:
        """The tags of the study's parent run a report reads the guard from (:data:`PARENT_TAGS`)."""
        values = {
            "metric": self.guard.metric,
            "direction": self.guard.direction,
            "reference": repr(self.reference.value),
            "reference_from": self.reference.source,
            "bound": repr(self.guard.bound(self.reference.value)),
            "objective": self.objective,
            "objective_direction": self.objective_direction,
        }
        return {PARENT_TAGS[k]: v for k, v in values.items()}

    def describe(self) -> str:
        """``val/mlm_acc >= 0.4512 (the reference's 0.4612 from run 3f2a..., less 0.01)``."""
        sign = ">=" if self.guard.direction == "maximize" else "<="
        bound, ref = self.guard.bound(self.reference.value), self.reference
        where = "given" if ref.source == "given" else f"from run {ref.source}"
        return f"{self.guard.metric} {sign} {bound:.6g} ({self.guard.describe()}, {ref.value:.6g} {where})"

    def verdict(self, metrics: dict[str, float]) -> Verdict:
        """The guard of a trial that logged ``metrics`` (KeyError naming the key when its metric is absent)."""
        if self.guard.metric not in metrics:
            raise KeyError(
                f"optimize.guard.metric: {self.guard.metric!r} was not logged; logged: {', '.join(sorted(metrics))}"
            )
        value, ref = float(metrics[self.guard.metric]), self.reference.value
        return Verdict(value, self.guard.bound(ref), self.guard.violation(value, ref))

    def record(self, trial: optuna.Trial, client: MlflowClient, run_id: str, metrics: dict[str, float]) -> Verdict:
        """Set the trial's constraint and attrs, and the guard's metrics and tag on its MLflow run."""
        verdict = self.verdict(metrics)
        trial.set_constraint(GUARD, verdict.violation)
        trial.set_user_attr(GUARD, {"value": verdict.value, "bound": verdict.bound, "met": verdict.met})
        logged = {"value": verdict.value, "reference": self.reference.value, "bound": verdict.bound}
        for name, value in {**logged, "violation": verdict.violation}.items():
            client.log_metric(run_id, f"{GUARD}/{name}", value)
        client.set_tag(run_id, MET_TAG, "met" if verdict.met else "missed")
        return verdict


class Objective(Protocol):
    """What a guard reads of a study's ``optimize`` (a Protocol: the spec imports this module)."""

    @property
    def metric(self) -> str: ...
    @property
    def direction(self) -> Direction: ...
    @property
    def guard(self) -> GuardSpec | None: ...


class Guarded(Protocol):
    """What a guard reads of a study: its objective and its fine-tuning tasks."""

    @property
    def optimize(self) -> Objective: ...
    @property
    def tasks(self) -> Sequence[FinetuneTask]: ...


def start_guard(
    spec: Guarded, client: MlflowClient, parent: str, study_model: str | None, task_teachers: dict[int, str]
) -> GuardRun | None:
    """A guarded study's :class:`GuardRun` (its reference read now, after the study model trained), its
    tags set on the study's ``parent`` run; None for a study without ``optimize.guard``."""
    guard = spec.optimize.guard
    if guard is None:
        return None
    reference = reference_of(guard, client, study_model, spec.tasks, task_teachers)
    run = GuardRun(guard, reference, spec.optimize.metric, spec.optimize.direction)
    from ablate.sweeps.engine.tracking import set_tags_once  # MLflow's side, kept out of the spec's imports

    set_tags_once(client, parent, run.parent_tags())
    return run


T = TypeVar("T")


def choose(candidates: Sequence[tuple[T, float, float]], direction: Direction) -> tuple[T, bool] | None:
    """The chosen one of ``candidates`` (each: what it is, its objective value, its constraint
    value): the best objective among the feasible (constraint <= 0); when none is, the one closest to
    the bound (the smallest constraint; ties: the best objective), kept rather than lost. Also whether
    it meets the bound; None without candidates."""
    if not candidates:
        return None
    sign = 1.0 if direction == "minimize" else -1.0
    feasible = [c for c in candidates if c[2] <= 0.0]
    if feasible:
        return min(feasible, key=lambda c: sign * c[1])[0], True
    return min(candidates, key=lambda c: (c[2], sign * c[1]))[0], False


def chosen_trial(study: optuna.Study, direction: Direction) -> tuple[optuna.trial.FrozenTrial, bool] | None:
    """:func:`choose` over a study's complete trials that carry the guard's constraint."""
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if GUARD in t.constraints]
    return choose([(t, float(t.value or 0.0), t.constraints[GUARD]) for t in trials], direction)


def chosen_line(study: optuna.Study, objective: str, direction: Direction) -> str | None:
    """What ``ablate sweep`` says of a guarded study's choice: the best trial within the bound, or the
    closest to it and that none met it; None before any trial completed."""
    found = chosen_trial(study, direction)
    if found is None:
        return None
    trial, met = found
    how = "within the bound" if met else "no configuration met the bound; the closest to it"
    return f"chosen trial {trial.number} ({how}): {objective}={trial.value:.4g} {trial.params}"
