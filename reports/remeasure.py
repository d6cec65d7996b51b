"""``ablate report --remeasure``: time every model of a report again, in one process on this machine.

Latencies logged by the runs were measured wherever and whenever each run trained, often beside
other work; two of them are only comparable when one quiet process measured both. For every run
the table averages, the model is rebuilt from the run's logged config (``model/config.yaml``, the
model the run ended with, e.g. a pruned one; else ``config.yaml``; a chained trial's pretraining
stage's), with random weights (timing depends on the architecture, not the values), by the measuring
layer (:mod:`ablate.lightning_modules.measure.retime`; this module reads runs and tabulates), and timed as
runs time themselves (:func:`ablate.lightning_modules.measure.profiling.time_forward`: warm-up, then timed
repeats; the latency is the fastest, the spread ``(median - min) / min``), one model after the
other, in a few rounds over all of them (:func:`remeasure_runs`). Runs of the same architecture
(seeds) share one measurement.

Each repeat is followed by one run of the fixed reference workload
(:mod:`ablate.lightning_modules.measure.reference_load`), as when a run times itself. The figures replace
the runs' ``latency_ms_b1``, ``latency_ms_b32`` and their ``_spread`` and ``_reference`` in the
report only: the runs' own metrics stay what they measured when they trained. Where, when and how
the report measured is said under the table and in ``remeasured.csv`` beside it.
"""

from __future__ import annotations

import math
import os
import platform
import tempfile
import time
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
    from ablate.lightning_modules.measure.retime import Retimed

#: The metrics a remeasure replaces: profiling.latency_metric(b) (and + SPREAD_SUFFIX, + REFERENCE_SUFFIX)
#: for b in LATENCY_BATCHES.
LATENCY_METRICS = ("latency_ms_b1", "latency_ms_b32")
SPREAD_SUFFIX = "_spread"
REFERENCE_SUFFIX = "_reference"
REMEASURED_METRICS = tuple(m + s for m in LATENCY_METRICS for s in ("", SPREAD_SUFFIX, REFERENCE_SUFFIX))
#: Tag of a chained trial naming its pretraining stage's run (``ablate.sweeps.chain.PRETRAIN_RUN``).
PRETRAIN_RUN = "ablate.pretrain_run"
CSV_NAME = "remeasured.csv"
#: Defaults of a remeasure: rounds over all the models, each timing every model ``REPEATS`` times
#: after ``WARMUP`` untimed runs per batch size (12 repeats a latency in all).
ROUNDS = 3
REPEATS = 4
WARMUP = 1


@dataclass(frozen=True)
class Remeasured:
    """What ``--remeasure`` measured.

    Attributes:
        frame: One row per remeasured run: ``run_id``, ``run_name``, ``device``, the six
            :data:`REMEASURED_METRICS`, and ``logged/<metric>`` (what the run logged, NaN if none).
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

    @property
    def note(self) -> str:
        """The line under the table that says where and when its latencies were measured."""
        n = len(self.frame)
        load = "" if self.load is None else f" (load average {self.load:.1f} on {os.cpu_count()} CPUs)"
        return (
            f"Latency re-measured by ablate report --remeasure on {self.when}: {self.machine}{load}; "
            f"{self.models} model{'s' * (self.models != 1)} for {n} run{'s' * (n != 1)} in one process, "
            f"{self.rounds} round{'s' * (self.rounds != 1)} over all of them one after the other; each latency the "
            f"fastest of {self.rounds * self.repeats} repeats ({self.repeats} a round after "
            f"{self.warmup} warm-up run{'s' * (self.warmup != 1)})."
        )

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
        return out

    def to_csv(self) -> str:
        """``remeasured.csv``: the frame, with the machine, host and time on every row."""
        meta: dict[str, object] = {"machine": self.machine, "host": self.host, "when": self.when}
        meta |= {"rounds": self.rounds, "repeats": self.repeats, "warmup": self.warmup}
        meta |= {"load": self.load if self.load is not None else math.nan}
        csv: str = self.frame.assign(**meta).to_csv(index=False)
        return csv


def _load() -> float | None:
    """The 1-minute load average, None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _run_config(client: MlflowClient, run_id: str, workdir: Path) -> Any:
    """The :class:`ExperimentConfig` of the model run ``run_id`` ended with (see the module doc)."""
    from ablate.lightning_modules.config.load import build_config
    from ablate.lightning_modules.config.yamlio import load_yaml

    source = client.get_run(run_id).data.tags.get(PRETRAIN_RUN) or run_id
    for folder, name in (("model", "model/config.yaml"), (None, "config.yaml")):
        listed = {a.path for a in client.list_artifacts(source, folder)}
        if name in listed:
            text = Path(client.download_artifacts(source, name, str(workdir))).read_text(encoding="utf-8")
            return build_config(load_yaml(text))
    raise FileNotFoundError(f"run {source} logged no config.yaml")


@dataclass
class _Model:
    """One architecture to time (the measuring layer's :class:`~ablate.lightning_modules.measure.retime.Retimed`)
    and the runs that share it."""

    timing: Retimed
    runs: list[dict[str, Any]]


def remeasure_runs(
    runs: pd.DataFrame,
    tracking_uri: str,
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    rounds: int = ROUNDS,
    progress: bool = True,
    console: Console | None = None,
) -> Remeasured:
    """Time the model of every run in ``runs`` again on this machine, in one process.

    Every distinct architecture (seeds share one) is timed in ``rounds`` rounds over all of them,
    one model after the other, ``repeats`` timed forwards after ``warmup`` untimed ones per batch
    size each round (:func:`ablate.lightning_modules.measure.profiling.time_forward`, as a run times
    itself). A model's latency is its fastest repeat over all rounds and its spread is that of all
    its repeats (:func:`~ablate.lightning_modules.measure.profiling.latency_metrics`): a burst of load
    that slows one model's whole round shows as a spread (and a marker), or is outrun by a
    quieter round, instead of standing as a plausible figure.

    Args:
        runs: Rows of :func:`ablate.reports.runs.load_runs` (``run_id``, ``run_name``, metrics).
        tracking_uri: The MLflow store the runs are in (their ``config.yaml`` artifacts).
        repeats: Timed forwards per batch size per model per round.
        warmup: Untimed forwards before them.
        rounds: Rounds over all the models.
        progress: Show a rich progress bar (on ``console``, default stderr).
        console: Where the progress bar goes.

    Returns:
        The :class:`Remeasured` figures; a run whose config cannot be read or built is left out
        and named in ``missing``.
    """
    from ablate.lightning_modules.measure.retime import Retimed
    from ablate.lightning_modules.methods.quantization.apply import quantized_like

    if repeats < 1 or rounds < 1 or warmup < 0:
        raise ValueError(f"repeats and rounds must be at least 1, warmup at least 0: {repeats}, {rounds}, {warmup}")
    client = MlflowClient(tracking_uri=tracking_uri)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = _load()
    start = time.perf_counter()
    missing: list[str] = []
    models: dict[tuple[str, ...], _Model] = {}
    records = runs.to_dict("records")
    with tempfile.TemporaryDirectory(prefix="ablate-remeasure-") as tmp, tracking.quiet_downloads():
        for run in records:
            try:
                cfg = _run_config(client, str(run["run_id"]), Path(tmp))
            except Exception as exc:  # noqa: BLE001 - any unreadable or invalid config: the run is left out
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                missing.append(f"run {run['run_name']} ({run['run_id']}): latency not re-measured: {first}")
                continue
            timing = Retimed.of(cfg)  # on the device its run measured on
            models.setdefault(timing.key, _Model(timing, [])).runs.append(run)
    bar = Progress(
        TextColumn("[bold]re-measuring latency[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console or Console(stderr=True),
        transient=True,
        disable=not progress,
    )
    with bar:
        task = bar.add_task("", total=rounds * len(models))
        workloads = {str(m.timing.device): m.timing.workload() for m in models.values()}
        for r in range(rounds):
            for m in models.values():
                names = ", ".join(str(run["run_name"]) for run in m.runs)
                bar.update(task, description=f"round {r + 1}/{rounds}: {names}")
                m.timing.time_round(quantized_like, repeats, warmup, workloads[str(m.timing.device)])
                bar.advance(task)
    rows: list[dict[str, Any]] = []
    machines: dict[str, str] = {}
    logged_cols = [m for m in LATENCY_METRICS if m in runs.columns]
    for m in models.values():
        described, machine = m.timing.described()
        machines.setdefault(described, machine)
        metrics = m.timing.metrics()
        for run in m.runs:
            logged = {f"logged/{c}": float(run[c]) for c in logged_cols}
            rows.append({"run_id": str(run["run_id"]), "run_name": str(run["run_name"]), "device": described})
            rows[-1].update({**metrics, **logged})
    loads = [x for x in (load_before, _load()) if x is not None]
    columns = ["run_id", "run_name", "device", *REMEASURED_METRICS, *(f"logged/{c}" for c in logged_cols)]
    return Remeasured(
        frame=pd.DataFrame(rows, columns=columns),
        machine="; ".join(machines.values()) or "nothing measured",
        when=when,
        host=platform.node(),
        repeats=repeats,
        warmup=warmup,
        rounds=rounds,
        models=len(models),
        seconds=time.perf_counter() - start,
        missing=missing,
        run_ids=tuple(str(r["run_id"]) for r in records),
        load=max(loads) if loads else None,
    )
