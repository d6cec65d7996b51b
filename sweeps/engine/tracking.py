"""MLflow plumbing: where runs go, how runs start and end, what every run records.

Default store: SQLite plus local artifacts under ``<cwd>/<tracking.root>/``; a tracking
server (``http://host:port``) or any MLflow URI via ``--tracking-uri`` or
``MLFLOW_TRACKING_URI``. Every run ends FINISHED, FAILED or KILLED, never RUNNING.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from ablate.datamodules.provenance import data_tags
from ablate.lightning_modules.config.errors import AblateError, StorageError, require_driver
from ablate.lightning_modules.config.experiment import ExperimentConfig, run_params, to_yaml

ROLE, STUDY, TRIAL, STATE = "ablate.role", "ablate.study", "ablate.trial", "ablate.state"
SOURCE = "ablate.source_run"  # on a pruning run: the pruned model's run id or folder
TEACHER = "ablate.teacher_run"  # on a distilled run (a teacher study's parent too): the teacher's run id or folder
STUDY_MODEL = "ablate.study_model_run"  # on a study's parent and trials: its teacher, prune_source or reference
PARENT = "mlflow.parentRunId"
FAIL_REASON = "ablate.fail_reason"  # on a failed trial (Optuna user attr) and its MLflow run (tag)
WORKER = "ablate.worker"  # on a trial run: host:pid of the process that ran it
PHASE = "ablate.phase"  # on a run: the phase it began last (fine-tuning, exits, QAT ...)
STAGE = "ablate.stage"  # on a chained trial's runs: trial, pretrain, finetune:<task>
RESUMED = "ablate.resumed_from"  # on a run that went on from a checkpoint: the checkpoint and its step

# the user's choice, read before MLflow's own set_tracking_uri (called by Lightning's logger)
# writes the variable into this process's environment
USER_TRACKING_URI = os.environ.get("MLFLOW_TRACKING_URI")
QUIET_LOGGERS = ("alembic", "mlflow.store.db.utils", "mlflow.tracking.fluent")
"""Loggers whose INFO lines (database migrations, the tracking URI) the ablate command hides."""
MLFLOW_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    "MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS": "1",
}
"""MLflow settings the ablate command makes unless the user set them: an unreachable tracking server
fails in seconds, not after MLflow's default minutes of retries; and the background logging of a
run's training metrics sends them once a second, so that ending a fit or a run does not wait for its
idle poll (without buffering, MLflow's logging thread waits up to a second for a metric that never
comes each time a run's logging is flushed or ended: about 0.5 s per fit and per run)."""


COMPILE_CACHE = Path("cache") / "inductor"
"""Where, under the tracking root, ``torch.compile`` keeps its compiled graphs (:func:`compile_cache`)."""


def compile_cache(root: str) -> None:
    """Keep PyTorch's compile caches (inductor's FX graph cache and the AOTAutograd cache, both on by
    default in torch >= 2.6) under ``<root>/cache/inductor`` (``TORCHINDUCTOR_CACHE_DIR``) instead of
    ``/tmp/torchinductor_<user>``: every trial and worker of a study that share the tracking root, and a
    later invocation, load a graph compiled once rather than compile it again. Called before a run
    compiles; the first root of a process holds for the rest of it, and a ``TORCHINDUCTOR_CACHE_DIR``
    the user set is kept."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str((Path(root) / COMPILE_CACHE).resolve()))


@contextmanager
def quiet_downloads() -> Iterator[None]:
    """No MLflow download progress bars (small files, or downloads under a progress bar of our own)."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    old = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def experiment_name(experiment: str | None) -> str:
    """The MLflow experiment of a run: ``tracking.experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else ``ablate``."""
    return experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "ablate"


def log_profile(client: MlflowClient, run_id: str, folder: Path) -> None:
    """Log the profiler's reports in ``folder`` as the run's ``profiler/`` artifacts; a later fit of
    the same run (a pruning phase) goes to ``profiler/fit-2/``, ``profiler/fit-3/`` ..."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    taken = {a.path for a in client.list_artifacts(run_id, "profiler")}
    path, n = "profiler", 2
    while taken and (path := f"profiler/fit-{n}") in taken:
        n += 1
    client.log_artifacts(run_id, str(folder), path)


def resolve_tracking_uri(uri: str | None, root: str | Path) -> str:
    """The explicit URI, else ``MLFLOW_TRACKING_URI``, else the embedded SQLite store."""
    uri = uri or USER_TRACKING_URI
    if uri:
        return uri
    folder = Path(root).resolve()
    return f"sqlite:///{folder / 'mlflow.db'}"


def artifact_root(uri: str) -> str | None:
    """Local artifact folder for an embedded SQLite store; None lets a server decide."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    return None


@contextmanager
def scoped_tracking_uri() -> Iterator[None]:
    """Undo MLflow's process-wide tracking URI (and environment variable) set inside the block,
    so that one run's store never leaks into the next run or a child process."""
    import mlflow

    before = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)  # type: ignore[arg-type]  # None: back to MLflow's default (stubs say str)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)


def sqlite_wal(uri: str) -> None:
    """Put a SQLite store in WAL mode (persistent in the file), so that readers such as the
    MLflow UI or a second worker never make a running sweep fail with 'database is locked'."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(path, timeout=30) as db:
            db.execute("PRAGMA journal_mode=WAL")
    except (OSError, sqlite3.Error) as exc:
        raise StorageError(f"{uri}: cannot open the SQLite store ({exc})") from None


def new_sqlite_store(uri: str) -> None:
    """Where ``uri`` names a SQLite file that does not exist yet, copy an empty store at this MLflow's schema
    there (:func:`empty_store`): MLflow builds a new store by running every schema migration, 1.5-2.5 s on a
    CPU, paid once per machine instead of once per store. Never over a store another process made meanwhile;
    where the empty store cannot be made, MLflow builds the store itself, as before."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///"))
    if path.exists():
        return
    template = empty_store()
    if template is None:
        return
    copy = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, copy)
        with suppress(FileExistsError):
            os.link(copy, path)  # fails where the store exists: a second worker starting the same study
    except OSError:
        return  # MLflow makes it, or says why it cannot
    finally:
        with suppress(OSError):  # not there, or its folder could not be made
            copy.unlink(missing_ok=True)


@cache
def empty_store() -> Path | None:
    """An empty MLflow store (its tables at the installed MLflow's schema, no experiment), made once per
    machine and MLflow version in ablate's cache folder (``$ABLATE_CACHE``, else ``~/.cache/ablate``); None
    where it cannot be made."""
    import mlflow
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables  # what MLflow runs on a new database

    from ablate.datamodules.tokenizer import default_cache_root  # imported when a store is made

    folder = default_cache_root()
    path = folder / f"mlflow-{mlflow.__version__}-empty.db"
    if path.is_file():
        return path
    made = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        engine = sqlalchemy.create_engine(f"sqlite:///{made}")
        try:
            _initialize_tables(engine)  # type: ignore[no-untyped-call]  # MLflow leaves it unannotated
        finally:
            engine.dispose()
        os.replace(made, path)  # whole or not at all; two processes write the same tables
    except Exception:  # noqa: BLE001 - any failure: MLflow makes each store itself, as without this
        with suppress(OSError):
            made.unlink(missing_ok=True)
        return None
    return path


def connect(uri: str) -> MlflowClient:
    """A client for ``uri``, checked to be reachable (StorageError naming the URI if not); a new SQLite store
    starts as a copy of an empty one (:func:`new_sqlite_store`)."""
    new_sqlite_store(uri)
    sqlite_wal(uri)
    return _reachable(uri, "--tracking-uri", f"{uri}: cannot reach")


def existing(uri: str, key: str = "--tracking-uri") -> MlflowClient:
    """A client for a store a command only reads (``report``, ``export``, ``train --resume``): an
    embedded SQLite store must exist already (it is not created, nor switched to WAL), a database
    or server must be reachable; a StorageError naming ``key`` and the store if not."""
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise StorageError(f"{key}: {path}: no MLflow store there (no runs have been recorded at that place)")
    return _reachable(uri, key, f"{redact(uri)}: cannot read")


def _reachable(uri: str, key: str, failed: str) -> MlflowClient:
    """A client for ``uri`` that answered one query; a StorageError ``{key} {failed} the MLflow store`` if not."""
    try:
        check_database(uri)
    except StorageError as exc:
        raise StorageError(f"{key} {exc}") from None
    try:
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - every backend raises its own type
        raise StorageError(f"{key} {failed} the MLflow store ({type(exc).__name__})") from None
    return client


#: The experiment tag MLflow 3 reads for what an experiment holds, and the value for model training
#: (``ExperimentKind.CUSTOM_MODEL_DEVELOPMENT`` of MLflow's UI; ``genai_development`` is the other kind).
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"


def experiment_id(client: MlflowClient, name: str, uri: str) -> str:
    """Id of the experiment ``name``, created (with local artifacts for SQLite) if missing, and tagged
    a model-training experiment (:data:`EXPERIMENT_KIND`); one created before it was, or by hand
    without a kind, gets the tag (a kind someone set is kept)."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(
                name, artifact_location=artifact_root(uri), tags={EXPERIMENT_KIND: MODEL_TRAINING}
            )
        except MlflowException:  # another worker created it meanwhile
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if EXPERIMENT_KIND not in found.tags:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
    return found.experiment_id


def start_run(client: MlflowClient, exp_id: str, name: str, tags: dict[str, str], parent_id: str | None = None) -> str:
    """Create a RUNNING run (nested under ``parent_id`` if given) and return its id."""
    tags = dict(tags)
    if parent_id:
        tags[PARENT] = parent_id
    run_id: str = client.create_run(exp_id, run_name=name, tags=tags).info.run_id
    return run_id


def set_tags_once(client: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
    """Set the ``tags`` that ``run_id`` lacks or holds with another value. Workers starting together set the
    same tags on one run, and MLflow's SQL store refuses a tag another worker inserted between its look and
    its write (a unique-key violation): a tag found set to the same value afterwards is not an error."""
    held = client.get_run(run_id).data.tags
    for key, value in ((k, v) for k, v in tags.items() if held.get(k) != v):
        try:
            client.set_tag(run_id, key, value)
        except MlflowException:
            if client.get_run(run_id).data.tags.get(key) != value:
                raise


def clear_fail_reason(client: MlflowClient, run_id: str) -> None:
    """Remove the reason a stop gave ``run_id`` (``ablate.fail_reason``), which no longer holds; none: nothing."""
    with suppress(MlflowException):  # none, or another worker removed it a moment ago
        client.delete_tag(run_id, FAIL_REASON)


def reopen_run(client: MlflowClient, run_id: str, tags: dict[str, str]) -> str:
    """Make the ended run ``run_id`` RUNNING again, to go on where it stopped: its fail reason goes,
    ``tags`` are set (the new attempt's trial number, worker ...). Returns ``run_id``."""
    client.update_run(run_id, status="RUNNING")
    clear_fail_reason(client, run_id)
    if tags:
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    return run_id


def end_run(client: MlflowClient, run_id: str, status: str) -> None:
    """Mark a run FINISHED / FAILED / KILLED, whatever state it was left in."""
    client.set_terminated(run_id, status)


def end_killed(client: MlflowClient, run_id: str, reason: str = "worker died (heartbeat stale); retried") -> None:
    """End a run whose process died KILLED, saying so in its ``ablate.fail_reason`` tag (unless another
    worker, ending it at the same moment, gave its own reason)."""
    try:
        set_tags_once(client, run_id, {FAIL_REASON: reason})
    except MlflowException:
        if FAIL_REASON not in client.get_run(run_id).data.tags:
            raise
    end_run(client, run_id, "KILLED")


def worker_id() -> str:
    """``host:pid`` of this process, to tell the workers of a study apart."""
    return f"{socket.gethostname()}:{os.getpid()}"


@cache
def package_tags() -> dict[str, str]:
    """Version of ablate and the git commit of its source tree (when it is a checkout), read once per
    process: the code a process runs is the code it imported (two ``git`` calls saved per later run)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        tags = {"ablate.version": version("ablate")}
    except PackageNotFoundError:
        tags = {"ablate.version": "unknown"}
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        tags["ablate.git_commit"] = commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return tags


def log_run_inputs(
    client: MlflowClient, run_id: str, cfg: ExperimentConfig, counts: dict[str, float], tokenizer_path: Path | None
) -> None:
    """Params (the resolved fields the run uses), config YAML, tokenizer, parameter counts, tags."""
    params = [Param(k, str(v)) for k, v in run_params(cfg).items()]
    metrics = [Metric(k, float(v), 0, 0) for k, v in counts.items()]
    tags = [RunTag(k, v) for k, v in dict(package_tags()).items()]
    tags.append(RunTag("ablate.num_workers", str(cfg.data.workers(cfg.trainer.devices))))  # what `auto` became
    tags += [RunTag(k, v) for k, v in data_tags(cfg).items()]  # the files or hub dataset each data name is
    # one request where MLflow's limits allow (100 params, 1000 metrics, 1000 entries in all)
    first = params[:100] if len(metrics) + len(tags) + min(len(params), 100) <= 1000 else []
    client.log_batch(run_id, params=first, metrics=metrics, tags=tags)
    for i in range(len(first), len(params), 100):
        client.log_batch(run_id, params=params[i : i + 100])
    client.log_text(run_id, to_yaml(cfg), "config.yaml")
    if tokenizer_path is not None:
        client.log_artifact(run_id, str(tokenizer_path), "tokenizer")


def find_parent(client: MlflowClient, exp_id: str, study: str) -> str | None:
    """The study's parent run, if an earlier invocation created one."""
    runs = client.search_runs(
        [exp_id], filter_string=f"tags.`{ROLE}` = 'study' and tags.`{STUDY}` = '{study}'", max_results=1
    )
    return runs[0].info.run_id if runs else None


def stale_running(client: MlflowClient, exp_id: str, study: str) -> list[Run]:
    """Trial runs of ``study`` left RUNNING by a process that died without cleaning up."""
    return client.search_runs(
        [exp_id],
        filter_string=(f"tags.`{STUDY}` = '{study}' and tags.`{ROLE}` = 'trial' and attributes.status = 'RUNNING'"),
    )


def check_database(uri: str, timeout_s: int = 10) -> None:
    """Refuse an unreachable database URI (``postgresql://``, ``mysql://``, ``mssql://``) at once.

    MLflow's SQL store retries a refused connection for minutes before giving up; one
    connection attempt with a timeout says the same in seconds.
    """
    scheme = uri.split(":", 1)[0].split("+", 1)[0]
    if scheme not in ("postgresql", "mysql", "mssql"):
        return
    require_driver(uri)  # postgresql:// without psycopg: one line naming the extra
    import sqlalchemy

    args = {"connect_timeout": timeout_s} if scheme in ("postgresql", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=args)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - driver errors vary
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise StorageError(f"{redact(uri)}: cannot reach the database ({first})") from None


def redact(url: str) -> str:
    """A database URL with its password masked (``postgresql://ablate:***@host/db``), for output and tags."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a database URL
        return url


def fail_reason(exc: BaseException) -> str:
    """Why a run failed, on one line for its ``ablate.fail_reason`` tag: a user error's message, else
    the exception's type and first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = "; ".join(lines) if isinstance(exc, AblateError) else f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text[:MAX_TAG_VAL_LENGTH]
