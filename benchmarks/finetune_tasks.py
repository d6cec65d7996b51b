"""The tasks ``ablate bench loop --regime finetune --task NAME`` fine-tunes on, and their data: SST-2 (a
folder, else synthetic sentences), another GLUE task or SQuAD by hub name, read only from the data
catalog's local copies (:func:`check_task` refuses a task it does not map, before anything runs;
docs/performance.md). This module imports no torch: the CLI checks a task before it loads one."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.glue import GLUE

if TYPE_CHECKING:  # the data module imports torch
    from ablate.datamodules.squad import Question


@dataclass(frozen=True)
class SquadTask:
    """A SQuAD version: its hub name, whether questions may have no answer, what the table calls it."""

    hub: str
    no_answer: bool
    title: str


SQUAD = {
    "squad": SquadTask("rajpurkar/squad", False, "SQuAD v1.1"),
    "squad_v2": SquadTask("rajpurkar/squad_v2", True, "SQuAD v2.0"),
}
TASKS = (*GLUE, *SQUAD)
"""What ``--task`` may name: the nine GLUE tasks, then SQuAD's two versions."""
DEFAULT_TASK = "sst2"
SQUAD_DEV = 200
"""Most dev questions a SQuAD run scores (after the training questions, when it trains on the dev file;
at most half as many as it trains on: a short run's validation stays short)."""
_KEY = "--task"


def hub_name(task: str) -> str:
    """The task's hub name (``nyu-mll/glue:mrpc``, ``rajpurkar/squad``)."""
    return SQUAD[task].hub if task in SQUAD else GLUE[task].hub


def _mapped_splits(task: str) -> tuple[str, ...]:
    """The splits the data catalog maps for ``task``'s hub name.

    Raises:
        ConfigError: no catalog is set, or it does not map the hub name.
    """
    from ablate.datamodules.catalog import ENV, active_catalog
    from ablate.lightning_modules.config.tasks import parse_hub_name

    hub = hub_name(task)
    catalog = active_catalog()
    if catalog is None:
        raise ConfigError(
            f"{_KEY} {task}: the bench reads {hub} from local copies through the data catalog, and ${ENV} is "
            f"unset (map {hub}'s splits to files: docs/data.md)"
        )
    splits = catalog.entries.get(parse_hub_name(hub))
    if splits is None:
        raise ConfigError(f"{_KEY} {task}: {hub} is not in the data catalog {catalog.file} (${ENV}); map its splits")
    return tuple(splits)


def _needed(task: str) -> tuple[str, ...]:
    """The splits the bench reads of ``task``: GLUE's train and first dev set; SQuAD's train and
    validation where the catalog maps train, else validation alone (its first questions train)."""
    if task in SQUAD:
        return ("train", "validation") if "train" in _mapped_splits(task) else ("validation",)
    return ("train", GLUE[task].dev_sets[0].split)


def check_task(task: str) -> None:
    """``task``'s data is reachable: its splits are mapped by the data catalog to existing files.

    Raises:
        ConfigError: not a task; no catalog, or one that does not map the task.
        DataError: the catalog maps the task without a split the bench reads, or to missing files.
    """
    from ablate.datamodules.sources import resolve_task

    if task not in TASKS:
        raise ConfigError(f"{_KEY}: {task!r}: not a task (expected one of {', '.join(TASKS)})")
    if task == DEFAULT_TASK:
        return  # SST-2: --sst2, $ABLATE_SST2 or synthetic sentences, as before
    _mapped_splits(task)
    for split in _needed(task):
        src = resolve_task(f"{_KEY} {task}", hub_name(task), split)
        if not src.files:  # mapped, yet resolved to the hub: cannot happen with a catalog entry
            raise ConfigError(f"{_KEY} {task}: {hub_name(task)}'s {split} split is not mapped to local files")


def glue_config(task: str, source: str, max_length: int, batch: int, steps: int) -> tuple[FinetuneConfig, str]:
    """The ``finetune`` section of a GLUE task's bench run (its data through the catalog, scored once
    at the end) and where its data comes from, for the heading."""
    fields: dict[str, Any] = {  # validated by FinetuneConfig
        **GLUE[task].finetune_fields(),
        "source": source,
        "max_length": max_length,
        "batch_size": batch,
        "max_steps": steps,
        "val_every": steps,
    }
    check_task(task)
    return FinetuneConfig(**fields), f"{task.upper()} ({GLUE[task].hub} train, through the data catalog)"


def _write_rows(path: Path, questions: list[Question]) -> None:
    """``questions`` as the hub's flat rows, one JSON line each."""
    with path.open("w", encoding="utf-8") as fh:
        for q in questions:
            answers = {"text": list(q.answers), "answer_start": list(q.starts)}
            row = {"id": q.id, "title": "", "context": q.context, "question": q.question, "answers": answers}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def squad_config(
    task: str, source: str, max_length: int, batch: int, steps: int, root: Path
) -> tuple[FinetuneConfig, str]:
    """The ``finetune`` section of a SQuAD bench run and where its data comes from, for the heading.

    Enough training questions for ``steps`` batches of ``batch`` windows (a question gives one window or
    more); with the dev file alone, its first questions are written to ``root`` as the training file
    and the next :data:`SQUAD_DEV` as the dev file."""
    from ablate.datamodules.sources import resolve_task
    from ablate.datamodules.squad import read_questions

    check_task(task)
    sq = SQUAD[task]
    train_n = steps * batch
    base = FinetuneConfig(
        source=source,
        task=task,
        kind="span",
        metric="f1",
        no_answer=sq.no_answer,
        train=sq.hub,
        max_length=max_length,
        doc_stride=max(1, max_length // 3),
        max_query_length=min(64, max_length // 2),  # BERT's 64; at most half the window
        batch_size=batch,
        max_steps=steps,
        val_every=steps,
    )
    if "train" in _needed(task):
        cfg = replace(base, train_examples=train_n, validation_examples=min(SQUAD_DEV, train_n // 2))
        return cfg, f"{sq.title} ({sq.hub}: its first {train_n:,} train questions, through the data catalog)"
    dev = resolve_task(f"{_KEY} {task}", sq.hub, "validation")
    questions = read_questions(dev, None, sq.no_answer)
    dev_n = min(SQUAD_DEV, train_n // 2)
    train_n = min(train_n, len(questions) - dev_n)
    if train_n < batch:
        raise ConfigError(f"{_KEY} {task}: {dev.files[0]}: {len(questions)} questions, too few to train on and score")
    root.mkdir(parents=True, exist_ok=True)
    train, validation = root / f"{task}-train.jsonl", root / f"{task}-dev.jsonl"
    _write_rows(train, questions[:train_n])
    _write_rows(validation, questions[train_n : train_n + dev_n])
    cfg = replace(base, train=str(train), validation=str(validation))
    what = (
        f"{sq.title} ({sq.hub}: only its dev file is mapped: its first {train_n:,} questions train and the next "
        f"{dev_n} score, written to temporary files)"
    )
    return cfg, what
