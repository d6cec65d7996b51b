"""One frozen, validated config for a run, every field addressed by its dotted name
(``model.embed_dim``); validated once, when built, a :class:`ConfigError` naming the key
(docs/configuration.md, "Dotted names" and "Errors")."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.distill import DistillConfig, schedule
from ablate.lightning_modules.config.errors import STRICT, FieldError
from ablate.lightning_modules.config.fields import NonNegFloat, NonNegInt, PosInt
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.config.prune import PruneConfig
from ablate.lightning_modules.config.quant import QuantConfig, check_group_size
from ablate.lightning_modules.config.run import OptimConfig, TrackingConfig, TrainerConfig
from ablate.lightning_modules.config.task_kinds import SPAN_METRICS
from ablate.lightning_modules.config.yamlio import dump_yaml


class DataclassInstance(Protocol):
    """Any dataclass instance (what ``dataclasses.asdict`` takes)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


Regime = Literal["pretrain", "distill", "prune", "finetune", "quant"]
Sentence = Literal["sop", "nsp", "none"]  # objective.sentence
# a regime other than pre-training starts from a trained model, named by this field
REGIME_SOURCE: dict[str, str] = {
    "distill": "distill.teacher",
    "prune": "prune.source",
    "finetune": "finetune.source",
    "quant": "quant.source",
}
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
"""``trainer.accelerator`` values Lightning knows."""
MAX_SEED = 2**32 - 1
"""The largest ``seed`` (numpy's, which Lightning seeds too)."""
MAX_INT = 2**63 - 1
"""The largest integer setting (torch's int64; MLflow and Optuna store no larger one)."""
MIN_VOCAB = 64
"""The smallest WordPiece vocabulary a run trains: the 5 special tokens and a corpus's alphabet."""


def prediction_slots(tokens: int, mask_prob: float) -> int:
    """How many MLM predictions a batch of ``tokens`` positions has room for: 1.25x the
    expected count, a multiple of 8, at most ``tokens``.

    The number is fixed for a batch shape, so the model's MLM head runs on a tensor of static
    shape (one compiled graph, CUDA graphs possible, no host sync to learn a count); the
    masking caps its selection to it (:func:`ablate.datamodules.masking.cap_selection`), which
    binds only in rare batches far above the expected count."""
    slots = -(-int(1.25 * tokens * mask_prob) // 8) * 8
    return min(tokens, slots)


@dataclass(frozen=True, config=STRICT)
class ObjectiveConfig:
    """Pre-training objective.

    Attributes:
        sentence: sentence-level task, ``sop`` (ALBERT), ``nsp`` (BERT) or ``none``.
        masking: ``token``, ``whole_word`` or ALBERT's ``ngram`` span masking.
        mask_prob: fraction of tokens selected for prediction (80% [MASK], 10% random,
            10% kept).
        max_ngram: longest n-gram for ``ngram`` masking (ALBERT uses 3).
        sentence_weight: weight of the sentence loss next to the MLM loss.
    """

    sentence: Sentence = "sop"
    masking: Literal["token", "whole_word", "ngram"] = "token"
    mask_prob: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.15
    max_ngram: PosInt = 3
    sentence_weight: NonNegFloat = 1.0


@dataclass(frozen=True, config=STRICT)
class DataConfig:
    """Corpus, tokenizer and batching.

    Attributes:
        corpus: a builtin name (``norvig-big``), a local file, glob or directory
            (``text``, ``json``/``jsonl`` optionally ``.gz``, ``parquet``), or a
            ``datasets`` hub name (``Salesforce/wikitext:wikitext-103-raw-v1``), streamed.
        text_field: column holding the document text in json/parquet/hub corpora.
        text_doc_chars: in ``.txt`` corpora (and ``norvig-big``), a document groups
            consecutive paragraphs up to about this many characters, so that books whose
            paragraphs are single lines still give pairs that fill ``max_length``;
            0 = one paragraph per document.
        max_length: tokens per packed sequence, [CLS] and [SEP]s included.
        lowercase: lowercase and strip accents before WordPiece (with ``tokenizer``: only for a
            folder with ``vocab.txt`` and no ``tokenizer_config.json`` saying ``do_lower_case``).
        tokenizer: an existing tokenizer instead of one trained for the run: a hub model name
            (``bert-base-uncased``, or the data catalog's ``models:`` entry of that name) or a local
            folder (a transformers tokenizer folder with ``tokenizer.json``, or ``vocab.txt`` alone);
            ``model.vocab_size`` must be its size. None: a WordPiece tokenizer is trained on the corpus.
        tokenizer_docs: documents read to train the WordPiece tokenizer.
        val_fraction: fraction of documents held out for validation (by hash).
        short_seq_prob: probability of a shorter target length (BERT's trick).
        batch_size: sequences per batch.
        num_workers: DataLoader worker processes per device, or ``auto`` (default): one per
            core the device's share of the machine has, less one for the training process,
            at least 1 (:meth:`workers`); the number used is tagged on the run
            (``ablate.num_workers``). The data stream depends on it: set a number to get the
            same batches on another machine.
        shuffle_buffer: examples in the streaming shuffle buffer (0 = no shuffle).
        cache_dir: where trained tokenizers are cached; None = ``~/.cache/ablate``.
    """

    corpus: str = "norvig-big"
    text_field: str = "text"
    text_doc_chars: NonNegInt = 4000
    max_length: Annotated[int, Field(ge=16)] = 128
    lowercase: bool = True
    tokenizer: str | None = Field(default=None, min_length=1)
    tokenizer_docs: PosInt = 20000
    val_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.02
    short_seq_prob: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    batch_size: PosInt = 32
    num_workers: NonNegInt | Literal["auto"] = "auto"
    shuffle_buffer: NonNegInt = 1000
    cache_dir: str | None = None

    def workers(self, devices: int = 1) -> int:
        """``num_workers`` resolved for a run on ``devices`` devices of this machine."""
        if self.num_workers != "auto":
            return self.num_workers
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
        return max(1, cores // max(1, devices) - 1)


@dataclass(frozen=True, config=STRICT)
class ExperimentConfig:
    """Everything one training run needs.

    Attributes:
        regime: what the run is: ``pretrain``, ``distill`` (from ``distill.teacher``), ``prune``
            (``prune.source``), ``finetune`` (``finetune.source``) or ``quant`` (``quant.source``:
            quantize a trained model; ``quant.method`` without a source quantizes the model any
            other regime trains, when it ends). Left out, it is the regime
            whose source is set (``pretrain`` when none is); a config naming two regimes' sources,
            or a regime without its own, is an error, as is a field set in another regime's
            section (``distill.*`` in a pre-training run). Logged as the param ``regime``.
        init_from: start from a checkpoint's weights instead of a random initialisation: a
            transformers checkpoint folder (BERT, ALBERT, MobileBERT ``*ForPreTraining``) or an
            ``ablate export`` folder. ``model`` must describe the checkpoint's architecture
            (``dropout`` and ``init_std`` may differ); otherwise the run stops with an error
            listing the ``model.key=value`` overrides that match it. See
            :func:`ablate.lightning_modules.interop.pretrained.initial_model`.
    """

    name: str = "experiment"
    regime: Regime | None = None
    seed: int = 0
    init_from: str | None = None
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    distill: DistillConfig = dataclasses.field(default_factory=DistillConfig)
    prune: PruneConfig = dataclasses.field(default_factory=PruneConfig)
    finetune: FinetuneConfig = dataclasses.field(default_factory=FinetuneConfig)
    quant: QuantConfig = dataclasses.field(default_factory=QuantConfig)

    @model_validator(mode="after")
    def _resolve_regime(self) -> ExperimentConfig:
        """The run's regime: as named, else the one whose source is set, else ``pretrain``.

        Sources of two regimes, or a regime without its source (or with another's), are errors.
        """
        sources = {
            "distill": self.distill.teacher,
            "prune": self.prune.source,
            "finetune": self.finetune.source,
            "quant": self.quant.source,
        }
        named = [r for r, source in sources.items() if source is not None]
        task_teacher = "finetune" in named and "distill" in named  # task distillation: a fine-tuned teacher
        if task_teacher:
            named.remove("distill")
        if len(named) > 1:
            first, second = (REGIME_SOURCE[r] for r in named[:2])
            regimes = ", ".join(("pretrain", *REGIME_SOURCE))
            raise FieldError(f"{second}", f"a run has one regime ({regimes}); {first} is set too")
        found = named[0] if named else "pretrain"
        if self.regime is not None and self.regime != found:
            if self.regime == "pretrain":
                raise FieldError(f"{REGIME_SOURCE[found]}", f"set, but regime is 'pretrain' (use regime: {found})")
            instead = f" ({REGIME_SOURCE[found]} is set instead: regime {found})" if found != "pretrain" else ""
            raise FieldError(f"{REGIME_SOURCE[self.regime]}", f"required by regime '{self.regime}'{instead}")
        object.__setattr__(self, "regime", found)  # frozen: resolved once, here
        for regime in ("distill", "prune", "finetune"):  # the other regimes' sections stay at their defaults
            if regime == "distill" and task_teacher:
                continue
            section = getattr(self, regime)
            default = type(section)()
            changed = [
                f.name for f in dataclasses.fields(section) if getattr(section, f.name) != getattr(default, f.name)
            ]
            if regime != found and changed:
                also = (
                    " or a fine-tuning run's task distillation" if regime == "distill" and found == "finetune" else ""
                )
                raise FieldError(
                    f"{regime}.{changed[0]}",
                    f"only for a {regime} run ({REGIME_SOURCE[regime]}){also}; this run is {found!r}",
                )
        return self

    @model_validator(mode="after")
    def _check_distill(self) -> ExperimentConfig:
        if self.distill.teacher is None:
            return self
        if self.distill.strategy == "progressive" and self.model.sharing != "none":
            raise FieldError(
                "distill.strategy",
                f"'progressive' freezes layers one at a time and needs "
                f"model.sharing 'none', not {self.model.sharing!r}",
            )
        d, default = self.distill, DistillConfig()
        fine_tuning = self.regime == "finetune"
        if fine_tuning and d.mlm_weight != default.mlm_weight:
            raise FieldError(
                "distill.mlm_weight", "a fine-tuning run has no MLM; the task's labels weigh distill.label_weight"
            )
        if not fine_tuning and d.label_weight != default.label_weight:
            raise FieldError("distill.label_weight", "only for task distillation (a fine-tuning run with a teacher)")
        if fine_tuning and (d.init_layers != "none" or d.init_embeddings != "none"):
            field = "init_layers" if d.init_layers != "none" else "init_embeddings"
            raise FieldError(
                f"distill.{field}",
                "a fine-tuning run starts from its finetune.source; initialise from the "
                "teacher when pre-training (regime distill)",
            )
        if fine_tuning and (d.mix_prob is not None or d.dual_weight is not None):
            field = "mix_prob" if d.mix_prob is not None else "dual_weight"
            raise FieldError(
                f"distill.{field}",
                "dual training (a student with its own vocabulary) is for pre-training "
                "(regime distill); task distillation uses the source's vocabulary",
            )
        if d.projection == "shared" and not {"fmt", "embed", "cos"} & set(d.transfer_weights):
            raise FieldError(
                "distill.projection",
                "'shared' projects the student's hidden states for fmt_weight, embed_weight "
                "or cos_weight, and all three are 0",
            )
        if self.distill.layer_map is not None and len(self.distill.layer_map) != self.model.num_layers:
            raise FieldError(
                "distill.layer_map",
                f"gives {len(self.distill.layer_map)} layers but the student has "
                f"model.num_layers {self.model.num_layers}",
            )
        steps, field = (
            (self.finetune.max_steps, "finetune.max_steps")
            if fine_tuning
            else (self.trainer.max_steps, "trainer.max_steps")
        )
        try:
            schedule(self.distill, self.model.num_layers, steps, steps_field=field)
        except FieldError as exc:
            raise FieldError(f"distill.{exc.key}", exc.msg) from None
        return self

    @model_validator(mode="after")
    def _check_sections(self) -> ExperimentConfig:
        """Constraints between sections that would otherwise fail inside the training loop, after
        the MLflow run exists: ``key: what is wrong (the other key and its value)``."""
        if not 0 <= self.seed <= MAX_SEED:
            raise FieldError("seed", f"must be between 0 and {MAX_SEED} (numpy's range), got {self.seed}")
        for key, value in flatten(self).items():
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                raise FieldError(f"{key}", f"{value} is past the largest integer a run can use ({MAX_INT})")
        if self.trainer.accelerator not in ACCELERATORS:
            raise FieldError(
                "trainer.accelerator", f"{self.trainer.accelerator!r} is not one of {', '.join(ACCELERATORS)}"
            )
        if self.quant.method == "qat-int8" and self.regime == "prune":
            raise FieldError(
                "quant.method",
                "'qat-int8' trains with fake quantization, which pruning's phases do not; "
                "quantize the pruned model after training (dynamic-int8, weight-int8 ...)",
            )
        if self.quant.qat_steps and self.regime not in ("finetune", "quant"):
            raise FieldError(
                "quant.qat_steps",
                f"quantization-aware training at 2-8 bits follows a trained model: a fine-tuning "
                f"run (Q-BERT) or the quant regime (quant.source), not regime {self.regime!r}",
            )
        _check_finetune(self.finetune)
        if self.regime in ("pretrain", "distill"):  # otherwise the model is the source's: checked when it is loaded
            self._check_own_model()
        return self

    def _check_own_model(self) -> None:
        """The model the run builds (pre-training, distillation) against its data, objective, trainer and quant."""
        m, data = self.model, self.data
        if m.vocab_size < MIN_VOCAB and data.tokenizer is None:  # the run trains its WordPiece tokenizer of this size
            raise FieldError(
                "model.vocab_size",
                f"{m.vocab_size} tokens cannot hold the 5 special tokens and a corpus's "
                f"alphabet; a run's tokenizer needs at least {MIN_VOCAB}",
            )
        check_group_size(self.quant, m)
        # the default length is not held against a model with fewer positions: such configs describe
        # models (exports, tests); a run of one sets its own data.max_length
        if m.position == "learned" and m.max_position < data.max_length != DataConfig().max_length:
            raise FieldError(
                "data.max_length",
                f"{data.max_length} tokens, but the position embedding has "
                f"model.max_position {m.max_position} rows (raise model.max_position or lower data.max_length)",
            )
        if m.token_types == 1 and (self.objective.sentence != "none" or self.trainer.intrinsic):
            why = (
                f"objective.sentence {self.objective.sentence!r} puts a second segment (token type 1) in each sequence"
                if self.objective.sentence != "none"
                else "trainer.intrinsic probes NSP and SOP on segment pairs (token type 1)"
            )
            raise FieldError("model.token_types", f"1 row, but {why}; use 2, or 0 for no token-type embedding")


def _check_finetune(f: FinetuneConfig) -> None:
    """The fine-tuning section's fields against each other (exits, task kind, metric, lengths)."""
    if f.exits != (f.exit_steps > 0):
        raise FieldError(
            "finetune.exit_steps",
            "FastBERT's exits (finetune.exits) train by self-distillation for exit_steps > 0 "
            f"steps after fine-tuning; got exits={f.exits}, exit_steps={f.exit_steps}",
        )
    if f.exit_at is not None and not f.exits:
        raise FieldError("finetune.exit_at", "a speed to use the model at needs FastBERT's exits (finetune.exits)")
    if (f.kind == "span") != (f.metric in SPAN_METRICS) and f.metric != "f1":
        what = "a span task is scored by exact or f1" if f.kind == "span" else "exact is for a span task"
        raise FieldError("finetune.metric", f"{f.metric!r} with finetune.kind {f.kind}: {what} (SQuAD's EM, F1)")
    if f.kind == "span" and f.exits:
        raise FieldError("finetune.exits", "FastBERT's exits classify [CLS]; a span task (kind span) has none")
    if f.kind == "span" and f.augment_copies > 0:
        raise FieldError(
            "finetune.augment_copies",
            "TinyBERT's augmentation replaces a sentence's words; a span task's answers are characters of its "
            "context (finetune.kind span)",
        )
    if f.kind == "span" and f.max_length - f.max_query_length - 3 < 1:
        raise FieldError(
            "finetune.max_query_length",
            f"{f.max_query_length} question tokens leave no room for the context in finetune.max_length "
            f"{f.max_length} ([CLS] question [SEP] context [SEP])",
        )


def to_dict(cfg: DataclassInstance) -> dict[str, object]:
    """Nested plain-Python dict of a config dataclass."""
    return dataclasses.asdict(cfg)


def flatten(cfg: DataclassInstance | Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Dotted-name -> value for every leaf field: the MLflow params and report columns."""
    out: dict[str, object] = {}
    for key, value in (cfg if isinstance(cfg, Mapping) else to_dict(cfg)).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def to_yaml(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML, loadable by :func:`load_config`."""
    text = dump_yaml(to_dict(cfg), sort_keys=False)
    return text


def config_digest(cfg: ExperimentConfig) -> str:
    """sha256 of the resolved config's YAML: equal digests, equal runs."""
    return hashlib.sha256(to_yaml(cfg).encode()).hexdigest()


def run_params(cfg: ExperimentConfig) -> dict[str, object]:
    """The fields the run uses, dotted: :func:`flatten` without the sections of the other regimes
    (a pre-training run logs no ``distill.*``, ``prune.*`` or ``finetune.*``), and of ``quant`` the
    fields its method reads (``quant.method`` always: a report's column for every run)."""
    used = (cfg.regime, "quant", *(("distill",) if cfg.distill.teacher is not None else ()))
    unused = tuple(f"{regime}." for regime in REGIME_SOURCE if regime not in used)
    quant = {f"quant.{name}" for name in cfg.quant.used_fields() if name != "source" or cfg.regime == "quant"}
    return {
        k: v for k, v in flatten(cfg).items() if not k.startswith(unused) and (not k.startswith("quant.") or k in quant)
    }


def field_names() -> set[str]:
    """Every valid dotted key."""
    return set(flatten(ExperimentConfig()))
