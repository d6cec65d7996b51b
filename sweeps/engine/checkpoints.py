"""Checkpoints inside a run, so that a killed trial (or ``ablate train``) resumes where it was: where they
go (:func:`location`, :class:`CheckpointPlace`: a folder, an fsspec URL or the run's MLflow artifacts), the
callbacks that keep ``last.ckpt`` and ``best.ckpt`` (:func:`callbacks`, :class:`RngState`) and what a retry or
``ablate train --resume`` starts from (:func:`resume_path`, :func:`resume_run`). How resume works:
docs/many-machines.md ("Workers that die") and docs/development.md ("How a run is executed")."""

from __future__ import annotations

import random
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import fsspec
import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

from ablate.lightning_modules.config.experiment import ExperimentConfig, config_digest
from ablate.sweeps.engine.ckpt_files import FileWriter, local_path, same_file

LAST = "last.ckpt"
MLFLOW = "mlflow"
"""The location that keeps ``last.ckpt`` as an artifact of the run."""
ARTIFACTS = "checkpoints"
SPARE = f"{ARTIFACTS}/spare"  # the other artifact folder a run's ``last.ckpt`` is uploaded to, in turn
UPLOADED = "ablate.checkpoint_uploaded"  # on a mirrored run: the artifact path of its newest whole last.ckpt
CONFIG = "ablate.config_sha256"  # on a checkpointing run: its resolved config's digest
WHERE = "ablate.checkpoints"  # on a checkpointing run: its checkpoint folder (or URL)


class RngState(Callback):
    """Save and restore the Python, NumPy, torch CPU and CUDA generators with each checkpoint
    (dropout; on a GPU dropout draws from the CUDA generator); on restore, also tell
    ``on_resume`` the checkpoint's step. A checkpoint's CUDA state is restored when this process
    has as many CUDA devices as the one that wrote it (else the CUDA generators start afresh)."""

    def __init__(self, on_resume: Callable[[int], None] | None = None) -> None:
        self.on_resume = on_resume

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        kind, keys, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
        checkpoint["ablate_rng"] = {
            "python": random.getstate(),
            "torch": torch.get_rng_state(),  # weights_only-safe
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
            # torch leaves torch.cuda.is_initialized unannotated
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],  # type: ignore[no-untyped-call]
        }

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.on_resume is not None:
            self.on_resume(int(checkpoint["global_step"]))
        restore_rng(checkpoint)


def restore_rng(checkpoint: dict[str, Any]) -> None:
    """Set the generators to the state :class:`RngState` saved in ``checkpoint`` (none saved: left as they are)."""
    state = checkpoint.get("ablate_rng")
    if state is not None:
        random.setstate(state["python"])
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch"])
        cuda = state.get("cuda") or []
        if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def location(setting: str | None, uri: str, root: str | Path) -> str:
    """Where checkpoints go: ``setting`` (``mlflow``, a folder or an fsspec URL) when given; else
    ``<root>/checkpoints`` when ``uri`` is the embedded SQLite store under ``root`` (both on this
    disk), and ``mlflow`` for any other store, so that a worker elsewhere finds them."""
    if setting:
        return setting
    if uri.startswith("sqlite:///") and Path(uri.removeprefix("sqlite:///")).resolve().parent == Path(root).resolve():
        return str(Path(root) / "checkpoints")
    return MLFLOW


@dataclass(frozen=True)
class CheckpointPlace:
    """Where one run writes its checkpoints.

    Attributes:
        folder: Lightning's folder: a local path or an fsspec URL (a local cache for ``mlflow``).
        mirror: also upload ``last.ckpt`` as the run's artifact ``checkpoints/last.ckpt``.
        digest: the run's config digest; an earlier attempt at the same config has the same.
    """

    folder: str
    mirror: bool
    digest: str
    per_run: bool = False

    def for_run(self, run_id: str) -> CheckpointPlace:
        """The plan of run ``run_id``: its own sub-folder when ``per_run`` (a single ``ablate train``)."""
        return CheckpointPlace(f"{self.folder}/{run_id}", self.mirror, self.digest) if self.per_run else self

    @classmethod
    def at(
        cls, where: str, root: str | Path, cfg: ExperimentConfig, *parts: str, per_run: bool = False
    ) -> CheckpointPlace:
        """The place at location ``where`` (see :func:`location`), in the sub-folder ``parts``."""
        if where == MLFLOW:
            return cls(str(Path(root, "checkpoints", *parts).resolve()), True, config_digest(cfg), per_run)
        return cls("/".join([where.rstrip("/"), *parts]), False, config_digest(cfg), per_run)


def trial_place(where: str, root: str | Path, study: str, cfg: ExperimentConfig) -> CheckpointPlace:
    """A study trial's checkpoints: one folder per resolved config, shared by its retries."""
    return CheckpointPlace.at(where, root, cfg, study, config_digest(cfg)[:16])


def run_place(where: str, root: str | Path, cfg: ExperimentConfig) -> CheckpointPlace:
    """A single run's checkpoints (``ablate train``): a folder of its own, ``runs/<run id>``."""
    return CheckpointPlace.at(where, root, cfg, "runs", per_run=True)


class KeptCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, with a ``last.ckpt`` that holds the state ``best.ckpt`` was just written
    with at the same step kept as a hard link to it (a copy where links cannot be made) rather than
    serialized a second time (the two differ only in the name of the last checkpoint this callback
    records); each ``last.ckpt`` it keeps handed to ``upload`` when given (a run whose checkpoints are
    MLflow artifacts). Both wait in :class:`FileWriter`'s queue for the file they need."""

    def __init__(self, upload: Callable[[str], None] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.upload = upload

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        io, upload = trainer.strategy.checkpoint_io, self.upload
        last = Path(filepath).name == LAST
        again = last and self._last_global_step_saved == trainer.global_step and self._last_checkpoint_saved
        source, target = (local_path(self._last_checkpoint_saved), local_path(filepath)) if again else (None, None)
        if isinstance(io, FileWriter) and source is not None and target is not None:
            if trainer.is_global_zero:
                io.then(lambda: same_file(source, target))
            self._last_checkpoint_saved = filepath
        else:
            super()._save_checkpoint(trainer, filepath)
        if upload is not None and trainer.is_global_zero and last:
            if isinstance(io, FileWriter):
                io.then(lambda: upload(filepath))
            else:
                upload(filepath)


def callbacks(
    plan: CheckpointPlace,
    client: MlflowClient,
    run_id: str,
    on_resume: Callable[[int], None] | None = None,
    *,
    monitor: str | None = "val/loss",
) -> list[Callback]:
    """Keep ``last.ckpt`` (and ``best.ckpt``, lowest ``monitor``; None: no best, the module keeps its own)
    in ``plan.folder``, written at each validation (and ``last.ckpt`` uploaded to run ``run_id`` when
    ``plan.mirror``); ``on_resume(step)`` is called when a fit restores one. Tags the run with the plan's
    folder and config digest."""
    client.set_tag(run_id, CONFIG, plan.digest)
    client.set_tag(run_id, WHERE, MLFLOW if plan.mirror else plan.folder)
    # without a monitor, the one checkpoint kept is the latest, written as last.ckpt itself: Lightning
    # writes its save_last copy only beside a checkpoint it saved (none with save_top_k=0)
    kwargs: dict[str, Any] = dict(
        dirpath=plan.folder,
        filename="best" if monitor is not None else LAST.removesuffix(".ckpt"),
        monitor=monitor,
        mode="min",
        save_top_k=1,
        save_last=monitor is not None,
        enable_version_counter=False,
    )
    upload = (lambda path: upload_last(client, run_id, path)) if plan.mirror else None
    return [KeptCheckpoint(upload, **kwargs), RngState(on_resume)]


def upload_last(client: MlflowClient, run_id: str, path: str) -> None:
    """Upload ``path`` (a ``last.ckpt``) as run ``run_id``'s artifact, into the folder that does not hold its
    newest whole upload, then tag it (:data:`UPLOADED`) and remove the one before: a worker killed while it
    uploads (a plain copy into a folder store) leaves the previous upload whole and named."""
    run = client.get_run(run_id)
    before = run.data.tags.get(UPLOADED)  # None: its first upload
    folder = SPARE if before == f"{ARTIFACTS}/{LAST}" else ARTIFACTS
    client.log_artifact(run_id, path, folder)
    client.set_tag(run_id, UPLOADED, f"{folder}/{LAST}")
    if before is None:
        return
    try:  # a store that cannot remove an artifact keeps both (two checkpoints' size)
        repository = get_artifact_repository(run.info.artifact_uri, client.tracking_uri)
        repository.delete_artifacts(before)  # type: ignore[no-untyped-call]  # untyped in MLflow
    except (MlflowException, OSError, NotImplementedError):
        pass


def newest_upload(client: MlflowClient, run_id: str) -> str:
    """The artifact path of run ``run_id``'s newest whole ``last.ckpt`` (``checkpoints/last.ckpt`` for a run
    that has none yet, or uploaded before :func:`upload_last` alternated)."""
    return client.get_run(run_id).data.tags.get(UPLOADED, f"{ARTIFACTS}/{LAST}")


def exists(path: str) -> bool:
    """Whether ``path`` (a local path or an fsspec URL) exists."""
    fs, inner = fsspec.core.url_to_fs(path)
    return bool(fs.exists(inner))


class IncompleteCheckpoint(Exception):
    """An uploaded checkpoint that is not whole: its upload was cut off (the process killed mid-copy)."""


def download(client: MlflowClient, run_id: str, folder: str, name: str = LAST) -> str | None:
    """The artifact ``checkpoints/<name>`` of ``run_id`` (for ``last.ckpt``: its newest whole upload),
    downloaded into ``folder`` as ``name``; None if it has none.

    Raises:
        IncompleteCheckpoint: the artifact is cut off. A folder or object store's upload is a plain copy,
            so a worker killed while uploading leaves part of a file; ``torch.save`` writes a zip archive,
            whose directory comes last."""
    from ablate.sweeps.engine import tracking

    Path(folder).mkdir(parents=True, exist_ok=True)
    try:
        artifact = newest_upload(client, run_id) if name == LAST else f"{ARTIFACTS}/{name}"
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp, tracking.quiet_downloads():
            got = Path(client.download_artifacts(run_id, artifact, tmp))
            if not zipfile.is_zipfile(got):
                raise IncompleteCheckpoint(f"run {run_id}'s {artifact} is incomplete (its upload was cut off)")
            return str(got.replace(Path(folder) / name))
    except (MlflowException, OSError):
        return None


def resume_path(plan: CheckpointPlace | None, client: MlflowClient, run_id: str, name: str = LAST) -> str | None:
    """``name`` (``last.ckpt``, a phase's end) that an earlier attempt at this run's config left: in
    ``plan.folder``, else (with ``plan.mirror``) the newest one uploaded by a run of the experiment with
    the same config (the run itself, when it goes on from its own stopped attempt)."""
    if plan is None:
        return None
    last = f"{plan.folder}/{name}"
    if exists(last):
        return last
    if not plan.mirror:
        return None
    exp = client.get_run(run_id).info.experiment_id
    for run in client.search_runs(
        [exp], filter_string=f"tags.`{CONFIG}` = '{plan.digest}'", order_by=["attributes.start_time DESC"]
    ):
        got = download_whole(client, run.info.run_id, plan.folder, name)  # its own, when it goes on
        if got is not None:
            return got
    return None


def download_whole(client: MlflowClient, run_id: str, folder: str, name: str = LAST) -> str | None:
    """:func:`download`, saying ``warning: ...; not resumed from`` of a cut-off upload and returning None
    (what a resume looks for next: an older attempt's, an earlier phase's, or none: it starts over)."""
    try:
        return download(client, run_id, folder, name)
    except IncompleteCheckpoint as cut:
        print(f"warning: {cut}; not resumed from", file=sys.stderr, flush=True)
        return None


def resumable(client: MlflowClient, run_id: str) -> bool:
    """Whether run ``run_id`` left a ``last.ckpt`` that ``ablate train --resume`` can start from."""
    where = client.get_run(run_id).data.tags.get(WHERE)
    if where is None:
        return False
    if where != MLFLOW:
        return exists(f"{where}/{LAST}")
    artifact = newest_upload(client, run_id)
    return any(a.path == artifact for a in client.list_artifacts(run_id, artifact.rsplit("/", 1)[0]))


def run_checkpoint(client: MlflowClient, run_id: str, folder: str) -> str | None:
    """``last.ckpt`` of the earlier run ``run_id`` (``ablate train --resume``): in the folder it
    was tagged with, or its uploaded artifact (downloaded into ``folder``)."""
    where = client.get_run(run_id).data.tags.get(WHERE)
    if where is None:
        return None
    if where != MLFLOW and exists(f"{where}/{LAST}"):
        return f"{where}/{LAST}"
    return download(client, run_id, folder)


def stopped_runs(uri: str) -> list[str]:
    """The runs of ``ablate train`` in store ``uri`` that a ``--resume`` can continue, newest first: KILLED,
    FAILED or still RUNNING (killed without a word), each as ``RUN_ID (name, phase P)``."""
    from ablate.sweeps.engine import tracking

    client = tracking.existing(uri, "--resume")
    found = []
    for exp in client.search_experiments():
        runs = client.search_runs(
            [exp.experiment_id],
            filter_string=f"attributes.status != 'FINISHED' and tags.`{tracking.ROLE}` = 'run'",
            order_by=["attributes.start_time DESC"],
            max_results=20,
        )
        found += [
            (
                r.info.start_time,
                f"{r.info.run_id} ({r.info.run_name}, {r.info.status}, phase {r.data.tags.get(tracking.PHASE, '-')})",
            )
            for r in runs
            if WHERE in r.data.tags
        ]
    return [line for _, line in sorted(found, reverse=True)]


def resume_run(uri: str, run_id: str, cfg: ExperimentConfig | None) -> tuple[ExperimentConfig, str]:
    """What ``ablate train --resume RUN_ID`` continues: the run's config (``cfg`` must equal it when
    given) and its ``last.ckpt``.

    Raises:
        ConfigError: no such run, it kept no checkpoint, or ``cfg`` differs from its config.
    """
    from ablate.lightning_modules.config.errors import ConfigError
    from ablate.lightning_modules.config.experiment import flatten
    from ablate.lightning_modules.config.load import build_config
    from ablate.sweeps.engine import tracking

    client = tracking.existing(uri, f"--resume {run_id}")
    try:
        run = client.get_run(run_id)
        if run.info.status == "FINISHED":  # a killed run is RUNNING (SIGKILL) or KILLED; a failed one FAILED
            raise ConfigError(f"--resume {run_id}: the run is FINISHED; there is nothing to resume")
        with tempfile.TemporaryDirectory(prefix="ablate-resume-") as tmp, tracking.quiet_downloads():
            text = Path(client.download_artifacts(run_id, "config.yaml", tmp)).read_text(encoding="utf-8")
    except MlflowException:
        raise ConfigError(f"--resume {run_id}: no such run (with a config.yaml) in {tracking.redact(uri)}") from None
    from ablate.lightning_modules.config.yamlio import load_yaml

    theirs = build_config(load_yaml(text))
    if cfg is not None and config_digest(cfg) != config_digest(theirs):
        mine, old = flatten(cfg), flatten(theirs)
        key = next(k for k in mine if mine[k] != old.get(k))
        raise ConfigError(f"--resume {run_id}: {key}: {mine[key]!r} here, {old.get(key)!r} in the run to resume")
    root = Path(theirs.tracking.root, "checkpoints", "runs", run_id)
    try:
        last = run_checkpoint(client, run_id, str(root)) if WHERE in run.data.tags else None
    except IncompleteCheckpoint as cut:
        raise ConfigError(f"--resume {run_id}: {cut}; start it again without --resume") from None
    if last is None:
        raise ConfigError(
            f"--resume {run_id}: the run kept no checkpoint (it was stopped before its first validation, or "
            "predates checkpoints); start it again without --resume"
        )
    return theirs, last
