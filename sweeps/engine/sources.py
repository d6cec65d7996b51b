"""Models a run starts from or learns from, loaded and checked before the run exists: a source to
fine-tune, prune or quantize, a teacher (a pre-trained model, a fine-tuned classifier or span model),
by ``runs:/RUN_ID`` (a run's ``model/`` artifacts, :mod:`~ablate.sweeps.engine.weights`), a folder, the
data catalog's model entry or a hub name; and the checks that they fit the run (tokenizer, positions)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.datamodules.catalog import resolve_model
from ablate.datamodules.tokenizer import checkpoint_tokenizer
from ablate.lightning_modules.config.errors import ConfigError, StorageError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.config.quant import check_group_size
from ablate.lightning_modules.interop.classifier import load_classifier
from ablate.lightning_modules.interop.hub import load_tokenizer
from ablate.lightning_modules.interop.pretrained import check_architecture, folder_model, load_pretrained
from ablate.lightning_modules.interop.qa_export import load_span_model
from ablate.lightning_modules.methods.pruning.budget import backbone_params
from ablate.lightning_modules.methods.pruning.gates import check_supported
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.heads import PretrainingModel
from ablate.lightning_modules.model.span import SpanModel
from ablate.lightning_modules.model.vocab_bridge import VocabMap, own_vocabulary
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.weights import (
    RUNS,
    load_dequantized,
    load_run_classifier,
    load_run_span,
    load_run_weights,
    run_tokenizer,
    store,
)


def _quantized_source(source: str, run_id: str, uri: str, method: str, use: str) -> ConfigError:
    """A quantized run refused where its rounded weights would be quantized, pruned or trained again:
    the message names the model it quantized (its source run) to start from instead."""
    origin = store(uri).get_run(run_id).data.tags.get(tracking.SOURCE)
    start = f"start from the model it quantized ({RUNS}{origin})" if origin else "start from its float model"
    return ConfigError(
        f"{source} is quantized (quant.method={method}): {use} would start from its rounded weights; "
        f"{start} and set this run's quant.method"
    )


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
            if cfg.quant.enabled:  # a teacher: its dequantized model
                cfg, dequantized = load_dequantized(uri, run_id)
                assert isinstance(dequantized, SpanModel)
                model = dequantized
            tok = run_tokenizer(store(uri), run_id, workdir)
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

    A quantized run: a fine-tuning run (``quantized``) takes its float weights (after QAT, the trained
    ones) and quantizes its classifier again; a teacher (``distill.teacher``) is its dequantized model
    (the quantized weights as floats); a model to prune or to quantize again is refused, naming the
    model it quantized."""
    try:
        if not source.startswith(RUNS):  # a folder, the data catalog's model entry or a hub name
            folder = resolve_model(source, field)
            model_cfg, model = load_pretrained(folder)
            return Source(source, model_cfg, model, _folder_tokenizer(folder, model_cfg, workdir))
        run_id = source.removeprefix(RUNS).strip("/")
        with tracking.quiet_downloads():
            cfg, model = load_run_weights(uri, run_id)
            if cfg.quant.enabled and field == "distill.teacher":
                cfg, dequantized = load_dequantized(uri, run_id)
                assert isinstance(dequantized, PretrainingModel)
                model = dequantized
            elif cfg.quant.enabled and not quantized:
                use = {"prune.source": "pruning it", "quant.source": "quantizing it again"}.get(
                    field, f"using it as {field}"
                )
                raise _quantized_source(source, run_id, uri, cfg.quant.method, use)
            tok = run_tokenizer(store(uri), run_id, workdir)
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
    when it has one, is the tokenizer). One-line ConfigError/StorageError prefixed with ``field``.
    A quantized fine-tuning run teaches with its dequantized classifier (its quantized weights as
    floats: a weight-only classifier's own logits; ``dynamic-int8`` and ``qat-int8`` without their
    activation rounding); ``quantized`` takes its float weights instead."""
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
                cfg, dequantized = load_dequantized(uri, run_id)
                assert isinstance(dequantized, Classifier)
                model = dequantized
            tok = run_tokenizer(store(uri), run_id, workdir)
        return ClassifierSource(source, cfg.model, model, model.num_labels, tok, run_id)
    except (ConfigError, StorageError) as exc:
        raise type(exc)(f"{field}: {exc}") from None


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


def _local_folder(name: str) -> Path | None:
    """The folder ``name`` is, or the data catalog maps it to; None for ``runs:/RUN_ID`` and a hub name
    held nowhere locally (read when the run loads it)."""
    from ablate.datamodules.catalog import active_catalog

    if name.startswith(RUNS):
        return None
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser()
    catalog = active_catalog()
    folder = catalog.model(name) if catalog is not None else None
    return folder if folder is not None and folder.is_dir() else None


def _positions(cfg: ExperimentConfig, field: str, m: ModelConfig, name: str) -> None:
    """The source has positions for the ``data.max_length`` tokens a pruning or quantization run reads."""
    if m.position == "learned" and m.max_position < cfg.data.max_length:
        raise ConfigError(
            f"{field}: {name} has {m.max_position} positions (its model.max_position), fewer than data.max_length "
            f"{cfg.data.max_length}"
        )


def _group_size(cfg: ExperimentConfig, field: str, m: ModelConfig) -> None:
    try:
        check_group_size(cfg.quant, m)
    except ValueError as exc:
        raise ConfigError(f"{exc} (the model of {field})") from None


def _fits_init(cfg: ExperimentConfig, m: ModelConfig, name: str) -> None:
    check_architecture(cfg, m)


def _fits_prune(cfg: ExperimentConfig, m: ModelConfig, name: str) -> None:
    if cfg.prune.method != "fewer-layers":
        try:
            check_supported(m)
        except ConfigError as exc:
            raise ConfigError(f"prune.source: {exc}") from None
    have, want = backbone_params(m), cfg.prune.target_params(backbone_params(m))
    if want >= have:
        raise ConfigError(
            f"prune.target: {cfg.prune.target:g} is {want} backbone parameters, but {name} has {have}: a "
            "pruning target is below the source's size (a count, or a fraction of it below 1)"
        )
    _positions(cfg, "prune.source", m, name)


def _fits_quant(cfg: ExperimentConfig, m: ModelConfig, name: str) -> None:
    _positions(cfg, "quant.source", m, name)
    _group_size(cfg, "quant.source", m)


def _fits_finetune(cfg: ExperimentConfig, m: ModelConfig, name: str) -> None:
    f = cfg.finetune
    if m.position == "learned" and m.max_position < f.max_length:
        raise ConfigError(
            f"finetune.max_length: {f.max_length} is more than the {m.max_position} positions of finetune.source "
            f"{name} (its model.max_position); at most {m.max_position}"
        )
    if f.exits and m.num_layers < 2:
        raise ConfigError(
            f"finetune.exits: finetune.source {name} has {m.num_layers} layer, and FastBERT's exits sit after "
            "every layer but the last"
        )
    _group_size(cfg, "finetune.source", m)


FITS: Mapping[str, Callable[[ExperimentConfig, ModelConfig, str], None]] = {
    "init_from": _fits_init,
    "prune.source": _fits_prune,
    "quant.source": _fits_quant,
    "finetune.source": _fits_finetune,
}
"""Each source field -> what its method asks of the source's shape (the source read from its config files)."""


def check_sources_fit(cfg: ExperimentConfig) -> None:
    """Before anything is written (``ablate train``, ``--print-plan``, a study's check): each checkpoint
    folder ``cfg`` starts from or prunes, quantizes or fine-tunes (``init_from``, ``prune.source``,
    ``quant.source``, ``finetune.source``; a local folder or the data catalog's), read from its config
    files alone, fits what its method asks of its shape. ``runs:/`` and hub sources are checked when loaded.

    Raises:
        ConfigError: naming the field, the source and what does not fit.
    """
    named = {
        "init_from": cfg.init_from,
        "prune.source": cfg.prune.source if cfg.regime == "prune" else None,
        "quant.source": cfg.quant.source if cfg.regime == "quant" else None,
        "finetune.source": cfg.finetune.source if cfg.regime == "finetune" else None,
    }
    for field, name in named.items():
        folder = _local_folder(name) if name is not None else None
        if folder is None or name is None:
            continue
        try:
            model = folder_model(folder)
        except ConfigError as exc:
            raise ConfigError(f"{field}: {exc}") from None
        FITS[field](cfg, model, name)
