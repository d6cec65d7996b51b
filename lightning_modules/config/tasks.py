"""The fine-tuning tasks ablate knows by name (GLUE's nine, SQuAD v1.1 and v2.0) and the ``finetune``
fields their names fill in: ``task: mrpc`` (or ``train: nyu-mll/glue:mrpc`` alone) what the task is,
``glue: mrpc`` that and the papers' settings. Fields given beside the name win."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ablate.lightning_modules.config.glue import GLUE

__all__ = ["KNOWN_TASKS", "SQUAD", "HubName", "SquadTask", "parse_hub_name", "task_defaults", "task_of_hub"]

HubName = tuple[str, str | None]
"""A hub dataset: its path (``owner/name`` or ``name``) and config (None: the dataset's default)."""


def parse_hub_name(name: str) -> HubName:
    """``path``, ``owner/path`` (no config: ``rajpurkar/squad``, as the hub names datasets now),
    ``owner/path/config``, ``path:config`` or ``owner/path:config`` as (path, config)."""
    path, sep, config = name.partition(":")
    if not sep:
        parts = name.split("/")
        if len(parts) == 3:
            path, config = "/".join(parts[:-1]), parts[-1]
    return path, config or None


@dataclass(frozen=True)
class SquadTask:
    """SQuAD v1.1 or v2.0: a span task scored by F1 (and exact match), read in BERT's 384-token windows."""

    name: str
    hub: str
    no_answer: bool

    def definition_fields(self) -> dict[str, object]:
        """The ``finetune`` fields that say what the task is."""
        return {
            "task": self.name,
            "kind": "span",
            "train": self.hub,
            "validation": None,
            "metric": "f1",
            "no_answer": self.no_answer,
            "max_length": 384,
            "doc_stride": 128,
        }


SQUAD: Mapping[str, SquadTask] = {
    "squad": SquadTask("squad", "rajpurkar/squad", no_answer=False),
    "squad_v2": SquadTask("squad_v2", "rajpurkar/squad_v2", no_answer=True),
}
"""SQuAD v1.1 and v2.0 by task name."""

KNOWN_TASKS: Mapping[str, Mapping[str, object]] = {
    **{name: task.definition_fields() for name, task in GLUE.items()},
    **{name: task.definition_fields() for name, task in SQUAD.items()},
}
"""Every known task's defining fields, by task name."""

_HUBS = {**{name: task.hub for name, task in GLUE.items()}, **{name: task.hub for name, task in SQUAD.items()}}
_BY_HUB = {parse_hub_name(hub): name for name, hub in _HUBS.items()}


def task_of_hub(name: object) -> str | None:
    """The known task whose hub dataset ``name`` is (``nyu-mll/glue:mrpc``, ``nyu-mll/glue/mrpc``), else None."""
    return _BY_HUB.get(parse_hub_name(name)) if isinstance(name, str) else None


def task_defaults(given: Mapping[str, object]) -> dict[str, object]:
    """The ``finetune`` fields ``given`` (a section as written) with what its names fill in beneath:
    ``glue`` the GLUE table's task and settings (validated every tenth of ``max_steps``, the table's or
    the one given); else a known ``task`` (or, for any task name, a known ``train`` hub dataset) what
    the task is. An unknown ``glue`` is left to the field's own check, which lists the nine."""
    glue = given.get("glue")
    if isinstance(glue, str) and glue in GLUE:
        fields = {**GLUE[glue].finetune_fields(), **given}
        steps = given.get("max_steps")
        if "val_every" not in given and isinstance(steps, int) and steps > 0:  # a tenth of the steps given
            fields["val_every"] = max(1, steps // 10)
        return fields
    task = given.get("task")
    known = task if isinstance(task, str) and task in KNOWN_TASKS else task_of_hub(given.get("train"))
    if known is None:
        return dict(given)
    table = dict(KNOWN_TASKS[known])
    if "kind" in given and given["kind"] != table["kind"]:  # the data as the table reads it, scored another way
        table = {k: v for k, v in table.items() if k not in _KIND_FIELDS}
    if "num_labels" in given and given["num_labels"] != table.get("num_labels"):
        table.pop("label_names", None)
    return {**table, **given}


_KIND_FIELDS = ("kind", "label_names", "num_labels", "metric", "score_metrics", "no_answer", "max_length", "doc_stride")
"""What a task's kind decides: left to the fields given when they name another kind."""
