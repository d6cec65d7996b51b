"""optimize.guard: the spec, its constraint values, and the chosen trial with real Optuna studies."""

from __future__ import annotations

import optuna
import pytest
import yaml

from ablate.cli import main
from ablate.lightning_modules.config.errors import ConfigError
from ablate.sweeps.guard import GUARD, GuardRun, GuardSpec, Reference, choose, chosen_line, chosen_trial
from ablate.sweeps.spec import load_study
from tests.sweeps.conftest import write_study

REFERENCE = {"model": {"preset": "albert-tiny", "vocab_size": 1000, "embed_dim": 16, "hidden_dim": 32,
                       "num_layers": 2, "num_heads": 2, "ffn_dim": 64, "max_position": 64}}  # fmt: skip


def test_bounds_and_constraint_values_absolute_relative_and_for_a_loss():
    acc = GuardSpec(metric="sst2/accuracy", max_drop=0.01)
    assert acc.bound(0.90) == pytest.approx(0.89)
    assert acc.violation(0.895, 0.90) == pytest.approx(-0.005)  # within: <= 0, as Optuna expects
    assert acc.violation(0.88, 0.90) == pytest.approx(0.01)  # 0.01 past the bound
    rel = GuardSpec(metric="sst2/accuracy", max_relative_drop=0.02)
    assert rel.bound(0.80) == pytest.approx(0.784)
    loss = GuardSpec(metric="val/mlm_loss", direction="minimize", max_relative_drop=0.1)
    assert loss.bound(2.0) == pytest.approx(2.2)  # a loss may rise, not fall, by the bound
    assert loss.violation(2.3, 2.0) == pytest.approx(0.1)
    assert loss.violation(1.5, 2.0) < 0


@pytest.mark.parametrize(
    ("guard", "needle"),
    [
        ({"metric": "val/mlm_acc", "max_drop": 0.01, "max_relative_drop": 0.01}, "optimize.guard.max_drop: give one"),
        ({"metric": "val/mlm_acc"}, "optimize.guard.max_drop: give one"),
        ({"metric": "val/mlm_acc", "max_relative_drop": 1.5}, "optimize.guard.max_relative_drop"),
        ({"metric": "val/mlm_acc", "max_drop": 0.01}, "optimize.guard.reference: the bound on val/mlm_acc needs"),
        ({"metric": "val/mlm_acc", "max_drop": 0.01, "margin": 1}, "optimize.guard.margin: unknown key"),
    ],
)
def test_bad_guards_name_the_key(tmp_path, wiki_validation, guard, needle):
    path = write_study(tmp_path, wiki_validation, optimize={"metric": "model_bytes", "guard": guard})
    study = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(study))
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_study(path)


def test_a_guard_given_a_reference_or_a_study_model_loads(tmp_path, wiki_validation):
    given = write_study(
        tmp_path,
        wiki_validation,
        name="given",
        optimize={"metric": "model_bytes", "guard": {"metric": "val/mlm_acc", "max_drop": 0.01, "reference": 0.4}},
    )
    spec, _ = load_study(given)
    assert spec.optimize.guard is not None and spec.optimize.guard.bound(0.4) == pytest.approx(0.39)
    folder = write_study(
        tmp_path,
        wiki_validation,
        name="folder",
        search={"quant.method": {"choices": ["dynamic-int8"]}},
        overrides={"regime": "quant"},
        reference={"source": str(tmp_path)},
        optimize={"metric": "model_bytes", "guard": {"metric": "val/mlm_acc", "max_drop": 0.01}},
    )
    with pytest.raises(ConfigError, match="optimize.guard.reference: reference.source .* is a folder"):
        load_study(folder)


QUANT = {"overrides": {"regime": "quant"}, "search": {"quant.method": {"choices": ["dynamic-int8"]}}}


@pytest.mark.parametrize(
    ("guard", "extra", "needle"),
    [
        # a metric no trial logs (a pre-training trial fine-tunes no sst2)
        ({"metric": "sst2/accuracy", "reference": 0.9}, {}, "optimize.guard.metric: 'sst2/accuracy' is not a metric"),
        ({"metric": "val/mlm_accuracy", "reference": 0.9}, {}, "did you mean 'val/mlm_acc'"),
        # the study's reference is pre-trained: it logs no quantization drop to bound by
        (
            {"metric": "quant/mlm_acc_drop"},
            {"reference": REFERENCE, **QUANT},
            "optimize.guard.reference: the study's reference logs no quant/mlm_acc_drop",
        ),
    ],
)
def test_guard_metrics_are_checked_before_anything_runs(tmp_path, wiki_validation, capsys, guard, extra, needle):
    optimize = {"metric": "model_bytes", "guard": {**guard, "max_drop": 0.01}}
    path = write_study(tmp_path, wiki_validation, optimize=optimize, **extra)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: ") and "\n" not in err, err
    assert needle in err, err
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def mlflow_client(tmp_path_factory):
    """A real MLflow store (SQLite) with an experiment the trials' runs go in."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}")
    return client, client.create_experiment("guarded")


def _study_with(mlflow_client, values: list[tuple[float, float]], direction: str = "minimize") -> optuna.Study:
    """A real in-memory study whose trials return each (objective, guard metric), the guard's constraint
    recorded through GuardRun (the reference 0.90, at most 0.01 below it) on the trial and its MLflow run."""
    client, exp_id = mlflow_client
    run = GuardRun(GuardSpec(metric="acc", max_drop=0.01), Reference(0.90, "given"), "model_bytes", direction)  # type: ignore[arg-type]
    study = optuna.create_study(direction=direction, sampler=optuna.samplers.TPESampler(seed=0))
    runs: list[str] = []

    def objective(trial: optuna.Trial) -> float:
        size, acc = values[trial.number]
        trial.suggest_float("x", 0, 1)
        runs.append(client.create_run(exp_id).info.run_id)
        run.record(trial, client, runs[-1], {"acc": acc, "model_bytes": size})
        return size

    study.optimize(objective, n_trials=len(values))
    study.set_user_attr("runs", runs)
    return study


def test_the_best_feasible_trial_is_chosen_and_optuna_agrees(mlflow_client):
    study = _study_with(mlflow_client, [(100.0, 0.91), (50.0, 0.85), (70.0, 0.895), (60.0, 0.88)])
    assert [t.constraints[GUARD] for t in study.trials] == pytest.approx([-0.02, 0.04, -0.005, 0.01])
    trial, met = chosen_trial(study, "minimize")
    assert (trial.number, met) == (2, True)  # 50 and 60 are smaller but past the bound
    assert study.best_trial.number == 2  # Optuna's best among feasible trials, from the same constraint
    assert study.trials[1].user_attrs[GUARD] == {"value": 0.85, "bound": pytest.approx(0.89), "met": False}
    client, runs = mlflow_client[0], study.user_attrs["runs"]
    missed, met_run = client.get_run(runs[1]).data, client.get_run(runs[2]).data
    assert (missed.tags["ablate.guard"], met_run.tags["ablate.guard"]) == ("missed", "met")
    assert missed.metrics["guard/violation"] == pytest.approx(0.04)
    assert met_run.metrics["guard/value"] == 0.895 and met_run.metrics["guard/reference"] == 0.90
    assert "within the bound" in (chosen_line(study, "model_bytes", "minimize") or "")


def test_when_none_is_feasible_the_closest_is_kept_and_said(mlflow_client):
    study = _study_with(mlflow_client, [(100.0, 0.80), (50.0, 0.85), (70.0, 0.87), (60.0, 0.87)])
    with pytest.raises(ValueError, match="No feasible trials"):
        _ = study.best_trial  # what Optuna alone gives: nothing
    trial, met = chosen_trial(study, "minimize")
    assert (trial.number, met) == (3, False)  # closest to the bound (0.02 past), the smaller of the two
    line = chosen_line(study, "model_bytes", "minimize") or ""
    assert "no configuration met the bound" in line and "chosen trial 3" in line


def test_choose_maximizes_and_is_empty_without_candidates():
    assert choose([], "minimize") is None
    assert choose([("a", 1.0, -1.0), ("b", 2.0, 0.0), ("c", 3.0, 0.5)], "maximize") == ("b", True)
    assert choose([("a", 1.0, 0.2), ("b", 2.0, 0.2)], "maximize") == ("b", False)
