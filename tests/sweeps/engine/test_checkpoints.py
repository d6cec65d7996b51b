"""Checkpoints: the random generators they carry (RngState), where they go, and resuming from them, on the CPU.

The GPU half (a resumed CUDA trial ends where an uninterrupted one does) is in tests/test_gpu.py.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.experiment import to_yaml
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine import checkpoints
from ablate.sweeps.engine.checkpoints import RngState
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.runner import train
from ablate.sweeps.engine.tracking import RESUMED
from tests.sweeps.conftest import InterruptAt, tiny_base


def _saved() -> dict:
    checkpoint: dict = {"global_step": 7}
    RngState().on_save_checkpoint(None, None, checkpoint)  # type: ignore[arg-type]
    return checkpoint


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_the_checkpoint_carries_every_generator_and_loads_weights_only(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    checkpoint = _saved()
    state = checkpoint["ablate_rng"]
    assert set(state) == {"python", "numpy", "torch", "cuda"}
    # CUDA's generators when CUDA is in use (one state per device), else none
    assert len(state["cuda"]) == (torch.cuda.device_count() if torch.cuda.is_initialized() else 0)
    path = tmp_path / "last.ckpt"
    torch.save(checkpoint, path)
    loaded = torch.load(path, weights_only=True)  # what a resume reads: plain tensors and tuples only
    expected = _draws()
    steps = []
    RngState(on_resume=steps.append).on_load_checkpoint(None, None, loaded)  # type: ignore[arg-type]
    assert _draws() == expected and steps == [7]


def test_a_checkpoint_without_cuda_state_or_from_other_devices_still_loads() -> None:
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    checkpoint = _saved()
    expected = _draws()
    old = {**checkpoint, "ablate_rng": {k: v for k, v in checkpoint["ablate_rng"].items() if k != "cuda"}}
    RngState().on_load_checkpoint(None, None, old)  # type: ignore[arg-type]  # written before CUDA state was saved
    assert _draws() == expected
    # from a machine with another number of GPUs (or here, without any): CPU streams restored, CUDA's left alone
    other = {
        **checkpoint,
        "ablate_rng": {
            **checkpoint["ablate_rng"],
            "cuda": [torch.zeros(16, dtype=torch.uint8)] * (torch.cuda.device_count() + 1),
        },
    }
    RngState().on_load_checkpoint(None, None, other)  # type: ignore[arg-type]
    assert _draws() == expected
    RngState().on_load_checkpoint(None, None, {"global_step": 3})  # type: ignore[arg-type]  # no ablate state at all


# --- where checkpoints go, and resuming a single run from another machine's upload --------------


def test_checkpoints_follow_the_mlflow_store(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    beside = f"sqlite:///{root / 'mlflow.db'}"
    assert checkpoints.location(None, beside, root) == str(root / "checkpoints")  # one disk: beside the store
    for elsewhere in (f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}", "http://127.0.0.1:5000", "postgresql://db/x"):
        assert checkpoints.location(None, elsewhere, root) == checkpoints.MLFLOW  # another worker must find them
    assert checkpoints.location("s3://bucket/ckpt", beside, root) == "s3://bucket/ckpt"


def test_a_killed_run_resumes_on_another_machine_from_its_uploaded_checkpoint(
    tmp_path: Path, wiki_validation: Path, capsys
) -> None:
    cfg = build_config(tiny_base(tmp_path, wiki_validation, max_steps=12, val_every=4, measure=False))
    straight = train(cfg, RunContext(tracking_uri=f"sqlite:///{tmp_path / 'straight.db'}"))
    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"  # a store other workers see: checkpoints go to MLflow
    plan = checkpoints.run_place(checkpoints.location(None, uri, cfg.tracking.root), cfg.tracking.root, cfg)
    with pytest.raises(KeyboardInterrupt):
        train(
            cfg, RunContext(tracking_uri=uri, checkpoint=plan, callbacks=(InterruptAt(6),))
        )  # after the step-4 checkpoint
    client = MlflowClient(uri)
    (killed,) = client.search_runs([client.get_experiment_by_name("ablate").experiment_id])
    assert killed.info.status == "KILLED" and killed.data.tags[checkpoints.WHERE] == checkpoints.MLFLOW
    assert [a.path for a in client.list_artifacts(killed.info.run_id, "checkpoints")] == ["checkpoints/last.ckpt"]
    shutil.rmtree(Path(cfg.tracking.root) / "checkpoints")  # another machine: no local copy
    path = tmp_path / "run.yaml"
    path.write_text(to_yaml(cfg))
    capsys.readouterr()
    # a config that is not the run's is refused, naming the first key that differs
    assert main(["train", str(path), "optim.lr=0.5", "--resume", killed.info.run_id, "--tracking-uri", uri]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --resume {killed.info.run_id}: optim.lr: 0.5 here, 0.001 in the run to resume"
    )
    assert main(["train", "--resume", killed.info.run_id, "--tracking-uri", uri]) == 0
    assert f"resuming run {killed.info.run_id}" in capsys.readouterr().out
    # the same run goes on: one run, FINISHED, its curve continued from the step-4 checkpoint
    (resumed,) = client.search_runs([killed.info.experiment_id])
    assert resumed.info.run_id == killed.info.run_id
    assert resumed.info.status == "FINISHED" and resumed.data.tags[RESUMED].endswith("(step 4)")
    assert "ablate.fail_reason" not in resumed.data.tags
    assert resumed.data.metrics["val/loss"] == pytest.approx(straight.metrics["val/loss"], rel=1e-5, abs=1e-6)
    assert max(m.step for m in client.get_metric_history(resumed.info.run_id, "train/loss")) >= 10
    # a finished run has nothing to resume
    assert main(["train", "--resume", killed.info.run_id, "--tracking-uri", uri]) == 2
    assert "the run is FINISHED" in capsys.readouterr().err
    assert main(["train", "--resume", "0" * 32, "--tracking-uri", uri]) == 2
    assert capsys.readouterr().err.startswith(f"error: --resume {'0' * 32}: no such run")


def test_resuming_a_finished_training_still_logs_its_final_validation(tmp_path: Path, wiki_validation, capsys) -> None:
    """A retried trial whose pre-training had finished (a later stage failed) resumes from the last
    checkpoint and trains nothing: its run still carries the final validation, equal to the first's."""
    import yaml
    from mlflow.tracking import MlflowClient

    from ablate.cli import main
    from tests.sweeps.conftest import tiny_base

    base = tiny_base(tmp_path, wiki_validation, measure=False)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(base))
    assert main(["train", str(path)]) == 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (first,) = client.search_runs([client.get_experiment_by_name("ablate").experiment_id])
    capsys.readouterr()
    # a FINISHED run has nothing to resume; one whose training ended before it failed does
    assert main(["train", "--resume", first.info.run_id, "--tracking-uri", client.tracking_uri]) == 2
    assert "the run is FINISHED" in capsys.readouterr().err
    client.set_terminated(first.info.run_id, "FAILED")
    assert main(["train", "--resume", first.info.run_id, "--tracking-uri", client.tracking_uri]) == 0
    assert "resuming run" in capsys.readouterr().out
    runs = client.search_runs([first.info.experiment_id], order_by=["attributes.start_time DESC"])
    again = runs[0].data.metrics
    assert again["val/loss"] == pytest.approx(first.data.metrics["val/loss"], rel=1e-6)


def test_a_run_says_nothing_of_weights_only(tmp_path: Path, wiki_validation, capsys, caplog) -> None:
    """The phase checkpoint is saved whole, said so: Lightning's "`weights_only` was not set" note (printed
    for every run, fine-tune, trial and resume) no longer shows."""
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_base(tmp_path, wiki_validation, measure=False)))
    caplog.set_level(logging.INFO, logger="lightning.pytorch")  # the level the command's Lightning logs at
    assert main(["train", str(path)]) == 0
    assert "finished" in capsys.readouterr().out
    assert "weights_only" not in caplog.text


def test_a_cut_off_upload_is_refused_by_name_and_a_retry_starts_over(
    tmp_path: Path, wiki_validation: Path, capsys
) -> None:
    """A worker killed during a run's first upload of ``last.ckpt`` to a shared artifact folder leaves part
    of the file and none before it: ``ablate train --resume`` refuses in one line, before the run is touched;
    a retry's look for a checkpoint warns and finds none (the run starts over) rather than failing on the file."""
    cfg = build_config(tiny_base(tmp_path, wiki_validation, max_steps=12, val_every=4, measure=False))
    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"
    plan = checkpoints.run_place(checkpoints.location(None, uri, cfg.tracking.root), cfg.tracking.root, cfg)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, RunContext(tracking_uri=uri, checkpoint=plan, callbacks=(InterruptAt(6),)))
    client = MlflowClient(uri)
    (killed,) = client.search_runs([client.get_experiment_by_name("ablate").experiment_id])
    run_id = killed.info.run_id
    uploaded = Path(killed.info.artifact_uri.removeprefix("file://")) / "checkpoints" / checkpoints.LAST
    whole = uploaded.read_bytes()
    uploaded.write_bytes(whole[: len(whole) // 2])
    shutil.rmtree(Path(cfg.tracking.root) / "checkpoints")  # another machine: no local copy
    capsys.readouterr()
    assert main(["train", "--resume", run_id, "--tracking-uri", uri]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --resume {run_id}: run {run_id}'s checkpoints/last.ckpt is incomplete (its upload was cut off); "
        "start it again without --resume"
    )
    assert client.get_run(run_id).info.status == "KILLED"
    assert checkpoints.resume_path(plan.for_run(run_id), client, run_id) is None
    assert capsys.readouterr().err.strip() == (
        f"warning: run {run_id}'s checkpoints/last.ckpt is incomplete (its upload was cut off); not resumed from"
    )
    uploaded.write_bytes(whole)  # the whole file is taken
    got = checkpoints.resume_path(plan.for_run(run_id), client, run_id)
    assert got is not None and Path(got).read_bytes() == whole


def test_a_kill_while_uploading_leaves_the_upload_before_whole_and_resumed_from(
    tmp_path: Path, wiki_validation: Path, capsys
) -> None:
    """``last.ckpt`` is uploaded into two artifact folders in turn, each tagged once whole, the one before
    removed: a worker killed while it copies the third leaves part of a file where the first was, and
    ``ablate train --resume`` goes on from the second (step 8), saying nothing of the cut-off one."""
    cfg = build_config(tiny_base(tmp_path, wiki_validation, max_steps=12, val_every=4, measure=False))
    straight = train(cfg, RunContext(tracking_uri=f"sqlite:///{tmp_path / 'straight.db'}"))
    uri = f"sqlite:///{tmp_path / 'shared' / 'mlflow.db'}"
    plan = checkpoints.run_place(checkpoints.location(None, uri, cfg.tracking.root), cfg.tracking.root, cfg)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, RunContext(tracking_uri=uri, checkpoint=plan, callbacks=(InterruptAt(10),)))  # after step 8's
    client = MlflowClient(uri)
    (killed,) = client.search_runs([client.get_experiment_by_name("ablate").experiment_id])
    run_id, folder = killed.info.run_id, Path(killed.info.artifact_uri.removeprefix("file://"))
    assert killed.data.tags[checkpoints.UPLOADED] == "checkpoints/spare/last.ckpt"  # the second upload
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob(checkpoints.LAST)) == ["checkpoints/spare/last.ckpt"]
    second = (folder / "checkpoints" / "spare" / checkpoints.LAST).read_bytes()
    (folder / "checkpoints" / checkpoints.LAST).write_bytes(second[: len(second) // 3])  # the third, cut off
    shutil.rmtree(Path(cfg.tracking.root) / "checkpoints")  # another machine: no local copy
    capsys.readouterr()
    assert main(["train", "--resume", run_id, "--tracking-uri", uri]) == 0
    assert "incomplete" not in capsys.readouterr().err
    resumed = client.get_run(run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.tags[RESUMED].endswith("(step 8)")
    assert resumed.data.metrics["val/loss"] == pytest.approx(straight.metrics["val/loss"], rel=1e-5, abs=1e-6)
    # the resumed run's uploads took the cut-off one's folder in turn; the one tagged, step 12's, is all that is
    # left (Lightning 2.4 also saves and uploads step 8 again as it resumes: one upload more, the same end)
    tagged = resumed.data.tags[checkpoints.UPLOADED]
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob(checkpoints.LAST)) == [tagged]
    assert torch.load(folder / tagged, map_location="cpu", weights_only=False)["global_step"] == 12


def test_a_cut_off_phase_end_is_not_resumed_from(tmp_path: Path, capsys) -> None:
    """A phase's end (``phase-<i>.ckpt``, uploaded once) cut off by a kill is said and skipped, as ``last.ckpt`` is
    (what ``ablate train --resume`` of a mirrored run looks for its phases' ends with, ``PhaseStore._find``:
    before, its IncompleteCheckpoint ended the resumed run in a traceback)."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e", str(tmp_path / "artifacts"))).info.run_id
    whole = tmp_path / "made" / "phase-0.ckpt"
    whole.parent.mkdir()
    torch.save({"global_step": 5}, whole)
    cut = tmp_path / "cut" / "phase-0.ckpt"
    cut.parent.mkdir()
    cut.write_bytes(whole.read_bytes()[:100])
    client.log_artifact(run_id, str(cut), checkpoints.ARTIFACTS)
    assert checkpoints.download_whole(client, run_id, str(tmp_path / "here"), "phase-0.ckpt") is None
    said = f"warning: run {run_id}'s checkpoints/phase-0.ckpt is incomplete (its upload was cut off); not resumed from"
    assert capsys.readouterr().err.strip() == said
    client.log_artifact(run_id, str(whole), checkpoints.ARTIFACTS)
    got = checkpoints.download_whole(client, run_id, str(tmp_path / "here"), "phase-0.ckpt")
    assert got is not None and torch.load(got)["global_step"] == 5
    assert checkpoints.download_whole(client, run_id, str(tmp_path / "here"), "phase-1.ckpt") is None  # none
