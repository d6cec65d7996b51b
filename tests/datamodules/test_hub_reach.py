"""A hub dataset the data catalog does not map is found unreachable before anything runs (offline)."""

from __future__ import annotations

import pytest
import yaml
from datasets import config
from huggingface_hub import constants

from ablate.cli import main
from ablate.datamodules import hub_reach
from ablate.lightning_modules.config.errors import DataError


@pytest.fixture()
def offline(tmp_path, monkeypatch):
    """Offline mode, empty caches under ``tmp_path``; the process's probe forgotten before and after."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    hub_reach.hub_answers.cache_clear()
    yield tmp_path
    hub_reach.hub_answers.cache_clear()


def test_an_unmapped_hub_dataset_needs_the_cache_or_the_hub(offline):
    with pytest.raises(DataError) as err:
        hub_reach.check_reachable("tasks[0].train", "nyu-mll/glue:mnli")
    message = str(err.value)
    assert message.startswith("tasks[0].train: nyu-mll/glue:mnli: not in the local cache and the hub cannot be reached")
    assert "map it to local files in the data catalog" in message  # the session's catalog, named
    (offline / "hub" / "datasets--nyu-mll--glue").mkdir(parents=True)  # downloaded once: readable offline
    hub_reach.check_reachable("tasks[0].train", "nyu-mll/glue:mnli")


def test_sweep_check_refuses_a_study_whose_task_cannot_be_read(offline, capsys):
    study = {
        "name": "offline",
        "base": {"tracking": {"root": str(offline / "runs")}},
        "source": "runs:/abc",
        "tasks": [{"task": "mnli", "train": "nyu-mll/glue:mnli_unmapped", "max_steps": 3}],
        "optimize": {"metric": "mnli/best_accuracy", "direction": "maximize"},
    }
    path = offline / "offline.yaml"
    path.write_text(yaml.safe_dump(study), encoding="utf-8")
    for command in (["sweep", "check", str(path)], ["sweep", str(path)]):
        assert main(command) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: {path}: tasks[0].train: nyu-mll/glue:mnli_unmapped: not in the local cache")
    assert not (offline / "runs").exists()
