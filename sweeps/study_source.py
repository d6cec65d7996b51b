"""A study that fine-tunes one existing model (its ``source:``): the model read, and checked to be a
finished pre-trained model, before the study writes anything; its architecture is each trial's."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from ablate.datamodules.catalog import resolve_model
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.interop.pretrained import load_pretrained
from ablate.sweeps.engine.weights import RUNS, load_run_weights
from ablate.sweeps.spec import StudySpec

KEY = "source"


def source_model(spec: StudySpec, client: MlflowClient, uri: str) -> ModelConfig | None:
    """The architecture of the model a study with ``source:`` fine-tunes (None: the study pre-trains
    its own). A ``runs:/RUN_ID`` must be a FINISHED pre-training run of the store ``uri`` that saved
    its weights; else a folder, a data catalog model or a cached hub model (:func:`resolve_model`).

    Raises:
        ConfigError: naming ``source`` and what is wrong with it.
    """
    source = spec.source
    if source is None:
        return None
    try:
        if not source.startswith(RUNS):
            return load_pretrained(resolve_model(source, KEY))[0]
        run_id = source.removeprefix(RUNS).strip("/")
        try:
            status = client.get_run(run_id).info.status
        except MlflowException:
            raise ConfigError(f"no such run in {uri}") from None
        if status != "FINISHED":
            raise ConfigError(f"the run is {status}, not FINISHED")
        return load_run_weights(uri, run_id)[0].model
    except ConfigError as exc:
        raise ConfigError(f"{KEY}: {source}: {exc}") from None


def check_store(spec: StudySpec, uri: str) -> None:
    """A model given as ``runs:/RUN_ID`` (the study's ``source``, its study model's ``.source``) needs
    the store ``uri`` to exist: an embedded SQLite file not there yet is refused before it is created."""
    model = spec.study_model
    given = [(KEY, spec.source), *([(f"{model.SECTION}.source", model.source)] if model is not None else [])]
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///"))
    for key, source in given:
        if source is not None and source.startswith(RUNS) and not path.is_file():
            raise ConfigError(f"{key}: {source}: no such run: no MLflow store at {path} yet")
