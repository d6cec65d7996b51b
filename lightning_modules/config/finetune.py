"""The ``finetune`` section of the config: GLUE-style classification on a pre-trained encoder.

A run fine-tunes when ``finetune.source`` names a pre-trained model; otherwise the section
is inert.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import ArgsKwargs

from ablate.lightning_modules.config.errors import STRICT, FieldError
from ablate.lightning_modules.config.glue import GlueName
from ablate.lightning_modules.config.task_kinds import KIND_METRICS, Kind, Metric
from ablate.lightning_modules.config.tasks import task_defaults


@dataclass(frozen=True, config=STRICT)
class DevSet:
    """Another dev set scored beside ``finetune.validation`` at every validation (MNLI's mismatched one).

    Attributes:
        name: its metrics' prefix: logged as ``<name>/<metric>`` (``mnli-mm/accuracy``).
        data: a local file or a hub name; None: the dev data's dataset (``finetune.validation``, else
            ``finetune.train``'s hub dataset).
        split: the split of the hub dataset (``validation_mismatched``); None: ``validation``. Not for a
            local file.
    """

    name: str = Field(pattern=r"^[\w.-]+$")
    data: str | None = Field(default=None, min_length=1)
    split: str | None = Field(default=None, pattern=r"^[\w.-]+$")


@dataclass(frozen=True, config=STRICT)
class FinetuneConfig:
    """Task, data and schedule of a fine-tuning run.

    Attributes:
        source: the pre-trained model: ``runs:/RUN_ID`` (an ablate run of this MLflow store,
            whose tokenizer is used), an ``ablate export`` folder or a transformers checkpoint.
            None: no fine-tuning.
        task: the task's name: metrics are logged as ``<task>/accuracy`` etc. A known task's name (a GLUE
            task, ``squad``, ``squad_v2``; :data:`~ablate.lightning_modules.config.tasks.KNOWN_TASKS`) fills
            in what the task is (data, columns, labels, kind, metrics, dev sets; SQuAD's windows) beneath
            the fields given; so does a known ``train`` hub dataset (``nyu-mll/glue:mrpc``) for any name.
        glue: a GLUE task (``mrpc``): the task as ``task`` fills it in, and the papers' settings from
            the GLUE table (learning rate, batch size, steps, length; validated every tenth of the
            steps, never stopped early), beneath the fields given. None: the task as given.
        kind: what the task predicts: ``classification`` (``num_labels`` classes), ``regression``
            (one output; ``num_labels`` 1) or ``span`` (SQuAD-style question answering).
        label_names: each label's name, in label order (``negative``, ``positive`` for SST-2); the
            exported model's ``id2label``. None: ``LABEL_0`` ...
        train: training data: a local ``.tsv``/``.csv``/``.jsonl`` file, or a ``datasets``
            hub name (``nyu-mll/glue:sst2``; its ``train`` split), read from local copies where the
            data catalog (``ABLATE_DATA_CATALOG``) maps it.
        validation: dev data, as ``train`` (when None: ``train``'s hub dataset, its ``validation`` split).
        train_split: the split of ``train``'s hub dataset to train on; None: ``train``. Not for a local file.
        validation_split: the split of the dev hub dataset; None: ``validation``. Not for a local file.
        train_examples: use only the first N training examples (a low-resource task; what
            ``augment_copies`` then enlarges); None = all of them.
        validation_examples: score only the first N dev examples (a quick look; ``--smoke``); None =
            the whole dev set, which is what a result to report is scored on.
        text_fields: one column (single sentence) or two (sentence pair).
        label_field: the label column: integers in ``[0, num_labels)`` (classification), numbers
            (regression).
        num_labels: classes; 1 for regression (one output).
        extra_validation: more dev sets, each scored like the first one at every validation and logged
            under its own name (MNLI: ``validation_mismatched`` as ``mnli-mm``).
        score_metrics: the dev metrics whose mean is the task's score ``<task>/score`` (over every dev
            set: MNLI's matched and mismatched accuracy), as GLUE scores a task (MRPC: F1 and
            accuracy); None: ``metric`` alone.
        max_length: tokens per example ([CLS] a [SEP] (b [SEP]), truncated).
        batch_size: examples per batch.
        lr: AdamW learning rate (warmup 10 %, then linear decay).
        max_steps: most optimizer steps.
        val_every: validate on the dev set every this many steps.
        patience: stop after this many validations without improving ``metric``.
        metric: the dev metric (of the first dev set) for early stopping and the run's result; one
            of its kind's (:data:`KIND_METRICS`).
        augment_copies: TinyBERT's data augmentation: this many augmented copies of each
            training example are added to the training set (0 = none; the paper uses 20).
        augment_prob: the probability that a word of a copy is replaced by a candidate from
            the masked LM's predictions for it (TinyBERT's p_t).
        augment_top_k: candidates per word: the masked LM's top K predictions (TinyBERT's K).
        augment_model: the masked LM that proposes candidates: ``runs:/RUN_ID``, an ``ablate
            export`` folder or a transformers checkpoint, with its MLM head; None = the
            fine-tuned model's own source (``finetune.source``).
        exits: FastBERT: an exit classifier after every layer but the last, trained by
            self-distillation from the final classifier once fine-tuning ends.
        exit_steps: steps of FastBERT's self-distillation (the backbone and final classifier
            frozen; only the exits train).
        exit_speeds: the speed thresholds evaluated: a sample leaves at the first layer whose
            exit's normalized entropy is below the threshold (0 = every layer runs).
        exit_at: the speed the fine-tuned model is used at (FastBERT's product: the model with
            its threshold): the run's ``<task>/final_<metric>`` and ``<task>/latency_ms`` are early
            exit's at that speed; None = the full model's.
        doc_stride: a span task: a context longer than ``max_length`` is read in windows that start
            this many tokens apart (BERT's ``doc_stride``).
        max_query_length: a span task: questions are cut to this many tokens.
        max_answer_length: a span task: the longest answer predicted, in tokens.
        n_best: a span task: the best start and end positions a window's answers are chosen among.
        no_answer: a span task with unanswerable questions (SQuAD 2.0): [CLS]'s span is the no-answer
            score, compared with the best span against a threshold chosen on the dev set.
    """

    source: str | None = None
    task: str = Field(default="sst2", pattern=r"^[\w.-]+$")
    glue: GlueName | None = None
    kind: Kind = "classification"
    label_names: tuple[str, ...] | None = Field(default=None, min_length=1)
    train: str | None = None
    validation: str | None = None
    train_split: str | None = Field(default=None, pattern=r"^[\w.-]+$")
    validation_split: str | None = Field(default=None, pattern=r"^[\w.-]+$")
    train_examples: Annotated[int, Field(gt=0)] | None = None
    validation_examples: Annotated[int, Field(gt=0)] | None = None
    text_fields: tuple[str, ...] = Field(default=("sentence",), min_length=1, max_length=2)
    label_field: str = "label"
    num_labels: Annotated[int, Field(ge=1)] = 2
    extra_validation: tuple[DevSet, ...] = ()
    score_metrics: tuple[Metric, ...] | None = Field(default=None, min_length=1)
    max_length: Annotated[int, Field(ge=8)] = 128
    batch_size: Annotated[int, Field(gt=0)] = 32
    lr: Annotated[float, Field(gt=0.0)] = 1e-4
    max_steps: Annotated[int, Field(gt=0)] = 1000
    val_every: Annotated[int, Field(gt=0)] = 100
    patience: Annotated[int, Field(ge=1)] = 3
    metric: Metric = "accuracy"
    augment_copies: Annotated[int, Field(ge=0, le=100)] = 0
    augment_prob: Annotated[float, Field(gt=0.0, le=1.0)] = 0.4
    augment_top_k: Annotated[int, Field(ge=1, le=1000)] = 15
    augment_model: str | None = None
    exits: bool = False
    exit_steps: Annotated[int, Field(ge=0)] = 0
    exit_speeds: tuple[Annotated[float, Field(ge=0.0, le=1.0)], ...] = (0.0, 0.1, 0.2, 0.3, 0.5, 0.8)
    exit_at: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    doc_stride: Annotated[int, Field(ge=1)] = 128
    max_query_length: Annotated[int, Field(ge=1)] = 64
    max_answer_length: Annotated[int, Field(ge=1)] = 30
    n_best: Annotated[int, Field(ge=1)] = 20
    no_answer: bool = False

    @model_validator(mode="before")
    @classmethod
    def _task_defaults(cls, data: object) -> object:
        """What a known task's name fills in beneath the fields given (:func:`task_defaults`)."""
        given = data.kwargs if isinstance(data, ArgsKwargs) else data
        if not isinstance(given, dict):
            return data
        fields = task_defaults(given)
        return ArgsKwargs(data.args, fields) if isinstance(data, ArgsKwargs) else fields

    @model_validator(mode="after")
    def _check_kind(self) -> FinetuneConfig:
        if self.kind == "regression" and self.num_labels != 1:
            raise FieldError("num_labels", f"{self.num_labels}: a regression task has one output (num_labels: 1)")
        if self.kind == "classification" and self.num_labels < 2:
            raise FieldError("num_labels", f"{self.num_labels}: a classification task has 2 classes or more")
        allowed = KIND_METRICS[self.kind]
        for name in (self.metric, *(self.score_metrics or ())):
            if name not in allowed:
                field = "metric" if name == self.metric else "score_metrics"
                raise FieldError(
                    field, f"{name!r} does not score a {self.kind} task (its metrics: {', '.join(allowed)})"
                )
        if self.label_names is not None and self.kind != "span" and len(self.label_names) != self.num_labels:
            raise FieldError(
                "label_names", f"{len(self.label_names)} names for num_labels {self.num_labels} (one name per output)"
            )
        if self.kind == "regression" and self.exits:
            raise FieldError(
                "exits", "FastBERT's exits leave by the entropy of a class distribution; a regression has none"
            )
        names = [self.task, *(d.name for d in self.extra_validation)]
        if len(set(names)) != len(names):
            raise FieldError("extra_validation", f"dev sets must have names of their own, not {names}")
        return self
