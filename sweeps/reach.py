"""A searched key reaches every trial it is sampled for (:func:`check_search_reaches`, from
:func:`~ablate.sweeps.spec.validate_study`): refused when the study fixes it too (``overrides:``,
:func:`check_not_searched`; a variant), when it is ``seed`` or ``name``, or when no trial reads it
(:data:`MOOT`, or a regime or quantization method that does not use it); docs/configuration.md."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig, run_params


class Searched(Protocol):
    """What these checks read of a study (:class:`~ablate.sweeps.spec.StudySpec`)."""

    @property
    def search(self) -> Mapping[str, object]: ...
    @property
    def variants(self) -> Mapping[str, Mapping[str, object]]: ...
    @property
    def overrides(self) -> Mapping[str, object]: ...


SET_BY_STUDY = {
    "seed": "each trial's seed is one of the study's seeds: (give seeds: [...] instead)",
    "name": "each trial is named by the study's name:",
}
"""Config fields the study sets in each trial after its search, and how."""

MOOT: dict[str, Callable[[ExperimentConfig], str | None]] = {
    "model.num_heads": lambda c: "model.layers gives every layer's heads" if c.model.layers is not None else None,
    "model.ffn_dim": lambda c: "model.layers gives every layer's feed-forward width" if c.model.layers else None,
    "objective.max_ngram": lambda c: (
        f"objective.masking is {c.objective.masking!r}, not 'ngram'" if c.objective.masking != "ngram" else None
    ),
    "objective.sentence_weight": lambda c: (
        "objective.sentence is 'none' (no sentence loss to weigh)" if c.objective.sentence == "none" else None
    ),
}
"""A field, and what makes it moot in a trial's config (None: it is read)."""


def _unread(key: str, cfg: ExperimentConfig) -> str | None:
    """Why the trial ``cfg`` does not read ``key`` (None: it does)."""
    moot = MOOT.get(key)
    why = moot(cfg) if moot is not None else None
    if why is not None or key in run_params(cfg) or key in SET_BY_STUDY:
        return why
    if key.startswith("quant."):
        return f"quant.method {cfg.quant.method!r} does not read it"
    return f"a {cfg.regime} run does not use it"


def check_search_reaches(
    spec: Searched, trials: Sequence[tuple[Mapping[str, object], ExperimentConfig]], where: Path | str
) -> None:
    """Refuse a searched key that the study's own settings override or that no trial reads: one the study
    fixes too (in its ``overrides:``, or a variant, whose value the sampled one would replace), ``seed`` or
    ``name`` (the study sets them), or one no trial reads (:data:`MOOT`, or its regime or quantization
    method does not use it: not among its :func:`~ablate.lightning_modules.config.experiment.run_params`).
    ``trials``: the checked trials (:func:`~ablate.sweeps.spec.corner_trials`)."""

    for key in spec.search:
        if key in SET_BY_STUDY:
            raise ConfigError(f"{where}: search.{key}: {SET_BY_STUDY[key]}; the sampled value would be dropped")
        for name, changes in spec.variants.items():
            if key in changes:
                raise ConfigError(
                    f"{where}: search.{key}: also set by variants.{name} ({changes[key]!r}); the sampled value "
                    f"would replace the variant's in each of its trials: search it or set it in variants, not both"
                )
    for key in spec.overrides:
        if key in SET_BY_STUDY:
            raise ConfigError(f"{where}: overrides.{key}: {SET_BY_STUDY[key]}; this value would be dropped")
    check_not_searched(spec, [k for k in spec.overrides if k in spec.search], where=f"{where}: overrides.")
    configs = [cfg for _, cfg in trials]
    for key in spec.search:
        reasons = [_unread(key, cfg) for cfg in configs]
        if configs and all(reasons):
            raise ConfigError(
                f"{where}: search.{key}: no trial reads it ({reasons[0]}); its trials would differ in nothing"
            )


def check_not_searched(spec: Searched, keys: Iterable[str], where: str = "") -> None:
    """Refuse a fixed setting of a field the study's search samples (``search:``, a variant's change,
    ``seed`` with the study's ``seeds:``): every trial would set its own value over it, so the setting
    would be silently dropped (or, set over the search, drop the search).

    Raises:
        ConfigError: ``{where}KEY: searched by the study (search.KEY) ...``, naming the first such key.
    """
    for key in keys:
        arms = [name for name, changes in spec.variants.items() if key in changes]
        if key in spec.search:
            how = f"search.{key}"
        elif arms:
            how = f"variants {', '.join(arms)}"
        elif key == "seed":
            how = "seeds"
        else:
            continue
        raise ConfigError(
            f"{where}{key}: searched by the study ({how}), which sets it in every trial; a fixed value "
            "would be dropped: change the study's search instead"
        )
