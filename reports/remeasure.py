"""``ablate report``'s latency columns (by default; ``--no-remeasure`` keeps the logged figures): every model
of a report rebuilt from its run's logged config as it is deployed (:mod:`ablate.reports.deployed`) and
timed again in one process on this machine, in turns, at one thread and at every thread, each repeat
beside the reference workload (:func:`remeasure_runs`). The figures are the report's, not the runs'
(docs/reports.md, "Remeasured by default, as deployed")."""

from __future__ import annotations

import math
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from mlflow import MlflowClient
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ablate.sweeps.engine import tracking

if TYPE_CHECKING:  # torch is imported when a pass runs
    from ablate.lightning_modules.config.experiment import ExperimentConfig
    from ablate.lightning_modules.measure.deployed import Turns

#: The metrics a remeasure replaces: deployed.latency_names() (one thread, then every thread: ``_all``),
#: each also + SPREAD_SUFFIX and + REFERENCE_SUFFIX.
LATENCY_METRICS = ("latency_ms_b1", "latency_ms_b32", "latency_ms_b1_all", "latency_ms_b32_all")
SPREAD_SUFFIX = "_spread"
REFERENCE_SUFFIX = "_reference"
REMEASURED_METRICS = tuple(m + s for m in LATENCY_METRICS for s in ("", SPREAD_SUFFIX, REFERENCE_SUFFIX))
#: The column (and table detail) naming which runtime and form timed a row: ``ORT int8``, ``PyTorch`` ...
RUNTIME = "latency.runtime"
#: Tag of a chained trial naming its pretraining stage's run (``ablate.sweeps.chain.PRETRAIN_RUN``).
PRETRAIN_RUN = "ablate.pretrain_run"
CSV_NAME = "remeasured.csv"
#: Defaults of a remeasure: rounds over all the models, each timing every model ``REPEATS`` times
#: after ``WARMUP`` untimed runs per thread setting and batch size (18 turns a latency in all).
ROUNDS = 3
REPEATS = 6
WARMUP = 1


@dataclass(frozen=True)
class Remeasured:
    """What ``--remeasure`` measured.

    Attributes:
        frame: One row per remeasured run: ``run_id``, ``run_name``, ``device``, :data:`RUNTIME` (which
            runtime and form timed it), ``why`` (why not ONNX Runtime; empty if it was), the
            :data:`REMEASURED_METRICS` (NaN where not timed: ``_all`` on a GPU), and ``logged/<metric>``
            (what the run logged, NaN if none).
        machine: Which machine measured (:func:`~ablate.lightning_modules.measure.measuring.describe_machine`
            of each device used, joined by ``; ``).
        when: When the pass began, UTC, e.g. ``2025-06-01 14:02 UTC``.
        host: The host name (``platform.node()``), recorded in ``remeasured.csv`` only.
        repeats: Timed repeats per latency per round; warmup: untimed runs before them.
        rounds: Rounds over all the models (a latency is the fastest of ``rounds * repeats``).
        models: Distinct architectures timed.
        seconds: Wall time of the pass.
        missing: One line per run that could not be rebuilt (its latency cells are left empty).
        run_ids: Every run the pass was asked to measure, rebuilt or not.
        load: The host's 1-minute load average at the start and at the end of the pass, the
            larger (None where the OS does not say): above the CPU count, the machine was busy.
        instruction_sets: The CPU's (:func:`~ablate.lightning_modules.measure.deployed.describe_instruction_sets`).
        threads: Every thread the pass timed the ``_all`` latencies at (the default ones at one).
    """

    frame: pd.DataFrame
    machine: str
    when: str
    host: str
    repeats: int
    warmup: int
    rounds: int
    models: int
    seconds: float
    missing: list[str] = field(default_factory=list)
    run_ids: tuple[str, ...] = ()
    load: float | None = None
    instruction_sets: str = ""
    threads: int = 1

    @property
    def note(self) -> str:
        """The line under the table that says where, when and how its latencies were measured."""
        n = len(self.frame)
        load = "" if self.load is None else f" (load average {self.load:.1f} on {os.cpu_count()} CPUs)"
        runtimes = ", ".join(sorted(set(self.frame[RUNTIME]))) if len(self.frame) else "none"
        return (
            f"Latency re-measured by ablate report on {self.when}: {self.machine}{load}; instruction sets "
            f"{self.instruction_sets}; each model as it is deployed ({runtimes}; column {RUNTIME}), "
            f"{self.models} model{'s' * (self.models != 1)} for {n} run{'s' * (n != 1)} in one process, "
            f"{self.rounds} round{'s' * (self.rounds != 1)} of {self.repeats} turns, one forward of each model "
            f"after the other, after {self.warmup} warm-up run{'s' * (self.warmup != 1)}; each latency its "
            f"model's median share of the quietest third of the {self.rounds * self.repeats} turns times the "
            f"quietest turn (a model timed alone: the fastest of its {self.rounds * self.repeats} repeats); "
            "latency_ms_b1 and latency_ms_b32 at one "
            f"thread, latency_ms_b1_all and latency_ms_b32_all at {self.threads} (every one)."
        )

    @property
    def notes(self) -> tuple[str, ...]:
        """:attr:`note`, then one line per reason a model was timed in PyTorch rather than ONNX Runtime."""
        if not len(self.frame):
            return (self.note,)
        whys = self.frame[self.frame["why"] != ""].groupby("why", sort=True)["run_name"].agg(list)
        lines = [f"PyTorch, not ONNX Runtime, for {', '.join(map(str, names))}: {why}" for why, names in whys.items()]
        return (self.note, *lines)

    def apply(self, runs: pd.DataFrame) -> pd.DataFrame:
        """``runs`` with the latency columns of every run the pass was asked to measure replaced
        (NaN where its model could not be rebuilt: never a stale figure beside fresh ones); other
        runs untouched."""
        out = runs.copy()
        for name in REMEASURED_METRICS:
            if name not in out.columns:
                out[name] = math.nan
            out[name] = out[name].astype(float)
        by_id = self.frame.set_index("run_id")
        hit = out["run_id"].isin([*self.run_ids, *by_id.index])
        for name in REMEASURED_METRICS:
            out.loc[hit, name] = out.loc[hit, "run_id"].map(by_id[name]).to_numpy(dtype=float)
        out[RUNTIME] = out["run_id"].map(by_id[RUNTIME]).astype(object)
        return out

    def to_csv(self) -> str:
        """``remeasured.csv``: the frame, with the machine, host and time on every row."""
        meta: dict[str, object] = {"machine": self.machine, "host": self.host, "when": self.when}
        meta |= {"rounds": self.rounds, "repeats": self.repeats, "warmup": self.warmup}
        meta |= {"load": self.load if self.load is not None else math.nan}
        meta |= {"instruction_sets": self.instruction_sets, "threads": self.threads}
        csv: str = self.frame.assign(**meta).to_csv(index=False)
        return csv


def _load() -> float | None:
    """The 1-minute load average, None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _deployed_stage(client: MlflowClient, run_id: str) -> str | None:
    """A chained trial's first fine-tuning stage run (its classifier is what the trial deploys), None if none."""
    run = client.get_run(run_id)
    stages = client.search_runs(
        [run.info.experiment_id],
        filter_string=f"tags.`{tracking.PARENT}` = '{run_id}' and tags.`{tracking.STAGE}` LIKE 'finetune:%'",
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    return str(stages[0].info.run_id) if stages else None


def _run_config(client: MlflowClient, run_id: str, workdir: Path) -> ExperimentConfig:
    """The :class:`ExperimentConfig` of the model run ``run_id`` ended with (see the module doc)."""
    from ablate.lightning_modules.config.load import build_config
    from ablate.lightning_modules.config.yamlio import load_yaml

    source = _deployed_stage(client, run_id) or client.get_run(run_id).data.tags.get(PRETRAIN_RUN) or run_id
    for folder, name in (("model", "model/config.yaml"), (None, "config.yaml")):
        listed = {a.path for a in client.list_artifacts(source, folder)}
        if name in listed:
            text = Path(client.download_artifacts(source, name, str(workdir))).read_text(encoding="utf-8")
            return build_config(load_yaml(text))
    raise FileNotFoundError(f"run {source} logged no config.yaml")


@dataclass
class _Model:
    """One deployed artifact to time (the measuring layer's :class:`~ablate.lightning_modules.measure.deployed.Turns`),
    why it is not ONNX Runtime's (None if it is) and the runs that share it."""

    timing: Turns
    why: str | None
    runs: list[dict[str, Any]]


def _configs(
    client: MlflowClient, records: list[dict[str, Any]], tmp: Path, key: Callable[[ExperimentConfig], tuple[str, ...]]
) -> tuple[dict[tuple[str, ...], tuple[ExperimentConfig, list[dict[str, Any]]]], list[str]]:
    """Each distinct deployed artifact's config (by ``key``) with the runs that share it, and a line for
    each run whose config cannot be read or built (left out)."""
    configs: dict[tuple[str, ...], tuple[ExperimentConfig, list[dict[str, Any]]]] = {}
    missing: list[str] = []
    for run in records:
        try:
            cfg = _run_config(client, str(run["run_id"]), tmp)
        except Exception as exc:  # noqa: BLE001 - any unreadable or invalid config: the run is left out
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            missing.append(f"run {run['run_name']} ({run['run_id']}): latency not re-measured: {first}")
            continue
        configs.setdefault(key(cfg), (cfg, []))[1].append(run)
    return configs, missing


def _rows(models: list[_Model], logged_cols: list[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """A row per run of the re-measured figures (its model's) beside the ones it logged, and each device's
    machine line."""
    from ablate.lightning_modules.measure import deployed as timing
    from ablate.lightning_modules.measure.measuring import describe_device, describe_machine

    rows: list[dict[str, Any]] = []
    machines: dict[str, str] = {}
    for m, metrics in zip(models, timing.paired_metrics([m.timing for m in models]), strict=True):
        device = m.timing.target.device
        described = describe_device(device)
        machines.setdefault(described, describe_machine(device))
        for run in m.runs:
            logged = {f"logged/{c}": float(run[c]) for c in logged_cols}
            row = {"run_id": str(run["run_id"]), "run_name": str(run["run_name"]), "device": described}
            row |= {RUNTIME: m.timing.target.label, "why": m.why or ""}
            rows.append(row | {name: metrics.get(name, math.nan) for name in REMEASURED_METRICS} | logged)
    return rows, machines


def _bar(console: Console | None, progress: bool) -> Progress:
    """The re-measuring progress bar (on ``console``, default stderr; off without ``progress``)."""
    return Progress(
        TextColumn("[bold]re-measuring latency[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console or Console(stderr=True),
        transient=True,
        disable=not progress,
    )


def _time_models(
    client: MlflowClient,
    records: list[dict[str, Any]],
    tmp: Path,
    bar: Progress,
    turns: tuple[int, int, int],
    settings: dict[str, int],
) -> tuple[list[_Model], list[str]]:
    """Make each distinct deployed artifact of ``records`` in ``tmp``, then time them all in turns
    (``turns``: repeats, warmup, rounds); the models timed, and a line per run left out."""
    from ablate.lightning_modules.measure import deployed as timing
    from ablate.lightning_modules.measure.reference_load import reference_workload
    from ablate.reports.deployed import deployed, key

    repeats, warmup, rounds = turns
    models: list[_Model] = []
    configs, missing = _configs(client, records, tmp, key)
    task = bar.add_task("", total=len(configs) + rounds * len(configs))
    for i, (cfg, shared) in enumerate(configs.values()):
        bar.update(task, description=f"preparing {', '.join(str(r['run_name']) for r in shared)}")
        made = deployed(cfg, tmp / f"model-{i}")
        models.append(_Model(timing.Turns(made.target), made.why, shared))
        bar.advance(task)
    workloads = {str(m.timing.target.device): reference_workload(m.timing.target.device) for m in models}
    for r in range(rounds):
        bar.update(task, description=f"round {r + 1}/{rounds}: {len(models)} models in turns")
        timing.time_round([m.timing for m in models], repeats, warmup, workloads, settings)
        bar.advance(task, len(models))
    return models, missing


@dataclass(frozen=True)
class _Pass:
    """A remeasuring pass as it began: its turns, the thread settings it times at (metric suffix -> threads),
    when (UTC, as :attr:`Remeasured.when` says it), the host's 1-minute load average then (None where the OS
    has none) and ``time.perf_counter`` then."""

    repeats: int
    warmup: int
    rounds: int
    settings: dict[str, int]
    when: str
    load: float | None
    clock: float

    @property
    def turns(self) -> tuple[int, int, int]:
        """Repeats, warmup, rounds (as :func:`_time_models` takes them)."""
        return self.repeats, self.warmup, self.rounds


def _begin(repeats: int, warmup: int, rounds: int) -> _Pass:
    """A pass of ``repeats`` timed and ``warmup`` untimed forwards in ``rounds`` rounds, beginning now."""
    from ablate.lightning_modules.measure import deployed as timing

    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load, clock = _load(), time.perf_counter()
    return _Pass(repeats, warmup, rounds, timing.thread_settings(), when, load, clock)


def _remeasured(
    began: _Pass, records: list[dict[str, Any]], models: list[_Model], missing: list[str], logged_cols: list[str]
) -> Remeasured:
    """What the pass that ``began`` measured: a row per run of ``models`` beside the ``logged_cols`` it
    logged, the ``missing`` runs, every run of ``records`` asked for, the larger load average of its start and end."""
    from ablate.lightning_modules.measure import deployed as timing

    rows, machines = _rows(models, logged_cols)
    loads = [x for x in (began.load, _load()) if x is not None]
    columns = ["run_id", "run_name", "device", RUNTIME, "why", *REMEASURED_METRICS]
    columns += [f"logged/{c}" for c in logged_cols]
    return Remeasured(
        frame=pd.DataFrame(rows, columns=columns),
        machine="; ".join(machines.values()) or "nothing measured",
        when=began.when,
        host=platform.node(),
        repeats=began.repeats,
        warmup=began.warmup,
        rounds=began.rounds,
        models=len(models),
        seconds=time.perf_counter() - began.clock,
        missing=missing,
        run_ids=tuple(str(r["run_id"]) for r in records),
        load=max(loads) if loads else None,
        instruction_sets=timing.describe_instruction_sets(),
        threads=began.settings[timing.ALL_THREADS],
    )


def remeasure_runs(
    runs: pd.DataFrame,
    tracking_uri: str,
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    rounds: int = ROUNDS,
    progress: bool = True,
    console: Console | None = None,
) -> Remeasured:
    """Time the deployed model of every run in ``runs`` again on this machine, in one process.

    Every distinct artifact (seeds share one; :func:`ablate.reports.deployed.key`) is made first
    (:func:`ablate.reports.deployed.deployed`: ONNX graphs exported into a temporary folder), then timed in
    ``rounds`` rounds over all of them, one model after the other, ``repeats`` timed forwards after
    ``warmup`` untimed ones per thread setting and batch size each round
    (:class:`ablate.lightning_modules.measure.deployed.Turns`). A model's latency is its fastest repeat over
    all rounds and its spread is that of all its repeats
    (:func:`~ablate.lightning_modules.measure.profiling.latency_metrics`): a burst of load that slows one
    model's whole round shows as a spread (and a marker), or is outrun by a quieter round, instead of
    standing as a plausible figure.

    Args:
        runs: Rows of :func:`ablate.reports.runs.load_runs` (``run_id``, ``run_name``, metrics).
        tracking_uri: The MLflow store the runs are in (their ``config.yaml`` artifacts).
        repeats: Timed forwards per thread setting and batch size per model per round.
        warmup: Untimed forwards before them.
        rounds: Rounds over all the models.
        progress: Show a rich progress bar (on ``console``, default stderr).
        console: Where the progress bar goes.

    Returns:
        The :class:`Remeasured` figures; a run whose config cannot be read or built is left out
        and named in ``missing``.
    """
    if repeats < 1 or rounds < 1 or warmup < 0:
        raise ValueError(f"repeats and rounds must be at least 1, warmup at least 0: {repeats}, {rounds}, {warmup}")
    client = MlflowClient(tracking_uri=tracking_uri)
    began = _begin(repeats, warmup, rounds)
    records = runs.to_dict("records")
    with tempfile.TemporaryDirectory(prefix="ablate-remeasure-") as tmp, tracking.quiet_downloads():
        with _bar(console, progress) as bar:
            models, missing = _time_models(client, records, Path(tmp), bar, began.turns, began.settings)
    return _remeasured(began, records, models, missing, [m for m in LATENCY_METRICS if m in runs.columns])
