"""The grid queue, and trials taken and left by workers (no training)."""

from __future__ import annotations

import time

import optuna
import pytest

from ablate.sweeps import workers
from ablate.sweeps.spec import StudySpec

SEARCH = {
    "optim.lr": {"choices": [1e-4, 1e-3, 3e-3]},
    "model.embed_dim": {"choices": [32, 128]},
    "model.sharing": {"choices": ["all", "none"]},
}


def _queued(name: str) -> list[dict]:
    spec = StudySpec(name=name, base={}, search=SEARCH, sampler="grid")
    study = optuna.create_study(study_name=name, storage=optuna.storages.InMemoryStorage())
    assert workers.fill_queue(study, spec, created=True) == 12
    return [t.system_attrs["fixed_params"] for t in study.get_trials(states=(optuna.trial.TrialState.WAITING,))]


def test_the_grid_is_queued_once_in_a_seeded_random_order():
    order = _queued("s")
    spec = StudySpec(name="s", base={}, search=SEARCH, sampler="grid")
    assert sorted(map(workers.key, order)) == sorted(map(workers.key, workers.grid_points(spec)))
    assert order == _queued("s")  # the same study name queues the same order
    assert order != workers.grid_points(spec)  # not grid order: the first trials are not all one learning rate
    assert len({p["optim.lr"] for p in order[:4]}) > 1


def _asked(rdb: optuna.storages.RDBStorage, queued: bool) -> tuple[optuna.Study, int]:
    """A trial taken as a worker stopped by a signal in ``study.ask`` leaves it: RUNNING, no heartbeat thread."""
    study = optuna.create_study(study_name="s", storage=rdb, load_if_exists=True)
    if queued:
        study.enqueue_trial({"x": 1})
    return study, study.ask()._trial_id


@pytest.mark.parametrize("queued", [True, False], ids=["from-the-queue", "new"])
def test_a_trial_taken_and_never_run_goes_stale(tmp_path, queued):
    """Optuna finds stale only a trial with a heartbeat; ablate's storage records one as the trial is taken."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    stale: list[int] = []
    rdb = workers.storage(url, 1, lambda study, trial: stale.append(trial.number))
    study, trial_id = _asked(rdb, queued)
    optuna.storages.fail_stale_trials(study)
    assert study.get_trials()[-1].state == optuna.trial.TrialState.RUNNING  # within its grace period
    time.sleep(4.5)  # past the grace period (3 s) by more than SQLite's clock resolution (1 s)
    optuna.storages.fail_stale_trials(study)
    assert study._storage.get_trial(trial_id).state == optuna.trial.TrialState.FAIL
    assert stale == [study._storage.get_trial(trial_id).number]


def test_a_trial_taken_without_a_heartbeat_goes_stale_once_taken_a_grace_period_ago(tmp_path):
    """A trial Optuna's own storage took and never gave a heartbeat (a worker without ablate's storage,
    or one stopped between taking it and its first heartbeat) is stale to ablate's storage after grace."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    plain = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=3)
    study, trial_id = _asked(plain, queued=True)
    time.sleep(4.5)  # past the grace period (3 s) by more than SQLite's clock resolution (1 s)
    optuna.storages.fail_stale_trials(study)
    assert plain.get_trial(trial_id).state == optuna.trial.TrialState.RUNNING  # Optuna: never stale
    ours = optuna.load_study(study_name="s", storage=workers.storage(url, 1, lambda study, trial: None))
    fresh = ours.ask()._trial_id  # taken just now: within its grace period
    optuna.storages.fail_stale_trials(ours)
    assert plain.get_trial(trial_id).state == optuna.trial.TrialState.FAIL
    assert plain.get_trial(fresh).state == optuna.trial.TrialState.RUNNING


def test_a_worker_stopped_in_ask_releases_its_trial_for_the_others(tmp_path):
    """A signal in Optuna's ``ask`` leaves the trial RUNNING (Optuna fails a trial only once it runs): the
    stopped worker fails it, marked with the signal, and a worker going on queues its configuration again."""
    spec = StudySpec(name="s", base={}, search={"model.sharing": {"choices": ["all"]}}, sampler="grid")
    rdb = workers.storage(f"sqlite:///{tmp_path / 'optuna.db'}", 10, lambda study, trial: None)
    study = optuna.create_study(study_name="s", storage=rdb)
    workers.fill_queue(study, spec, created=True)
    done = study.ask()
    study.tell(done, 1.0)
    workers.fill_queue(study, spec, created=False)  # queued again, as a retry would be: taken, then stopped
    stopped = study.ask()
    assert workers.release_taken(study, rdb, "SIGTERM") == [stopped.number]  # not the finished one
    frozen = study.get_trials()[stopped.number]
    assert frozen.state == optuna.trial.TrialState.FAIL and frozen.user_attrs[workers.INTERRUPTED] == "SIGTERM"
    assert not workers.others_running(study)
    assert workers.requeue_interrupted(study, spec) == 1


def test_only_a_configuration_whose_last_attempt_was_stopped_is_queued_again(tmp_path):
    """A stopped configuration is queued again once; if that attempt then fails for real, it is left to the
    next invocation (as any failure is), not queued again and again in a loop by the worker going on."""
    spec = StudySpec(name="s", base={}, search={"model.sharing": {"choices": ["all"]}}, sampler="grid")
    study = optuna.create_study(study_name="s", storage=optuna.storages.InMemoryStorage())
    workers.fill_queue(study, spec, created=True)
    stopped = study.ask()
    stopped.set_user_attr(workers.INTERRUPTED, "SIGTERM")
    study.tell(stopped, state=optuna.trial.TrialState.FAIL)
    assert workers.requeue_interrupted(study, spec) == 1
    failed = study.ask()  # the requeued attempt, failing on its own (an error, not a signal)
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    assert workers.requeue_interrupted(study, spec) == 0
