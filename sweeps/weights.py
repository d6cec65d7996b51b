"""Trained weights as MLflow run artifacts: ``model/model.safetensors`` + ``model/config.yaml``.

The folder is an ablate checkpoint as :func:`lightning_modules.interop.load_pretrained` reads
it, so ``ablate export`` and ``init_from`` (on a downloaded copy) both start from it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from torch import nn

from lightning_modules.config import ExperimentConfig, load_config, to_yaml
from lightning_modules.errors import ConfigError, StorageError
from lightning_modules.heads import PretrainingModel
from lightning_modules.interop import WEIGHTS, load_pretrained, state_dict

ARTIFACT = "model"


def log_weights(client: MlflowClient, run_id: str, module_model: nn.Module, cfg: ExperimentConfig) -> None:
    """Log ``module_model``'s weights (safetensors, CPU) and ``cfg`` as the run's ``model/`` artifacts."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / ARTIFACT
        folder.mkdir()
        save_file(state_dict(module_model), str(folder / WEIGHTS), metadata={"format": "pt"})
        (folder / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
        client.log_artifacts(run_id, str(folder), ARTIFACT)


def load_run_weights(uri: str, run_id: str) -> tuple[ExperimentConfig, PretrainingModel]:
    """The config and trained model saved by :func:`log_weights` in run ``run_id`` of store ``uri``.

    StorageError when the store is missing or unreachable, ConfigError when the run is unknown or
    saved no weights.
    """
    from sweeps import tracking

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise StorageError(f"--tracking-uri {uri}: no MLflow store there")
    client = tracking.connect(uri)
    try:
        client.get_run(run_id)
        names = {Path(a.path).name for a in client.list_artifacts(run_id, ARTIFACT)}
    except MlflowException:
        raise ConfigError(f"run {run_id}: no such run in {uri}") from None
    if not {WEIGHTS, "config.yaml"} <= names:
        raise ConfigError(f"run {run_id}: saved no weights (no {ARTIFACT}/{WEIGHTS} artifact)")
    tmp = tempfile.mkdtemp(prefix="ablate-weights-")
    try:
        local = Path(client.download_artifacts(run_id, ARTIFACT, tmp))
        cfg = load_config(local / "config.yaml")
        _, model = load_pretrained(local)
    except MlflowException as exc:
        raise StorageError(f"run {run_id}: cannot download its {ARTIFACT}/ artifacts ({exc.message})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cfg, model
