"""What a study's trials are made of (:func:`definition`), recorded in the Optuna study when it is
created (``ablate.definition``), so that an edited study is never run on top of trials of its earlier
self: :func:`check_unchanged` refuses another definition under the same name, naming the first
difference (docs/studies.md, "An edited study")."""

from __future__ import annotations

import dataclasses
import json

import optuna

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.yamlio import Json
from ablate.sweeps.base import StudyBase
from ablate.sweeps.spec import StudySpec

KEY = "ablate.definition"
"""The Optuna study's user attribute holding the definition (JSON)."""


def _flat(tree: object, prefix: str = "") -> dict[str, object]:
    """A nested mapping as dotted keys (lists and scalars as leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    if not tree:
        return {prefix: {}} if prefix else {}
    out: dict[str, object] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def definition(spec: StudySpec, base: StudyBase) -> dict[str, Json]:
    """The study's definition: each part as JSON-ready data (dotted keys where it is a config tree)."""
    model = spec.study_model
    parts = {
        "base": {**_flat(base.tree), **spec.overrides},
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
    parsed: dict[str, Json] = json.loads(json.dumps(parts, default=str))  # tuples as lists, as they come back
    return parsed


def _first_change(part: str, old: object, new: object) -> str:
    """The first difference of one part, as ``part key: NEW here, OLD when ...``."""
    if isinstance(old, dict) and isinstance(new, dict):
        flat_old, flat_new = _flat(old), _flat(new)
        for key in [*flat_new, *(k for k in flat_old if k not in flat_new)]:
            if flat_old.get(key, "<unset>") != flat_new.get(key, "<unset>"):
                return f"{part} {key}: {flat_new.get(key, '<unset>')!r} here, {flat_old.get(key, '<unset>')!r}"
    return f"{part}: {new!r} here, {old!r}"


def check_unchanged(study: optuna.Study, spec: StudySpec, base: StudyBase, where: str) -> None:
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
