"""What ``ablate report TARGET`` builds: TARGET as a study file, a report file, a shipped report name or
a shipped study name (a report name wins), resolved to the report spec, the study to read, where its
store is, which trials its grid should hold and the command that runs them (docs/reports.md, "Reports")."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.run import DEFAULT_ROOT
from ablate.reports import catalog
from ablate.reports.rows import Key, clean_key
from ablate.reports.runs import parse_param
from ablate.reports.spec import ReportSpec
from ablate.reports.tables import Expected

if TYPE_CHECKING:
    from ablate.sweeps.base import StudyBase
    from ablate.sweeps.spec import StudySpec


@dataclass(frozen=True)
class Target:
    """A resolved ``ablate report`` target.

    Attributes:
        report: The report spec.
        study: The study (MLflow experiment) to read.
        root: ``tracking.root`` of the default store (the study's, else ``ablate-runs``).
        tracking_uri: The store the study or report names, if any.
        expected: The trials the study's grid should hold per row, if known.
        sweep: The command that runs the study, if known (``ablate sweep sweeps/studies/quickstart.yaml``).
    """

    report: ReportSpec
    study: str
    root: str = DEFAULT_ROOT
    tracking_uri: str | None = None
    expected: Expected | None = None
    sweep: str | None = None


def _study_dir() -> Path:
    """The shipped studies' folder: the package's (an editable install: the checkout's ``sweeps/studies``)."""
    import ablate.sweeps

    return Path(ablate.sweeps.__file__).resolve().parent / "studies"


def shipped_study(name: str) -> Path | None:
    """The shipped study file for ``name`` (``_`` and ``-`` alike: ``albert-table3`` ->
    ``albert_table3.yaml``), or None."""
    path = _study_dir() / f"{name.replace('-', '_')}.yaml"
    return path if path.is_file() else None


def study_names() -> list[str]:
    """Names of the shipped studies' files, sorted (``quickstart``, ``albert_table3``, ...)."""
    return sorted(p.stem for p in _study_dir().glob("*.yaml"))


def shown(path: Path) -> str:
    """``path`` as a user would type it here: relative to the working folder when under it."""
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except ValueError:  # another drive
        return str(path)


def expected_trials(spec: StudySpec, base: StudyBase, report: ReportSpec, path: Path) -> Expected | None:
    """Trials per row key that the study's grid (in the file ``path``) runs, seeds and variants
    included, or None where the study does not fix them (a sampler other than ``grid``, an
    ``n_trials``) or a row is not a field or parameter of its trials."""
    from ablate.lightning_modules.config.experiment import run_params
    from ablate.sweeps.spec import corner_trials

    if spec.sampler != "grid" or spec.n_trials is not None:
        return None
    counts: Counter[Key] = Counter()
    for params, cfg in corner_trials(spec, base):  # every grid point, at the first seed
        for seed in spec.seeds:
            logged = {k: str(v) for k, v in {**run_params(cfg), **params, "seed": seed}.items()}
            if any(row not in logged for row in report.rows):
                return None
            counts[clean_key(parse_param(logged[row]) for row in report.rows)] += 1
    return Expected(dict(counts), f"ablate sweep {shown(path)}")


def _from_study(path: Path, study: str | None) -> Target:
    """A study file's target (errors in the study name the file)."""
    from ablate.sweeps.spec import corner_configs, load_study

    spec, base = load_study(path)
    report = catalog.study_report(spec, path) or catalog.default_report(spec)
    cfg = corner_configs(spec, base)[0]
    if study not in (None, spec.name):  # the same table for another study: its grid is not this one
        return Target(report, study, cfg.tracking.root, cfg.tracking.tracking_uri)
    expected = expected_trials(spec, base, report, path)
    sweep = f"ablate sweep {shown(path)}"
    return Target(report, spec.name, cfg.tracking.root, cfg.tracking.tracking_uri, expected, sweep)


def _for_report(report: ReportSpec, study: str | None) -> Target:
    """A report spec's target: MLflow is all it reads; the grid and command of the shipped study it
    names, where there is one (a shipped study that cannot be read only loses those)."""
    name = study or report.study
    if not name:
        raise ConfigError("study: required in a report spec (or give --study)")
    path = shipped_study(name)
    if path is None:
        return Target(report, name, tracking_uri=report.tracking_uri)
    from ablate.sweeps.spec import load_study

    try:
        spec, base = load_study(path)
        expected = expected_trials(spec, base, report, path) if spec.name == name else None
    except ConfigError:
        return Target(report, name, tracking_uri=report.tracking_uri)
    sweep = f"ablate sweep {shown(path)}" if spec.name == name else None
    return Target(report, name, tracking_uri=report.tracking_uri, expected=expected, sweep=sweep)


def resolve_target(target: str, study: str | None = None) -> Target:
    """``ablate report TARGET [--study STUDY]``, resolved.

    Raises:
        ConfigError: naming TARGET: no such file, shipped report or shipped study; a study without
            a report; a report spec without a study (and no ``--study``); an invalid spec.
    """
    path = Path(target)
    if path.is_dir():
        raise ConfigError(f"{target}: is a folder, not a file (a study or REPORT.yaml)")
    if path.is_file():
        from ablate.lightning_modules.config.load import read_yaml

        raw = read_yaml(path)
        if "search" in raw or "variants" in raw or "base" in raw:  # a study
            return _from_study(path, study)
        report = ReportSpec.from_yaml(path)
        try:
            return _for_report(report, study)
        except ConfigError as exc:
            raise ConfigError(f"{target}: {exc}") from None
    if catalog.shipped(target) is None and not catalog.looks_like_path(target):
        found = shipped_study(target)
        if found is not None:
            return _from_study(found, study)
        raise ConfigError(
            f"{target}: not a shipped report (one of {', '.join(catalog.names())}), a shipped study "
            f"(one of {', '.join(study_names())}) nor a .yaml file"
        )
    return _for_report(catalog.load_named(target), study)
