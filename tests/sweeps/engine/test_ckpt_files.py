"""Checkpoint files: written whole or not at all without an in-memory copy (FileWriter), a file of the same
step kept as a hard link (link_copy, KeptCheckpoint), and a phase's end kept without its optimizer state."""

from __future__ import annotations

import os
from pathlib import Path

import fsspec
import pytest
import torch

from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine import checkpoints
from ablate.sweeps.engine.ckpt_files import FileWriter, link_copy, local_path
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.phases import ENDED, PHASE, ended_name
from ablate.sweeps.engine.runner import train
from tests.sweeps.conftest import tiny_base


def _state(value: float) -> dict[str, object]:
    return {"global_step": 3, "state_dict": {"w": torch.full((4, 4), value)}}


def test_the_writer_replaces_the_file_whole_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "last.ckpt"
    FileWriter().save_checkpoint(_state(1.0), target)
    kept = tmp_path / "kept.ckpt"
    os.link(target, kept)  # what an earlier save is linked as
    FileWriter().save_checkpoint(_state(2.0), target)
    assert torch.load(target)["state_dict"]["w"].eq(2.0).all()
    assert torch.load(kept)["state_dict"]["w"].eq(1.0).all()  # a new file, never the old one rewritten
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]


def test_a_save_that_fails_leaves_the_earlier_file_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "last.ckpt"
    FileWriter().save_checkpoint(_state(1.0), target)
    with pytest.raises(Exception, match="pickle"):
        FileWriter().save_checkpoint({"global_step": 4, "hook": lambda: None}, target)
    assert torch.load(target)["state_dict"]["w"].eq(1.0).all()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_another_filesystem_is_written_as_lightning_writes_it() -> None:
    FileWriter().save_checkpoint(_state(3.0), "memory://ckpt-files/last.ckpt")
    with fsspec.open("memory://ckpt-files/last.ckpt", "rb") as f:
        assert torch.load(f)["state_dict"]["w"].eq(3.0).all()
    assert local_path("memory://ckpt-files/last.ckpt") is None


def test_link_copy_replaces_the_target_with_the_source_or_changes_nothing(tmp_path: Path) -> None:
    source, target = tmp_path / "best.ckpt", tmp_path / "last.ckpt"
    source.write_bytes(b"best"), target.write_bytes(b"older")
    assert link_copy(source, target)
    assert target.samefile(source) and target.read_bytes() == b"best"
    assert not link_copy("memory://ckpt-files/best.ckpt", tmp_path / "other.ckpt")
    assert not link_copy(tmp_path / "missing.ckpt", target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]


@pytest.mark.timeout(300)
def test_a_run_links_last_to_best_of_the_same_step_and_ends_its_phase_without_the_optimizer(
    tmp_path: Path, wiki_validation: Path
) -> None:
    cfg = build_config(tiny_base(tmp_path, wiki_validation, max_steps=8, val_every=4, measure=False))
    plan = checkpoints.run_place(str(tmp_path / "ckpt"), cfg.tracking.root, cfg)
    train(cfg, RunContext(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", checkpoint=plan))
    (folder,) = (tmp_path / "ckpt" / "runs").iterdir()
    last, best, ended = (torch.load(folder / n, weights_only=False) for n in ("last.ckpt", "best.ckpt", ended_name(0)))
    assert last["global_step"] == best["global_step"] == 8  # the validation loss fell from step 4 to step 8
    assert (folder / "last.ckpt").samefile(folder / "best.ckpt")  # one file: the state was written once
    assert "optimizer_states" in last and last[PHASE] == 0
    assert ended[ENDED]["step"] == 8 and "ablate_rng" in ended and ended[PHASE] == 0
    assert "optimizer_states" not in ended and "lr_schedulers" not in ended
    weights, trained = ended["state_dict"], last["state_dict"]
    assert weights.keys() == trained.keys() and all(torch.equal(weights[k], trained[k]) for k in weights)
    assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt", "last.ckpt", ended_name(0)]
