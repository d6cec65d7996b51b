"""A study's Optuna sections: a searched field sampled under its dotted name, the pruners a study can
name, and what each refuses."""

from __future__ import annotations

import optuna
import pytest
from pydantic import ValidationError

from ablate.sweeps.optuna_spec import ParamSpace, PrunerSpec


@pytest.mark.parametrize(
    ("space", "kind"),
    [
        (ParamSpace(choices=[32, 128]), int),
        (ParamSpace(low=1, high=4), int),  # whole ends, linear: an int range
        (ParamSpace(low=1e-4, high=1e-2, log=True), float),
        (ParamSpace(low=1, high=4, type="float"), float),
    ],
)
def test_a_field_is_sampled_under_its_dotted_name(space, kind):
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    value = space.suggest(trial, "model.embed_dim")
    assert trial.params == {"model.embed_dim": value} and isinstance(value, kind)


def test_corners_of_a_range_are_its_ends_first():
    assert list(ParamSpace(low=1, high=3).corners()) == [1, 3, 2]
    assert list(ParamSpace(choices=["all", "none"]).corners()) == ["all", "none"]


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"choices": []}, "empty search space"),
        ({"choices": [1], "low": 0}, "either choices or low/high"),
        ({"low": 1}, "both low and high"),
        ({"low": 4, "high": 1}, "above high"),
    ],
)
def test_a_bad_search_field_is_refused(raw, says):
    with pytest.raises(ValidationError, match=says):
        ParamSpace(**raw)


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ({"type": "none"}, optuna.pruners.NopPruner),
        ({"type": "median", "n_startup_trials": 3}, optuna.pruners.MedianPruner),
        ({"type": "percentile", "percentile": 25.0}, optuna.pruners.PercentilePruner),
        ({"type": "hyperband", "n_warmup_steps": 10}, optuna.pruners.HyperbandPruner),
        ({"type": "threshold", "upper": 9.0}, optuna.pruners.ThresholdPruner),
    ],
)
def test_pruners(raw, kind):
    assert isinstance(PrunerSpec(**raw).build(max_steps=100), kind)


def test_percentile_pruner_prunes_below_the_best_quarter():
    pruner = PrunerSpec(type="percentile", percentile=25.0, n_startup_trials=4).build(max_steps=10)
    study = optuna.create_study(pruner=pruner)
    for value in (1.0, 2.0, 3.0, 4.0):  # finished trials; the 25th percentile at step 5 is 1.75
        trial = study.ask()
        trial.report(value, 5)
        study.tell(trial, value)
    better, worse = study.ask(), study.ask()
    better.report(1.5, 5)
    worse.report(2.5, 5)
    assert not better.should_prune() and worse.should_prune()


@pytest.mark.parametrize("percentile", [0.0, 100.0, 150.0])
def test_percentile_out_of_range_is_refused(percentile):
    with pytest.raises(ValidationError, match="percentile"):
        PrunerSpec(type="percentile", percentile=percentile)


def test_the_threshold_pruner_needs_its_bound():
    with pytest.raises(ValidationError, match="upper"):
        PrunerSpec(type="threshold")
