"""Trained weights as MLflow run artifacts: ``model/model.safetensors`` + ``model/config.yaml``
+ the run's tokenizer as a transformers tokenizer (``model/tokenizer.json``, ``model/tokenizer_config.json``).

The folder is an ablate checkpoint as :func:`ablate.lightning_modules.interop.pretrained.load_pretrained` reads
it, so ``ablate export`` (:func:`export_run`) and ``init_from`` (on a downloaded copy) both start from it.
A fine-tuning run (regime ``finetune``) keeps its :class:`Classifier` the same way, read by
:func:`ablate.lightning_modules.interop.classifier.load_classifier`: :func:`load_run_classifier` and
:func:`load_classifier_source` load it (a distillation teacher), ``ablate export`` makes it a
transformers sequence classifier, and the readers of pre-trained models refuse it by name.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from torch import nn

from ablate.datamodules.catalog import resolve_model
from ablate.datamodules.tokenizer import checkpoint_tokenizer
from ablate.lightning_modules.config.errors import AblateError, ConfigError, StorageError
from ablate.lightning_modules.config.experiment import ExperimentConfig, to_yaml
from ablate.lightning_modules.config.load import load_config
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.interop.classifier import WEIGHTS, load_classifier
from ablate.lightning_modules.interop.export import export
from ablate.lightning_modules.interop.hub import TOKENIZER_FILE, load_tokenizer, save_tokenizer
from ablate.lightning_modules.interop.pretrained import load_pretrained, state_dict
from ablate.lightning_modules.interop.qa_export import export_span, load_span_model
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.encoder import build_encoder
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.lightning_modules.model.span import SpanModel
from ablate.lightning_modules.model.vocab_bridge import VocabMap, own_vocabulary
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


def _client(uri: str) -> MlflowClient:
    """A client of a store weights are read from: it must exist (nothing is created or changed)."""
    return tracking.existing(uri)


def _not_a_classifier(run_id: str, regime: str) -> ConfigError:
    return ConfigError(f"{RUNS}{run_id} is {RUN_KINDS.get(regime, f'a {regime} run')}, not a fine-tuned classifier")


def _a_classifier(run_id: str, source: object) -> ConfigError:
    origin = f", from {source}" if source else ""
    return ConfigError(
        f"run {run_id} is a fine-tuned classifier (regime finetune{origin}), not a pre-trained model; "
        f"start from its source, or read it as a classifier (ablate export, a fine-tuning run's distill.teacher)"
    )


def _load_run(
    uri: str, run_id: str, want: Literal["pretrained", "classifier", "any"]
) -> tuple[ExperimentConfig, PretrainingModel | Classifier | SpanModel]:
    """The config and model run ``run_id`` saved with :func:`log_weights`; ``want`` refuses the other kind."""
    client = _client(uri)
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
    tmp = tempfile.mkdtemp(prefix="ablate-weights-")
    try:
        local = Path(client.download_artifacts(run_id, ARTIFACT, tmp))
        cfg = load_config(local / "config.yaml")
        if want == "classifier" and cfg.regime != "finetune":
            raise _not_a_classifier(run_id, cfg.regime or "pretrain")
        if want == "pretrained" and cfg.regime == "finetune":
            raise _a_classifier(run_id, cfg.finetune.source)
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


def load_span_source(source: str, uri: str, workdir: Path, field: str) -> tuple[SpanSource, Path | None]:
    """The fine-tuned span model ``field`` names (a span task's teacher): ``runs:/RUN_ID`` of a span
    fine-tuning run (its tokenizer downloaded into ``workdir``) or a folder (an ``ablate export`` of one,
    or a transformers ``*ForQuestionAnswering``); its tokenizer file. One-line errors prefixed with ``field``."""
    try:
        if not source.startswith(RUNS):
            model_cfg, span = load_span_model(source)
            return SpanSource(source, model_cfg, span), _folder_tokenizer(Path(source), model_cfg, workdir)
        run_id = source.removeprefix(RUNS).strip("/")
        with tracking.quiet_downloads():
            cfg, model = load_run_span(uri, run_id)
            if cfg.quant.enabled:
                raise ConfigError(f"{source} is quantized and its artifacts hold its float weights")
            tok = run_tokenizer(_client(uri), run_id, workdir)
        return SpanSource(source, cfg.model, model, run_id), tok
    except (ConfigError, StorageError) as exc:
        raise type(exc)(f"{field}: {exc}") from None


@dataclass
class SpanSource:
    """A fine-tuned span model to learn from: its architecture, model and run (when one)."""

    source: str
    model_cfg: ModelConfig
    model: SpanModel
    run_id: str | None = None


def _folder_tokenizer(folder: Path, model_cfg: ModelConfig, workdir: Path) -> Path | None:
    """A checkpoint folder's tokenizer (its ``tokenizer.json``, else its ``vocab.txt`` as BERT's WordPiece,
    written into ``workdir``; None without either), checked to fit the model's vocabulary."""
    tok = checkpoint_tokenizer(folder, workdir)
    if tok is not None and load_tokenizer(tok).get_vocab_size() > model_cfg.vocab_size:
        raise ConfigError(f"{tok}: more tokens than the model's vocab_size={model_cfg.vocab_size} (not its tokenizer)")
    return tok


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
        if not source.startswith(RUNS):  # a folder, the data catalog's model entry or a hub name
            folder = resolve_model(source, field)
            model_cfg, model = load_pretrained(folder)
            return Source(source, model_cfg, model, _folder_tokenizer(folder, model_cfg, workdir))
        run_id = source.removeprefix(RUNS).strip("/")
        with tracking.quiet_downloads():
            cfg, model = load_run_weights(uri, run_id)
            if cfg.quant.enabled and not quantized:
                raise ConfigError(
                    f"{source} is quantized (quant.method={cfg.quant.method}) and its artifacts hold its float "
                    f"weights; start from the model it quantized, then quantize the result (quant.method)"
                )
            tok = run_tokenizer(_client(uri), run_id, workdir)
        return Source(source, cfg.model, model, tok, run_id)
    except (ConfigError, StorageError) as exc:
        raise type(exc)(f"{field}: {exc}") from None


@dataclass
class ClassifierSource:
    """A fine-tuned classifier to learn from (a task-distillation teacher): as :class:`Source`, with its classes."""

    source: str
    model_cfg: ModelConfig
    model: Classifier
    num_labels: int
    tokenizer: Path | None
    run_id: str | None = None


def load_classifier_source(
    source: str, uri: str, workdir: Path, field: str, quantized: bool = False
) -> ClassifierSource:
    """The fine-tuned classifier ``field`` names: ``runs:/RUN_ID`` of a fine-tuning run in the store
    ``uri`` (its tokenizer downloaded into ``workdir``) or a classifier folder (an ``ablate export``
    of one, or a transformers ``*ForSequenceClassification`` checkpoint; its ``tokenizer.json``,
    when it has one, is the tokenizer). One-line ConfigError/StorageError prefixed with ``field``;
    a quantized run (whose artifacts hold its float weights) only when ``quantized``."""
    try:
        if not source.startswith(RUNS):
            folder = resolve_model(source, field)
            model_cfg, model = load_classifier(folder)
            tok = _folder_tokenizer(folder, model_cfg, workdir)
            return ClassifierSource(source, model_cfg, model, model.num_labels, tok)
        run_id = source.removeprefix(RUNS).strip("/")
        with tracking.quiet_downloads():
            cfg, model = load_run_classifier(uri, run_id)
            if cfg.quant.enabled and not quantized:
                raise ConfigError(
                    f"{source} is quantized (quant.method={cfg.quant.method}) and its artifacts hold its float "
                    "weights; use the same fine-tuning run without quant.method"
                )
            tok = run_tokenizer(_client(uri), run_id, workdir)
        return ClassifierSource(source, cfg.model, model, model.num_labels, tok, run_id)
    except (ConfigError, StorageError) as exc:
        raise type(exc)(f"{field}: {exc}") from None


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
        client = _client(uri)
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


def check_positions(source: Source, max_length: int, field: str) -> None:
    """A source model must have a position for every token of the run's sequences (``data.max_length``)."""
    m = source.model_cfg
    if m.position == "learned" and m.max_position < max_length:
        raise ConfigError(
            f"{field}: {source.source} has {m.max_position} positions (its model.max_position), "
            f"fewer than data.max_length {max_length}"
        )


def check_same_tokenizer(
    source: Source | ClassifierSource, run_tokenizer: Path, field: str = "distill.teacher"
) -> None:
    """KD compares MLM distributions token by token, pruning fine-tunes on this run's data: the
    model ``field`` names (a teacher, a model to prune or to augment with) must use this run's
    vocabulary (``run_tokenizer``)."""
    from tokenizers import Tokenizer

    if source.tokenizer is None:
        return  # a checkpoint without its tokenizer: the user vouches for it (README)
    theirs, mine = Tokenizer.from_file(str(source.tokenizer)), Tokenizer.from_file(str(run_tokenizer))
    if theirs.get_vocab() != mine.get_vocab():
        raise ConfigError(
            f"{field}: {source.source} was trained with a different tokenizer than this run's "
            f"(set data.tokenizer to its tokenizer, or data.corpus, data.lowercase, data.tokenizer_docs and "
            f"model.vocab_size to those it was trained with)"
        )


_PROBE = "Éric's CAFÉ-au-lait, naïve 北京 x1.5 don't"  # accents, case, punctuation, CJK, digits


def _reads(tok: Any) -> tuple[object, ...]:
    """How a tokenizer splits text before WordPiece: its normalizer's and pre-tokenizer's output on a probe."""
    text = tok.normalizer.normalize_str(_PROBE) if tok.normalizer is not None else _PROBE
    words = tok.pre_tokenizer.pre_tokenize_str(text) if tok.pre_tokenizer is not None else text
    return text, words


def student_vocabulary(teacher: Source, student_tokenizer: Path, student_cfg: ModelConfig) -> VocabMap | None:
    """How a student's token ids reach its teacher's: None for a student of the teacher's vocabulary
    (its tokenizer must be the teacher's: :func:`check_same_tokenizer`); for one with its own,
    smaller vocabulary (Zhao et al.), each id mapped to the teacher token of the same string
    (None when the teacher has no tokenizer: ``distill_module`` names it). ConfigError
    (``model.vocab_size``) for a larger vocabulary, (``distill.teacher``) for a teacher tokenizer
    that reads text otherwise (``data.lowercase``), whose pieces would not mean the same text."""
    from tokenizers import Tokenizer

    from ablate.datamodules.tokenizer import continuation_mask, vocabulary_map

    if not own_vocabulary(student_cfg, teacher.model_cfg):
        check_same_tokenizer(teacher, student_tokenizer)
        return None
    if teacher.tokenizer is None:
        return None
    theirs, mine = Tokenizer.from_file(str(teacher.tokenizer)), Tokenizer.from_file(str(student_tokenizer))
    if _reads(theirs) != _reads(mine):
        raise ConfigError(
            f"distill.teacher: {teacher.source}'s tokenizer normalizes or splits text otherwise than this run's "
            f"(data.lowercase must be the teacher's): the student's tokens are mapped to the teacher's by their text"
        )
    return VocabMap.of(vocabulary_map(mine, theirs), continuation_mask(mine), student_cfg.vocab_size)
