"""A study's trial (sweeps/trial.py): the table of its endings, and each ending as a trial records it
(an in-memory Optuna study, a real MLflow store, the training replaced by what each ending does)."""

from __future__ import annotations

import signal
from contextlib import nullcontext
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from ablate.sweeps import attempts, workers
from ablate.sweeps.base import StudyBase
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.context import RunContext, RunResult
from ablate.sweeps.engine.interrupt import Interrupted
from ablate.sweeps.spec import StudySpec
from ablate.sweeps.study_model_runs import StudyPlace
from ablate.sweeps.trial import INTERRUPTED, OUTCOMES, RUN_ID, Outcome, StudyTrial, TrialInputs, took

ENDS = {state for state in TrialState if state.is_finished()}  # COMPLETE, PRUNED, FAIL


def test_every_outcome_has_one_row_and_every_end_state_an_outcome():
    assert set(OUTCOMES) == set(Outcome)
    assert {ending.optuna for ending in OUTCOMES.values()} == ENDS
    states = {outcome: ending.state for outcome, ending in OUTCOMES.items()}
    assert states == {
        Outcome.COMPLETE: "COMPLETE",
        Outcome.FINISHED_BEFORE_RETRY: "COMPLETE",
        Outcome.PRUNED: "PRUNED",
        Outcome.INTERRUPTED: "INTERRUPTED",
        Outcome.FAIL: "FAIL",
        Outcome.LOST_CLAIM: None,  # no run
    }


def test_each_row_says_what_it_sets():
    for outcome, ending in OUTCOMES.items():
        assert ending.optuna in ENDS, outcome
        if ending.optuna == TrialState.FAIL:  # a failed trial says why: its signal or its reason
            assert {INTERRUPTED, tracking.FAIL_REASON} & set(ending.user_attrs), outcome
        else:
            assert not ending.user_attrs, outcome
        assert (ending.said is None) == (ending.state is None), outcome  # a trial with a run says how it ended
    assert OUTCOMES[Outcome.FAIL].run_tags == (tracking.FAIL_REASON,)
    assert OUTCOMES[Outcome.FINISHED_BEFORE_RETRY].run_tags == (tracking.TRIAL, attempts.FINISHED_BEFORE)
    assert OUTCOMES[Outcome.INTERRUPTED].run_tags == ()  # its reason is its run's own (ended KILLED)


def test_took():
    assert (took(41.23), took(185), took(3720)) == ("41.2 s", "3 min 05 s", "1 h 02 min")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[object, str, str]:
    root = Path(tmp_path_factory.mktemp("trial"))
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = tracking.connect(uri)
    return client, uri, tracking.experiment_id(client, "endings", uri)


def _ended(store, monkeypatch, outcome: Outcome, name: str):
    """A one-trial study whose training does what ``outcome`` is; the frozen trial and its run."""
    client, uri, exp_id = store
    spec = StudySpec(name=name, search={"optim.lr": {"choices": [1e-3]}}, sampler="random")
    place = StudyPlace(spec, StudyBase(), client, exp_id, uri, "parent", None)

    def train(self: StudyTrial, cfg, ctx, params) -> RunResult:
        tags = {tracking.STUDY: name, tracking.TRIAL: str(self.trial.number), tracking.STATE: "RUNNING"}
        run_id = client.create_run(exp_id, tags=tags).info.run_id
        if outcome is Outcome.PRUNED:
            raise optuna.TrialPruned
        if outcome is Outcome.INTERRUPTED:
            raise Interrupted(signal.SIGTERM)
        if outcome is Outcome.FAIL:
            raise RuntimeError("boom")
        return RunResult(run_id, uri, {"val/loss": 0.5})

    monkeypatch.setattr(StudyTrial, "config", lambda self, params: None)
    monkeypatch.setattr(StudyTrial, "context", lambda self, params, cfg: RunContext(name="t"))
    monkeypatch.setattr(StudyTrial, "train", train)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    if outcome is Outcome.LOST_CLAIM:  # its configuration finished already
        study.enqueue_trial({"optim.lr": 1e-3, "seed": 0})
        study.optimize(TrialInputs(place).objective, n_trials=1)
    if outcome is Outcome.FINISHED_BEFORE_RETRY:  # trial 0's run finished; its worker died before Optuna knew
        tags = {tracking.STUDY: name, tracking.TRIAL: "0", tracking.ROLE: "trial"}
        dead = client.create_run(exp_id, tags=tags).info.run_id
        client.log_metric(dead, "val/loss", 0.25)
        client.set_terminated(dead, "FINISHED")
        study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
        monkeypatch.setattr(workers, "retry_history", lambda trial: [0])
    with pytest.raises(Interrupted) if outcome is Outcome.INTERRUPTED else nullcontext():
        study.optimize(TrialInputs(place).objective, n_trials=1, catch=(RuntimeError, workers.DuplicateTrial))
    trial = study.trials[-1]
    run_id = trial.user_attrs.get(RUN_ID)
    return trial, client.get_run(run_id) if run_id is not None else None


@pytest.mark.parametrize("outcome", list(Outcome), ids=[o.name for o in Outcome])
def test_a_trial_ends_as_its_row_says(store, monkeypatch, outcome):
    trial, run = _ended(store, monkeypatch, outcome, f"endings-{outcome.name.lower().replace('_', '-')}")
    ending = OUTCOMES[outcome]
    assert trial.state == ending.optuna
    assert set(ending.user_attrs) <= set(trial.user_attrs)
    if ending.state is None:
        assert run is None and RUN_ID not in trial.user_attrs
        assert "is held by trial 0" in trial.user_attrs[tracking.FAIL_REASON]
        return
    assert run.data.tags[tracking.STATE] == ending.state
    assert set(ending.run_tags) <= set(run.data.tags)
    expected = {
        Outcome.COMPLETE: (0.5, {}),
        Outcome.FINISHED_BEFORE_RETRY: (0.25, {tracking.TRIAL: "1", attempts.FINISHED_BEFORE: "0"}),
        Outcome.PRUNED: (None, {}),
        Outcome.INTERRUPTED: (None, {INTERRUPTED: "SIGTERM"}),
        Outcome.FAIL: (None, {tracking.FAIL_REASON: "RuntimeError: boom"}),
    }
    value, said = expected[outcome]
    assert trial.value == value
    for key, text in said.items():
        assert (trial.user_attrs | run.data.tags)[key] == text
