"""A study run again in the same store samples the same space: a changed search is named (which
parameter, from what to what) before anything is written, not left to Optuna's own message."""

from __future__ import annotations

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from ablate.lightning_modules.config.errors import ConfigError
from ablate.sweeps.optuna_spec import ParamSpace
from ablate.sweeps.spec import StudySpec


def _described(dist: BaseDistribution) -> str:
    """A distribution as a study writes it: ``choices [32, 64]``, ``int 1..8 (step 2)``, ``float 1e-05..0.01 (log)``."""
    if isinstance(dist, CategoricalDistribution):
        return f"choices {list(dist.choices)}"
    if isinstance(dist, (IntDistribution, FloatDistribution)):
        kind = "int" if isinstance(dist, IntDistribution) else "float"
        extra = [*(["log"] if dist.log else []), *([f"step {dist.step}"] if dist.step not in (None, 1) else [])]
        return f"{kind} {dist.low}..{dist.high}" + (f" ({', '.join(extra)})" if extra else "")
    return repr(dist)


def _distribution(space: ParamSpace) -> BaseDistribution:
    """The Optuna distribution :meth:`ParamSpace.suggest` samples from."""
    if space.choices is not None:
        return CategoricalDistribution(space.choices)
    assert space.low is not None and space.high is not None  # checked: choices, or both low and high
    if space.is_int:
        return IntDistribution(int(space.low), int(space.high), log=space.log, step=int(space.step or 1))
    return FloatDistribution(space.low, space.high, log=space.log, step=space.step)


def check_search_space(study: optuna.Study, spec: StudySpec, where: str, url: str) -> None:
    """Refuse a study whose search space differs from the one its earlier trials in this store sampled
    (the same name, another search: Optuna would fail the first trial with its own message), naming the
    parameter and both spaces, before anything is written. Also for a study made before ablate recorded
    a study's definition (:func:`~ablate.sweeps.definition.check_unchanged`)."""
    from ablate.sweeps.engine.tracking import redact  # MLflow's import: only where a study runs

    names = {"seed": "seeds", "variant": "variants"}
    mine = {name: _distribution(space) for name, space in spec.space.items()}
    for trial in study.get_trials(deepcopy=False):
        for name, old in trial.distributions.items():
            new = mine.get(name)
            if new == old:
                continue
            key = names.get(name, f"search.{name}")
            here, there = (_described(d) if d is not None else "not searched" for d in (new, old))
            if name in names:  # seeds [0, 1], variants ['a', 'b']
                here, there = (text.removeprefix("choices ") for text in (here, there))
            raise ConfigError(
                f"{where}: {key}: {here} here, but the study {spec.name!r} in {redact(url)} sampled "
                f"{there} (trial {trial.number}); its trials cannot go on with another search: give the "
                f"study a new name (name:) or another store (--storage)"
            )
        added = [name for name in mine if trial.distributions and name not in trial.distributions]
        if added:
            key = names.get(added[0], f"search.{added[0]}")
            raise ConfigError(
                f"{where}: {key}: searched here, but not by the study {spec.name!r} in {redact(url)} "
                f"(trial {trial.number}); its trials cannot go on with another search: give the study a new name "
                f"(name:) or another store (--storage)"
            )
