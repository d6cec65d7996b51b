"""Checkpoint files: written whole or not at all, in the background from a copy taken at the save
(FileWriter), a file of the same step kept as a hard link (link_copy, KeptCheckpoint), and a phase's end
kept without its optimizer state."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import fsspec
import pytest
import torch
from mlflow import MlflowClient

from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine import checkpoints
from ablate.sweeps.engine.ckpt_files import FileWriter, link_copy, local_path, same_file
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.phases import ENDED, PHASE, ended_name
from ablate.sweeps.engine.runner import train
from tests.sweeps.conftest import tiny_base


def _state(value: float) -> dict[str, object]:
    return {"global_step": 3, "state_dict": {"w": torch.full((4, 4), value)}}


def _saved(writer: FileWriter, state: dict[str, object], target: Path) -> None:
    writer.save_checkpoint(state, target)
    writer.wait()


def test_the_writer_replaces_the_file_whole_and_leaves_nothing_else(tmp_path: Path) -> None:
    target, writer = tmp_path / "deep" / "last.ckpt", FileWriter()
    _saved(writer, _state(1.0), target)
    kept = tmp_path / "kept.ckpt"
    os.link(target, kept)  # what an earlier save is linked as
    _saved(writer, _state(2.0), target)
    assert torch.load(target)["state_dict"]["w"].eq(2.0).all()
    assert torch.load(kept)["state_dict"]["w"].eq(1.0).all()  # a new file, never the old one rewritten
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]


def test_a_save_that_fails_leaves_the_earlier_file_as_it_was_and_raises_at_the_wait(tmp_path: Path) -> None:
    target, writer = tmp_path / "last.ckpt", FileWriter()
    _saved(writer, _state(1.0), target)
    writer.save_checkpoint({"global_step": 4, "hook": lambda: None}, target)  # written later, in the background
    with pytest.raises(Exception, match="local object"):  # 3.11: "Can't pickle", 3.13: "Can't get"
        writer.wait()
    assert torch.load(target)["state_dict"]["w"].eq(1.0).all()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    writer.save_checkpoint({"global_step": 5, "hook": lambda: None}, target)
    writer._queued[-1].exception()  # the write has failed: the next save says so
    with pytest.raises(Exception, match="local object"):  # 3.11: "Can't pickle", 3.13: "Can't get"
        writer.save_checkpoint(_state(6.0), target)


def test_a_save_waits_for_the_saves_before_the_last_so_that_two_states_at_most_wait_in_memory(tmp_path: Path) -> None:
    writer, released = FileWriter(), threading.Event()
    writer.then(released.wait)  # a slow disk: everything after it waits
    writer.save_checkpoint(_state(0.0), tmp_path / "first.ckpt")
    writer.then(lambda: None)  # a link or an upload of it: no state of its own
    writer.save_checkpoint(_state(1.0), tmp_path / "a.ckpt")  # one save before it: no wait
    assert not released.is_set() and len(writer._saves) == 2
    threading.Timer(0.3, released.set).start()
    writer.save_checkpoint(_state(2.0), tmp_path / "b.ckpt")  # waits for first.ckpt, the save before the last
    assert released.is_set() and (tmp_path / "first.ckpt").is_file() and len(writer._saves) <= 2
    writer.wait()
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["a.ckpt", "b.ckpt", "first.ckpt"]


def test_the_writer_saves_the_state_as_it_was_at_the_save_with_shared_storage_kept(tmp_path: Path) -> None:
    weight = torch.arange(12.0).reshape(3, 4)
    state = {"state_dict": {"embed": weight, "tied": weight, "row": weight[1]}, "step": torch.tensor(3)}
    writer, target = FileWriter(), tmp_path / "last.ckpt"
    writer.save_checkpoint(state, target)
    weight.add_(100.0)  # the next step, before the file is written
    writer.wait()
    got = torch.load(target)["state_dict"]
    assert torch.equal(got["embed"], torch.arange(12.0).reshape(3, 4)) and torch.equal(got["row"], got["embed"][1])
    shared = got["embed"].untyped_storage().data_ptr()  # one storage, as torch.save keeps it
    assert got["tied"].untyped_storage().data_ptr() == shared == got["row"].untyped_storage().data_ptr()


def test_work_queued_after_a_save_finds_its_file_and_a_held_writer_is_waited_for_by_its_owner(tmp_path: Path) -> None:
    held, target, seen = FileWriter(held=True), tmp_path / "last.ckpt", []
    held.save_checkpoint(_state(1.0), target)
    held.then(lambda: seen.append(torch.load(target)["state_dict"]["w"][0, 0].item()))
    held.teardown()  # a fit's end: the run waits, not the fit
    thread = held._pool
    held.close()  # the run's end: its writes done, its thread ended
    assert seen == [1.0] and held._pool is None and thread is not None and thread._shutdown
    plain = FileWriter()
    plain.save_checkpoint(_state(2.0), tmp_path / "other.ckpt")
    plain.teardown()  # a writer of its own fit: the fit's end waits
    assert not plain._queued and torch.load(tmp_path / "other.ckpt")["state_dict"]["w"].eq(2.0).all()


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


def _rank_saves(writer: FileWriter, target: Path, written: multiprocessing.Queue) -> None:
    writer.save_checkpoint(_state(7.0), target)
    writer.teardown()  # a forked rank's fit ends
    written.put((not writer._queued, target.is_file()))  # waited for: nothing left queued, the file there


def test_a_held_writer_in_a_forked_rank_waits_at_its_fits_end(tmp_path: Path) -> None:
    """A DDP rank forked from the run's process holds a copy of the run's writer: nobody waits for it but
    its own fit's end, so that one does."""
    fork = multiprocessing.get_context("fork")
    written, run, released = fork.Queue(), FileWriter(held=True), threading.Event()
    run.then(released.wait)  # the run's earlier phase still writing when the rank forks: not the rank's to wait for
    rank = fork.Process(target=_rank_saves, args=(run, tmp_path / "last.ckpt", written))
    rank.start()
    assert written.get(timeout=60) == (True, True)
    rank.join(60)
    released.set()
    run.close()
    assert rank.exitcode == 0


def test_same_file_copies_where_links_cannot_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, target = tmp_path / "best.ckpt", tmp_path / "last.ckpt"
    source.write_bytes(b"best"), target.write_bytes(b"older")

    def no_links(a: object, b: object) -> None:
        raise OSError("links are not supported here")

    monkeypatch.setattr(os, "link", no_links)  # a filesystem without hard links
    same_file(source, target)
    assert target.read_bytes() == b"best" and not target.samefile(source)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt", "last.ckpt"]


@pytest.mark.timeout(300)
def test_a_checkpoint_that_cannot_be_written_fails_its_run(tmp_path: Path, wiki_validation: Path) -> None:
    cfg = build_config(tiny_base(tmp_path, wiki_validation, max_steps=4, val_every=2, measure=False))
    folder = tmp_path / "ckpt"
    (folder / f".best.ckpt.{os.getpid()}.partial").mkdir(parents=True)  # where the writer's torch.save goes
    plan = checkpoints.CheckpointPlace(str(folder), False, "digest")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(IsADirectoryError):
        train(cfg, RunContext(tracking_uri=uri, checkpoint=plan))
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED" and "IsADirectoryError" in run.data.tags["ablate.fail_reason"]
    assert sorted(p.name for p in folder.iterdir()) == [f".best.ckpt.{os.getpid()}.partial"]
