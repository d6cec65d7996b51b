"""A guarded study's Pareto front (``optimize.guard``, :mod:`ablate.sweeps.guard`): every trial's objective
against its guard metric, read back from the runs (the guard from the tags of the study's parent run,
:data:`ablate.sweeps.guard.PARENT_TAGS`), the front and the chosen configuration, as a section of
``report.md``, ``pareto.csv`` and ``pareto.png`` (docs/guides/quantization.md, "Accuracy-guarded compression")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on save
from mlflow import MlflowClient

from ablate.reports.plots import DPI, pareto_front
from ablate.sweeps.guard import GUARD, PARENT_TAGS, Direction, choose

CSV_NAME, PNG_NAME = "pareto.csv", "pareto.png"
VALUE, VIOLATION = f"{GUARD}/value", f"{GUARD}/violation"
COLUMNS = ["trial", "run_id", "run_name", "objective", "guard", "violation", "within_bound", "on_front", "chosen"]
"""``pareto.csv``: one row per guarded trial run, the objective's and the guard metric's values."""


@dataclass(frozen=True)
class Guard:
    """A guarded study's guard, as its parent run's tags say it."""

    metric: str
    direction: Direction
    reference: float
    reference_from: str
    bound: float
    objective: str
    objective_direction: Direction

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Guard | None:
        """The guard the tags of a study's parent run record; None when the study had none."""
        if any(tag not in tags for tag in PARENT_TAGS.values()):
            return None
        raw = {name: tags[tag] for name, tag in PARENT_TAGS.items()}
        directions = {"maximize", "minimize"}
        if raw["direction"] not in directions or raw["objective_direction"] not in directions:
            return None
        return cls(
            metric=raw["metric"],
            direction=raw["direction"],  # type: ignore[arg-type]  # checked above
            reference=float(raw["reference"]),
            reference_from=raw["reference_from"],
            bound=float(raw["bound"]),
            objective=raw["objective"],
            objective_direction=raw["objective_direction"],  # type: ignore[arg-type]  # checked above
        )

    def describe(self) -> str:
        """``val/mlm_acc >= 0.451 (reference 0.461, from run 3f2a...)``."""
        sign = ">=" if self.direction == "maximize" else "<="
        where = "given" if self.reference_from == "given" else f"from run `{self.reference_from}`"
        return f"`{self.metric}` {sign} {self.bound:.6g} (reference {self.reference:.6g}, {where})"


@dataclass(frozen=True)
class Front:
    """Every guarded trial of a study (:data:`COLUMNS`), and whether the chosen one met the bound."""

    guard: Guard
    points: pd.DataFrame
    met: bool

    @property
    def chosen(self) -> pd.Series | None:
        rows = self.points[self.points["chosen"]]
        return rows.iloc[0] if len(rows) else None


def front(runs: pd.DataFrame, guard: Guard) -> Front:
    """The guarded trials among ``runs`` (a report's runs frame: those with ``guard/violation`` and the
    objective), each with whether it is within the bound, on the Pareto front (no other trial is both
    at least as good on the objective and better on the guard metric) and the chosen one."""
    need = [guard.objective, VALUE, VIOLATION]
    have = runs.dropna(subset=need) if all(c in runs for c in need) else runs.iloc[0:0]
    points = pd.DataFrame(
        {
            "trial": have["trial"].to_list() if "trial" in have else [None] * len(have),
            "run_id": have["run_id"].to_list(),
            "run_name": have["run_name"].to_list(),
            "objective": have[guard.objective].astype(float).to_list() if len(have) else [],
            "guard": have[VALUE].astype(float).to_list() if len(have) else [],
            "violation": have[VIOLATION].astype(float).to_list() if len(have) else [],
        }
    )
    points["within_bound"] = points["violation"] <= 0.0
    sign = 1.0 if guard.objective_direction == "minimize" else -1.0
    on = pareto_front([sign * v for v in points["objective"]], points["guard"].to_list(), guard.direction == "maximize")
    points["on_front"] = [i in on for i in range(len(points))]
    found = choose(
        list(zip(range(len(points)), points["objective"], points["violation"], strict=True)), guard.objective_direction
    )
    points["chosen"] = [found is not None and i == found[0] for i in range(len(points))]
    order = points["objective"] * sign
    points = points.assign(_order=order).sort_values(["_order", "run_name"], kind="stable").drop(columns="_order")
    return Front(guard=guard, points=points.reset_index(drop=True)[COLUMNS], met=found is not None and found[1])


def _cell(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) and not math.isnan(value) else str(value)


def to_markdown(result: Front) -> str:
    """The ``report.md`` section: the objective and the bound, the trials' table, and the chosen configuration."""
    g, points = result.guard, result.points
    verb = "minimize" if g.objective_direction == "minimize" else "maximize"
    lines = [
        "## Accuracy guard: the Pareto front",
        "",
        f"Objective: {verb} `{g.objective}` within the bound {g.describe()}.",
        "",
    ]
    if points.empty:
        return "\n".join([*lines, "No guarded trial has completed yet.", ""])
    lines += [f"| run | {g.objective} | {g.metric} | within bound | on front |", "|---|---:|---:|:-:|:-:|"]
    for _, p in points.iterrows():
        name = f"**{p['run_name']}** (chosen)" if p["chosen"] else str(p["run_name"])
        within, on = ("yes" if p["within_bound"] else "no"), ("yes" if p["on_front"] else "")
        lines.append(f"| {name} | {_cell(p['objective'])} | {_cell(p['guard'])} | {within} | {on} |")
    lines.append("")
    chosen = result.chosen
    assert chosen is not None  # points are not empty
    what = (
        f"`{chosen['run_name']}` (trial {chosen['trial']}, run `{chosen['run_id']}`): {g.objective} "
        f"{_cell(chosen['objective'])}, {g.metric} {_cell(chosen['guard'])}"
    )
    if result.met:
        lines.append(f"Chosen configuration: {what}, within the bound.")
    else:
        lines.append(
            f"No configuration met the bound ({g.describe()}). The closest to it is kept as the candidate: {what}, "
            f"{abs(float(chosen['violation'])):.6g} past the bound."
        )
    return "\n".join([*lines, ""])


def draw(result: Front, path: Path) -> bool:
    """``pareto.png``: the objective against the guard metric, trials within the bound filled and the
    others hollow, the front as a step line, the bound (and the reference) drawn, the chosen one starred;
    False (no file) without guarded trials."""
    g, points = result.guard, result.points
    if points.empty:
        return False
    fig = Figure(figsize=(6.4, 4.8), dpi=DPI)
    ax = fig.add_subplot()
    inside, outside = points[points["within_bound"]], points[~points["within_bound"]]
    ax.scatter(inside["objective"], inside["guard"], color="tab:blue", label="within the bound", zorder=3)
    ax.scatter(
        outside["objective"],
        outside["guard"],
        facecolors="none",
        edgecolors="tab:red",
        label="past the bound",
        zorder=3,
    )
    on = points[points["on_front"]].sort_values("objective")
    ax.step(on["objective"], on["guard"], where="post", color="gray", alpha=0.6, label="Pareto front")
    ax.axhline(g.bound, color="tab:red", linestyle="--", linewidth=1, label=f"bound {g.bound:.6g}")
    ax.axhline(g.reference, color="gray", linestyle=":", linewidth=1, label=f"reference {g.reference:.6g}")
    if (chosen := result.chosen) is not None:
        ax.scatter(
            [chosen["objective"]],
            [chosen["guard"]],
            marker="*",
            s=260,
            color="gold",
            edgecolors="black",
            zorder=4,
            label=f"chosen: {chosen['run_name']}" + ("" if result.met else " (misses the bound)"),
        )
    for _, p in points.iterrows():
        ax.annotate(
            str(p["run_name"]), (p["objective"], p["guard"]), fontsize=6, xytext=(3, 3), textcoords="offset points"
        )
    ax.set_xlabel(f"{g.objective} ({'lower' if g.objective_direction == 'minimize' else 'higher'} is better)")
    ax.set_ylabel(f"{g.metric} ({'higher' if g.direction == 'maximize' else 'lower'} is better)")
    ax.set_title(f"{g.metric} against {g.objective}: the Pareto front", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return True


@dataclass(frozen=True)
class Section:
    """What a guarded study adds to its report: the ``report.md`` section and the files written."""

    markdown: str
    files: list[Path]


def guard_section(parent_tags: dict[str, str], runs: pd.DataFrame, folder: Path) -> Section | None:
    """The Pareto section of a study whose parent run has ``parent_tags`` (None: not guarded), from the
    report's ``runs``; ``pareto.csv`` and ``pareto.png`` written into ``folder``."""
    guard = Guard.from_tags(parent_tags)
    if guard is None:
        return None
    result = front(runs, guard)
    result.points.to_csv(folder / CSV_NAME, index=False)
    files = [folder / CSV_NAME]
    if draw(result, folder / PNG_NAME):
        files.append(folder / PNG_NAME)
    return Section(markdown=to_markdown(result), files=files)


def study_section(tracking_uri: str, parent: str | None, runs: pd.DataFrame, folder: Path) -> Section | None:
    """:func:`guard_section` of the study whose parent run is ``parent`` (None: no parent, no section)."""
    if parent is None:
        return None
    return guard_section(MlflowClient(tracking_uri=tracking_uri).get_run(parent).data.tags, runs, folder)
