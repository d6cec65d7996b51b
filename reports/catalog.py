"""The shipped report specs (``reports/specs/NAME.yaml``), one per paper-style table, and how a study
names its report: inline, a shipped name (``report: albert-table3``) or a REPORT.yaml path relative
to the study file (docs/reports.md, "Shipped report specs")."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.paths import kind_problem
from ablate.reports.spec import MetricSpec, ReportSpec

if TYPE_CHECKING:
    from ablate.sweeps.spec import StudySpec

#: Folder of the shipped specs.
SPEC_DIR = Path(__file__).with_name("specs")


def names() -> list[str]:
    """Names of the shipped report specs, sorted."""
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def shipped(name: str) -> Path | None:
    """The file of the shipped spec called ``name`` (``_`` and ``-`` alike), or None."""
    path = SPEC_DIR / f"{name.replace('_', '-')}.yaml"
    return path if path.is_file() else None


def looks_like_path(value: str) -> bool:
    """Whether a report target is meant as a file (a ``/`` in it, or a YAML suffix), not a name."""
    return "/" in value or value.endswith((".yaml", ".yml"))


def load_named(target: str, base_dir: Path | None = None) -> ReportSpec:
    """A REPORT.yaml path (relative to ``base_dir``) or a shipped name, as a spec.

    Raises:
        ConfigError: neither a readable spec file nor a shipped name; or an invalid spec.
    """
    if looks_like_path(target):
        path = (base_dir or Path.cwd()) / target
        problem = kind_problem(path, "file")
        if problem is not None:
            raise ConfigError(f"{target}: {problem}" if path.exists() else f"{target}: no such report spec file")
        return ReportSpec.from_yaml(path)
    found = shipped(target)
    if found is None:
        raise ConfigError(f"{target}: not a shipped report (one of {', '.join(names())}) nor a .yaml file")
    return ReportSpec.from_yaml(found)


def resolve(value: str | Mapping[str, object], where: str = "report", base_dir: Path | None = None) -> ReportSpec:
    """A study's ``report:`` value (inline mapping, shipped name or path) as a spec.

    Raises:
        ConfigError: naming ``where`` (e.g. ``study.yaml: report``).
    """
    if isinstance(value, str):
        try:
            return load_named(value, base_dir)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return ReportSpec.from_mapping(value, where=where)


def study_report(spec: StudySpec, path: str | Path) -> ReportSpec | None:
    """A study's report: inline, a shipped name or a REPORT.yaml relative to the study file.

    ``ablate sweep`` reads it with the study, so a bad report fails before anything runs.
    """
    if spec.report is None:
        return None
    return resolve(spec.report, f"{path}: report", Path(path).parent)


def default_report(spec: StudySpec) -> ReportSpec:
    """The table of a study that declares no ``report:``: a row per searched field (and variant; a
    study that searches nothing: one row, its name), the metric it optimizes and each task's best
    dev metric, with intervals over its seeds."""
    rows = [*spec.search, *(["variant"] if spec.variants else [])] or ["name"]
    better: Literal["higher", "lower"] = "higher" if spec.optimize.direction == "maximize" else "lower"
    metrics = [spec.optimize.metric]
    for task in spec.tasks:
        best = f"{task.task}/best_{task.metric}"
        if best not in metrics:
            metrics.append(best)
    return ReportSpec(
        title=f"{spec.name}: the default table (the study declares no report:)",
        rows=tuple(rows),
        metrics=tuple(MetricSpec(name=m, digits=4, better=better) for m in metrics),
        reference="none",
    )
