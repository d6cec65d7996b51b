"""The ``finetune`` section of the config: GLUE-style classification on a pre-trained encoder.

A run fine-tunes when ``finetune.source`` names a pre-trained model; otherwise the section
is inert.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT

Metric = Literal["accuracy", "f1", "mcc", "exact"]
SPAN_METRICS = ("exact", "f1")
"""A span task's metrics: SQuAD's exact match and token F1 (``f1`` scores classification too: macro F1)."""
Kind = Literal["classification", "regression", "span"]
"""What a task predicts: a class (cross-entropy), a number (one output, MSE; GLUE's STS-B) or an answer
span in a context (SQuAD's start and end logits)."""


@dataclass(frozen=True, config=STRICT)
class FinetuneConfig:
    """Task, data and schedule of a fine-tuning run.

    Attributes:
        source: the pre-trained model: ``runs:/RUN_ID`` (an ablate run of this MLflow store,
            whose tokenizer is used), an ``ablate export`` folder or a transformers checkpoint.
            None: no fine-tuning.
        task: the task's name: metrics are logged as ``<task>/accuracy`` etc.
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
        label_field: the integer label column.
        num_labels: classes.
        max_length: tokens per example ([CLS] a [SEP] (b [SEP]), truncated).
        batch_size: examples per batch.
        lr: AdamW learning rate (warmup 10 %, then linear decay).
        max_steps: most optimizer steps.
        val_every: validate on the dev set every this many steps.
        patience: stop after this many validations without improving ``metric``.
        metric: the dev metric for early stopping and the run's result.
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
    num_labels: Annotated[int, Field(ge=2)] = 2
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
