"""A run's trained weights as MLflow run artifacts (``model/model.safetensors``, ``model/config.yaml``, the
tokenizer as a transformers tokenizer): logged (:func:`log_weights`, :func:`log_quantized`), loaded
(:func:`load_run_classifier`, :func:`load_quantized`) and exported (:func:`export_run`). The folder is an ablate
checkpoint as :func:`ablate.lightning_modules.interop.pretrained.load_pretrained` reads it; a fine-tuning run
keeps its classifier the same way (:func:`ablate.lightning_modules.interop.classifier.load_classifier`)."""

from __future__ import annotations

import copy
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import torch
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from torch import nn

from ablate.lightning_modules.config.errors import AblateError, ConfigError, StorageError
from ablate.lightning_modules.config.experiment import ExperimentConfig, to_yaml
from ablate.lightning_modules.config.load import load_config
from ablate.lightning_modules.interop.classifier import WEIGHTS, load_classifier
from ablate.lightning_modules.interop.export import export
from ablate.lightning_modules.interop.hub import TOKENIZER_FILE, save_tokenizer
from ablate.lightning_modules.interop.pretrained import load_pretrained, state_dict
from ablate.lightning_modules.interop.qa_export import export_span, load_span_model
from ablate.lightning_modules.interop.quantized import (
    QUANTIZED,
    QuantizedModel,
    dequantized,
    read_quantized,
    write_quantized,
)
from ablate.lightning_modules.methods.quantization.apply import LayerBits
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.encoder import build_encoder
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.lightning_modules.model.span import SpanModel
from ablate.sweeps.engine import tracking

ARTIFACT = "model"
TOKENIZER_ARTIFACT = "tokenizer"  # the run's tokenizer file, logged when the run starts
RUNS = "runs:/"  # distill.teacher: runs:/RUN_ID names a run of the same MLflow store
RUN_KINDS = {
    "pretrain": "a pre-training run",
    "distill": "a distillation run",
    "prune": "a pruning run",
    "quant": "a quantization run",
    "finetune": "a fine-tuning run",
}


def run_tokenizer(client: MlflowClient, run_id: str, workdir: Path) -> Path | None:
    """Download run ``run_id``'s tokenizer into ``workdir``: its ``tokenizer/*.json`` artifact, else
    ``model/tokenizer.json``; None when it logged neither. StorageError when the download fails."""
    try:
        files = [a.path for a in client.list_artifacts(run_id, TOKENIZER_ARTIFACT) if a.path.endswith(".json")]
        if not files:
            files = [a.path for a in client.list_artifacts(run_id, ARTIFACT) if Path(a.path).name == TOKENIZER_FILE]
        if not files:
            return None
        with tracking.quiet_downloads():  # a small file: no progress bar
            return Path(client.download_artifacts(run_id, files[0], str(workdir)))
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

    A fine-tuning run's :class:`Classifier` is logged with its run's config (regime ``finetune``),
    whose ``model`` must be the classifier's encoder (the source's: ``replace(cfg,
    model=source.model_cfg)``) and ``finetune.num_labels`` its classes: ValueError otherwise, as
    the weights could not be read back.
    """
    from safetensors.torch import save_file

    if isinstance(module_model, Classifier):
        _check_classifier_config(module_model, cfg)

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


def log_quantized(
    client: MlflowClient,
    run_id: str,
    model: nn.Module,
    cfg: ExperimentConfig,
    plan: LayerBits | None,
    bits: float | None,
) -> None:
    """Log the quantized ``model`` the run scored as its ``model/quantized.safetensors`` and
    ``model/quantization.yaml`` (:func:`~ablate.lightning_modules.interop.quantized.write_quantized`):
    integer weights and scales, read back by :func:`load_quantized` with the ``model/config.yaml`` and
    float weights the weights finisher logs."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / ARTIFACT
        write_quantized(model, cfg, plan, bits, folder)
        client.log_artifacts(run_id, str(folder), ARTIFACT)


def _download_model(uri: str, run_id: str, tmp: str) -> Path:
    """Run ``run_id``'s ``model/`` folder, downloaded into ``tmp``; ConfigError when the run is unknown or
    logged no quantized model, StorageError when the download fails."""
    client = store(uri)
    try:
        names = {Path(a.path).name for a in client.list_artifacts(run_id, ARTIFACT)}
        regime = client.get_run(run_id).data.params.get("quant.method", "none")
    except MlflowException:
        raise ConfigError(f"run {run_id}: no such run in {uri}") from None
    if not {QUANTIZED, WEIGHTS, "config.yaml"} <= names:
        what = "is not quantized" if regime == "none" else "saved no quantized model"
        raise ConfigError(f"{RUNS}{run_id} {what} (no {ARTIFACT}/{QUANTIZED} artifact beside its weights)")
    try:
        with tracking.quiet_downloads():  # a few small files: no progress bar between the run's status lines
            return Path(client.download_artifacts(run_id, ARTIFACT, tmp))
    except MlflowException as exc:
        raise StorageError(f"run {run_id}: cannot download its {ARTIFACT}/ artifacts ({exc.message})") from None


def load_quantized(uri: str, run_id: str) -> QuantizedModel:
    """Run ``run_id``'s quantized model as it scored it, rebuilt from its integer weights and scales
    (:func:`~ablate.lightning_modules.interop.quantized.read_quantized`: ``.cfg``, ``.model``, ``.plan``,
    ``.layers``). ConfigError for a run that logged none (not quantized, or logged before quantized
    models were kept), DataError for artifacts this version cannot rebuild."""
    with tracking.quiet_downloads(), tempfile.TemporaryDirectory(prefix="ablate-quantized-") as tmp:
        return read_quantized(_download_model(uri, run_id, tmp))


def load_dequantized(uri: str, run_id: str) -> tuple[ExperimentConfig, nn.Module]:
    """Run ``run_id``'s config and float model holding its quantized layers' dequantized weights
    (:func:`~ablate.lightning_modules.interop.quantized.dequantized`): what a teacher learns from."""
    with tracking.quiet_downloads(), tempfile.TemporaryDirectory(prefix="ablate-quantized-") as tmp:
        return dequantized(_download_model(uri, run_id, tmp))


def _check_classifier_config(model: Classifier, cfg: ExperimentConfig) -> None:
    """ValueError unless ``cfg`` describes ``model`` (what :func:`load_run_classifier` builds from it)."""
    if cfg.regime != "finetune" or cfg.finetune.num_labels != model.num_labels:
        raise ValueError(
            f"log_weights: a {model.num_labels}-label classifier is logged with its fine-tuning run's config "
            f"(regime finetune, finetune.num_labels {model.num_labels}); got regime {cfg.regime}, "
            f"finetune.num_labels {cfg.finetune.num_labels}"
        )
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in build_encoder(cfg.model).state_dict().items()}
    have = {
        k.removeprefix("encoder."): tuple(v.shape) for k, v in state_dict(model).items() if k.startswith("encoder.")
    }
    wrong = sorted(k for k in want if have.get(k) != want[k])
    if wrong:
        raise ValueError(
            f"log_weights: cfg.model does not describe the classifier's encoder ({wrong[0]}); log the run's config "
            "with model = the source's architecture (dataclasses.replace(cfg, model=source.model_cfg))"
        )


def store(uri: str) -> MlflowClient:
    """A client of a store weights are read from: it must exist (nothing is created or changed)."""
    return tracking.existing(uri)


def finetune_run_params(uri: str, run_id: str, named: str, refused: tuple[str, str]) -> dict[str, str]:
    """The params of ``run_id``, a fine-tuning run (``ablate predict``'s and ONNX export's check).

    Raises:
        ConfigError: no such run (``<named><run_id>: no such run``), or a run of another regime
            (``<refused[0]>runs:/ID is <its kind>; <refused[1]>``).
    """
    try:
        params: dict[str, str] = store(uri).get_run(run_id).data.params
    except MlflowException:
        raise ConfigError(f"{named}{run_id}: no such run in {uri}") from None
    regime = params.get("regime", "finetune")
    if regime != "finetune":
        what = RUN_KINDS.get(regime, f"a {regime} run")
        raise ConfigError(f"{refused[0]}{RUNS}{run_id} is {what}; {refused[1]}")
    return params


def _not_a_classifier(run_id: str, regime: str) -> ConfigError:
    return ConfigError(f"{RUNS}{run_id} is {RUN_KINDS.get(regime, f'a {regime} run')}, not a fine-tuned classifier")


def _a_classifier(run_id: str, source: object) -> ConfigError:
    origin = f", from {source}" if source else ""
    return ConfigError(
        f"run {run_id} is a fine-tuned classifier (regime finetune{origin}), not a pre-trained model; "
        f"start from its source, or read it as a classifier (ablate export, a fine-tuning run's distill.teacher)"
    )


Loaded = tuple[ExperimentConfig, PretrainingModel | Classifier | SpanModel]


def _load_run(uri: str, run_id: str, want: Literal["pretrained", "classifier", "any"]) -> Loaded:
    """The config and model run ``run_id`` saved with :func:`log_weights`; ``want`` refuses the other kind."""
    client = store(uri)
    try:
        run = client.get_run(run_id)
        names = {Path(a.path).name for a in client.list_artifacts(run_id, ARTIFACT)}
    except MlflowException:
        raise ConfigError(f"run {run_id}: no such run in {uri}") from None
    params = run.data.params
    regime = params.get("regime")
    if want == "classifier" and regime is not None and regime != "finetune":
        raise _not_a_classifier(run_id, regime)
    if want == "pretrained" and regime == "finetune":
        raise _a_classifier(run_id, params.get("finetune.source"))
    if not {WEIGHTS, "config.yaml"} <= names:
        raise ConfigError(f"run {run_id}: saved no weights (no {ARTIFACT}/{WEIGHTS} artifact)")
    finished = run.info.status == "FINISHED" and run.info.end_time is not None
    if finished:  # the process's copy: the caller gets one of its own (it trains it)
        cfg, kept = _finished_run(uri, run_id, run.info.end_time)
        model = copy.deepcopy(kept)
    else:
        cfg, model = _download(client, run_id)
    if want == "classifier" and cfg.regime != "finetune":
        raise _not_a_classifier(run_id, cfg.regime or "pretrain")
    if want == "pretrained" and cfg.regime == "finetune":
        raise _a_classifier(run_id, cfg.finetune.source)
    return cfg, model


@lru_cache(maxsize=2)
def _finished_run(uri: str, run_id: str, end_time: int) -> Loaded:
    """A finished run's saved model, downloaded once per process (a study's tasks and seeds each start from
    their trial's pre-trained run); kept by its end time, which a resumed run's new end changes."""
    return _download(store(uri), run_id)


def _download(client: MlflowClient, run_id: str) -> Loaded:
    """The config and model a run saved, built without drawing from torch's random generator (a model read
    from a cache or downloaded leaves the run's random numbers where they were: the same numbers either way)."""
    tmp = tempfile.mkdtemp(prefix="ablate-weights-")
    try:
        with tracking.quiet_downloads(), torch.random.fork_rng(devices=[]):  # no progress bar; no draws
            local = Path(client.download_artifacts(run_id, ARTIFACT, tmp))
            cfg = load_config(local / "config.yaml")
            model: PretrainingModel | Classifier | SpanModel
            if cfg.regime == "finetune" and cfg.finetune.kind == "span":  # a span task's model (SQuAD)
                _, model = load_span_model(local)
            else:
                _, model = load_classifier(local) if cfg.regime == "finetune" else load_pretrained(local)
    except MlflowException as exc:
        raise StorageError(f"run {run_id}: cannot download its {ARTIFACT}/ artifacts ({exc.message})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cfg, model


def load_run_weights(uri: str, run_id: str) -> tuple[ExperimentConfig, PretrainingModel]:
    """The config and trained model saved by :func:`log_weights` in run ``run_id`` of store ``uri``.

    StorageError when the store is missing or unreachable, ConfigError when the run is unknown,
    saved no weights or is a fine-tuning run (a classifier: :func:`load_run_classifier`).
    """
    cfg, model = _load_run(uri, run_id, "pretrained")
    assert isinstance(model, PretrainingModel)
    return cfg, model


def load_run_classifier(uri: str, run_id: str) -> tuple[ExperimentConfig, Classifier]:
    """The config and fine-tuned :class:`Classifier` (eval mode) a fine-tuning run saved with
    :func:`log_weights`. As :func:`load_run_weights`; ConfigError for a run of another regime
    (``runs:/ID is a pre-training run, not a fine-tuned classifier``)."""
    cfg, model = _load_run(uri, run_id, "classifier")
    if isinstance(model, SpanModel):
        raise ConfigError(f"{RUNS}{run_id} is a span task's model (finetune.kind span), not a sequence classifier")
    assert isinstance(model, Classifier)
    return cfg, model


def load_run_span(uri: str, run_id: str) -> tuple[ExperimentConfig, SpanModel]:
    """The config and fine-tuned :class:`SpanModel` (eval mode) a span fine-tuning run saved; ConfigError
    for a run of another kind."""
    cfg, model = _load_run(uri, run_id, "classifier")
    if not isinstance(model, SpanModel):
        raise ConfigError(f"{RUNS}{run_id} is not a span task's model (its finetune.kind is {cfg.finetune.kind})")
    return cfg, model


@dataclass
class Exported:
    """What :func:`export_run` wrote: the format, whether the run's tokenizer went with it and whether
    it is a fine-tuned classifier (``*ForSequenceClassification``)."""

    format: str
    tokenizer: bool
    classifier: bool = False


def export_run(
    uri: str,
    run_id: str,
    out_dir: Path,
    format: str = "auto",  # noqa: A002 - the CLI's word
    repo: str | None = None,
    labels: Sequence[str] | None = None,
) -> Exported:
    """``ablate export``: run ``run_id``'s ``model/`` weights, its tokenizer and a model card with
    its final metrics, written to ``out_dir`` by :func:`ablate.lightning_modules.interop.export.export`; a
    fine-tuning run's classifier becomes a sequence classifier (``format`` auto: a transformers
    ``*ForSequenceClassification`` when expressible; ``labels``: its class names)."""
    with tracking.quiet_downloads(), tempfile.TemporaryDirectory(prefix="ablate-export-") as tmp:
        cfg, model = _load_run(uri, run_id, "any")
        client = store(uri)
        tok = run_tokenizer(client, run_id, Path(tmp))
        run = client.get_run(run_id)
        # written under a temporary name beside out_dir, then renamed: a failure leaves no half export
        out_dir = Path(out_dir)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
        try:
            if isinstance(model, SpanModel):  # AutoModelForQuestionAnswering
                if labels is not None:
                    raise ConfigError("--labels: a span task's model has no labels")
                written = export_span(
                    model,
                    cfg,
                    staging,
                    format,
                    tokenizer=tok,
                    metrics=dict(run.data.metrics),
                    source=f"`{RUNS}{run_id}`",
                )
            else:
                written = export(
                    model,
                    cfg,
                    staging,
                    format=format,  # type: ignore[arg-type]  # a str the CLI checked against export's choices
                    tokenizer=tok,
                    metrics=dict(run.data.metrics),
                    source=f"MLflow run `{run.info.run_name}` (`{RUNS}{run_id}`)",
                    repo=repo,
                    labels=labels,
                )
            if out_dir.is_dir():
                out_dir.rmdir()  # new or empty (checked before anything was read)
            staging.rename(out_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return Exported(written, tok is not None, isinstance(model, Classifier))
