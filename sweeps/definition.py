"""What a study's trials are made of, recorded with the study, so that an edited study is never run
on top of trials of its earlier self.

A study's *definition* is everything its trials' configs and its ranking follow from: the base config
and the study's fixed ``overrides``, the search space, the variants, the seeds, the fine-tuning tasks,
the study's own model (teacher, prune_source or reference), the metric it optimizes and how it
samples. It is stored in the Optuna study (user attribute ``ablate.definition``) when the study is
created. Running the same study name again with another definition is refused, naming the first
difference: its finished trials would otherwise be counted as the new study's (a study whose
``trainer.max_steps`` went from 300 to 50 would train nothing and report the 300-step runs). To run
the edited study, give it a new ``name:``; the old one's runs stay as they were.

What may change without a new name: the report, the pruner (it only stops trials yet to run), the
heartbeat and where checkpoints go.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import optuna

from ablate.lightning_modules.config.errors import ConfigError
from ablate.sweeps.spec import StudySpec

KEY = "ablate.definition"
"""The Optuna study's user attribute holding the definition (JSON)."""


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys (lists and scalars as leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    if not tree:
        return {prefix: {}} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def definition(spec: StudySpec, base: dict[str, Any]) -> dict[str, Any]:
    """The study's definition: each part as JSON-ready data (dotted keys where it is a config tree)."""
    model = spec.study_model
    parts = {
        "base": {**_flat(base), **spec.overrides},
        "search": {k: dataclasses.asdict(v) for k, v in spec.search.items()},
        "variants": spec.variants,
        "seeds": spec.seeds,
        "tasks": [dataclasses.asdict(t) for t in spec.tasks],
        model.SECTION if model is not None else "study model": dataclasses.asdict(model) if model else None,
        "optimize": {k: v for k, v in dataclasses.asdict(spec.optimize).items() if k != "guard" or v is not None},
        "sampler": spec.sampler,
        "n_trials": spec.n_trials,
        **({"source": spec.source} if spec.source is not None else {}),  # absent before studies had one
    }
    parsed: dict[str, Any] = json.loads(json.dumps(parts, default=str))  # tuples as lists, as they come back
    return parsed


def _first_change(part: str, old: Any, new: Any) -> str:
    """The first difference of one part, as ``part key: NEW here, OLD when ...``."""
    if isinstance(old, dict) and isinstance(new, dict):
        flat_old, flat_new = _flat(old), _flat(new)
        for key in [*flat_new, *(k for k in flat_old if k not in flat_new)]:
            if flat_old.get(key, "<unset>") != flat_new.get(key, "<unset>"):
                return f"{part} {key}: {flat_new.get(key, '<unset>')!r} here, {flat_old.get(key, '<unset>')!r}"
    return f"{part}: {new!r} here, {old!r}"


def check_unchanged(study: optuna.Study, spec: StudySpec, base: dict[str, Any], where: str) -> None:
    """Record the study's definition in a study that has none (new, or made before definitions were
    kept); else refuse one that differs (ConfigError naming the first change and the trials it would
    mix with)."""
    mine = definition(spec, base)
    stored = study.user_attrs.get(KEY)
    if stored is None:
        study.set_user_attr(KEY, mine)
        return
    changed = [part for part in {**stored, **mine} if stored.get(part) != mine.get(part)]
    if not changed:
        return
    ran = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
    first = _first_change(changed[0], stored.get(changed[0]), mine.get(changed[0]))
    more = f" (and {', '.join(changed[1:])})" if len(changed) > 1 else ""
    raise ConfigError(
        f"{where}: study {spec.name!r} was edited since its {ran} trial{'s' * (ran != 1)} ran: {first} in them{more}; "
        f"running it would mix them with the edited study's: give the edited study a new name (name:)"
    )
