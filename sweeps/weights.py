"""Trained weights as MLflow run artifacts: ``model/model.safetensors`` + ``model/config.yaml``
+ the run's tokenizer as a transformers tokenizer (``model/tokenizer.json``, ``model/tokenizer_config.json``).

The folder is an ablate checkpoint as :func:`lightning_modules.interop.load_pretrained` reads
it, so ``ablate export`` (:func:`export_run`) and ``init_from`` (on a downloaded copy) both start from it.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from torch import nn

from ablate.lightning_modules.config import ExperimentConfig, ModelConfig, to_yaml
from ablate.lightning_modules.configio import load_config
from ablate.lightning_modules.errors import AblateError, ConfigError, StorageError
from ablate.lightning_modules.heads import PretrainingModel
from ablate.lightning_modules.hf_export import TOKENIZER_FILE, folder_tokenizer, load_tokenizer, save_tokenizer
from ablate.lightning_modules.interop import WEIGHTS, export, load_pretrained, state_dict
from ablate.sweeps import tracking

ARTIFACT = "model"
TOKENIZER_ARTIFACT = "tokenizer"  # the run's tokenizer file, logged when the run starts
RUNS = "runs:/"  # distill.teacher: runs:/RUN_ID names a run of the same MLflow store


def run_tokenizer(client: MlflowClient, run_id: str, workdir: Path) -> Path | None:
    """Download run ``run_id``'s tokenizer into ``workdir``: its ``tokenizer/*.json`` artifact, else
    ``model/tokenizer.json``; None when it logged neither. StorageError when the download fails."""
    try:
        files = [a.path for a in client.list_artifacts(run_id, TOKENIZER_ARTIFACT) if a.path.endswith(".json")]
        if not files:
            files = [a.path for a in client.list_artifacts(run_id, ARTIFACT) if Path(a.path).name == TOKENIZER_FILE]
        return Path(client.download_artifacts(run_id, files[0], str(workdir))) if files else None
    except MlflowException as exc:
        raise StorageError(f"run {run_id}: cannot download its tokenizer ({exc.message})") from None


def log_weights(
    client: MlflowClient, run_id: str, module_model: nn.Module, cfg: ExperimentConfig, tokenizer: Path | None = None
) -> None:
    """Log ``module_model``'s weights (safetensors, CPU), ``cfg`` and the run's tokenizer as the
    run's ``model/`` artifacts.

    The tokenizer (``tokenizer``, else the run's own ``tokenizer/`` artifact) is saved as a
    transformers tokenizer (``AutoTokenizer.from_pretrained`` reads the downloaded folder), or
    copied as ``tokenizer.json`` where transformers is not installed; a tokenizer that cannot be
    read is left out with a warning, never the weights.
    """
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / ARTIFACT
        folder.mkdir()
        save_file(state_dict(module_model), str(folder / WEIGHTS), metadata={"format": "pt"})
        (folder / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
        try:
            tok = tokenizer if tokenizer is not None else run_tokenizer(client, run_id, Path(tmp))
            if tok is not None:
                save_tokenizer(tok, folder, cfg.data.lowercase, cfg.model.max_position, required=False)
        except AblateError as exc:
            warnings.warn(f"run {run_id}: {ARTIFACT}/ artifacts logged without the tokenizer ({exc})", stacklevel=2)
        client.log_artifacts(run_id, str(folder), ARTIFACT)


def load_run_weights(uri: str, run_id: str) -> tuple[ExperimentConfig, PretrainingModel]:
    """The config and trained model saved by :func:`log_weights` in run ``run_id`` of store ``uri``.

    StorageError when the store is missing or unreachable, ConfigError when the run is unknown or
    saved no weights.
    """
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


@dataclass
class Source:
    """A trained model to start from (a distillation teacher, a model to prune or to fine-tune): its
    architecture, its model and (when known) its tokenizer file."""

    source: str
    model_cfg: ModelConfig
    model: PretrainingModel
    tokenizer: Path | None
    run_id: str | None = None


def load_source(
    source: str, uri: str, workdir: Path, field: str = "distill.teacher", quantized: bool = False
) -> Source:
    """The trained model ``field`` names (``distill.teacher``, ``prune.source``, ``finetune.source``):
    ``runs:/RUN_ID`` in the store ``uri`` (its tokenizer artifact is downloaded into ``workdir``)
    or a checkpoint folder (an ``ablate export`` folder or a transformers checkpoint; its
    ``tokenizer.json``, when it has one, is the source's tokenizer).
    ConfigError/StorageError prefixed with ``field`` (the config key that named it).

    A quantized run's ``model/`` artifacts are its float weights: only a fine-tuning run, which
    quantizes its classifier the same way, takes it (``quantized``); others are refused."""
    try:
        if not source.startswith(RUNS):
            model_cfg, model = load_pretrained(source)
            tok = folder_tokenizer(source)
            if tok is not None and load_tokenizer(tok).get_vocab_size() > model_cfg.vocab_size:
                raise ConfigError(
                    f"{tok}: more tokens than the model's vocab_size={model_cfg.vocab_size} (not its tokenizer)"
                )
            return Source(source, model_cfg, model, tok)
        run_id = source.removeprefix(RUNS).strip("/")
        with tracking.quiet_downloads():
            cfg, model = load_run_weights(uri, run_id)
            if cfg.quant.enabled and not quantized:
                raise ConfigError(
                    f"{source} is quantized (quant.method={cfg.quant.method}) and its artifacts hold its float "
                    f"weights; start from the model it quantized, then quantize the result (quant.method)"
                )
            tok = run_tokenizer(tracking.connect(uri), run_id, workdir)
        return Source(source, cfg.model, model, tok, run_id)
    except (ConfigError, StorageError) as exc:
        raise type(exc)(f"{field}: {exc}") from None


@dataclass
class Exported:
    """What :func:`export_run` wrote: the format and whether the run's tokenizer went with it."""

    format: str
    tokenizer: bool


def export_run(uri: str, run_id: str, out_dir: Path, format: str = "auto", repo: str | None = None) -> Exported:  # noqa: A002
    """``ablate export``: run ``run_id``'s ``model/`` weights, its tokenizer and a model card with
    its final metrics, written to ``out_dir`` by :func:`lightning_modules.interop.export`."""
    with tracking.quiet_downloads(), tempfile.TemporaryDirectory(prefix="ablate-export-") as tmp:
        cfg, model = load_run_weights(uri, run_id)
        client = tracking.connect(uri)
        tok = run_tokenizer(client, run_id, Path(tmp))
        run = client.get_run(run_id)
        written = export(
            model,
            cfg,
            out_dir,
            format=format,  # type: ignore[arg-type] - checked by export
            tokenizer=tok,
            metrics=dict(run.data.metrics),
            source=f"MLflow run `{run.info.run_name}` (`{RUNS}{run_id}`)",
            repo=repo,
        )
    return Exported(written, tok is not None)


def check_positions(source: Source, max_length: int, field: str) -> None:
    """A source model must have a position for every token of the run's sequences (``data.max_length``)."""
    m = source.model_cfg
    if m.position == "learned" and m.max_position < max_length:
        raise ConfigError(
            f"{field}: {source.source} has {m.max_position} positions (its model.max_position), "
            f"fewer than data.max_length {max_length}"
        )


def check_same_tokenizer(teacher: Source, student_tokenizer: Path, field: str = "distill.teacher") -> None:
    """KD compares MLM distributions token by token, pruning fine-tunes on this run's data: the
    teacher (or pruned model) must use this run's vocabulary."""
    from tokenizers import Tokenizer

    if teacher.tokenizer is None:
        return  # a checkpoint without its tokenizer: the user vouches for it (README)
    theirs, mine = Tokenizer.from_file(str(teacher.tokenizer)), Tokenizer.from_file(str(student_tokenizer))
    if theirs.get_vocab() != mine.get_vocab():
        raise ConfigError(
            f"{field}: {teacher.source} was trained with a different tokenizer than this run's "
            f"(data.corpus, data.lowercase, data.tokenizer_docs and model.vocab_size must match "
            f"those it was trained with)"
        )
