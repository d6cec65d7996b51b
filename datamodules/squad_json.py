"""A SQuAD file's text parsed strictly (:func:`~ablate.lightning_modules.config.jsonio.parse_json`): the
official JSON, a JSON list of flat rows or JSON lines; the official JSON's ``version`` and its questions'
``is_impossible`` and ``answers`` checked against each other (:func:`check_version`)."""

from __future__ import annotations

from typing import Any

from ablate.lightning_modules.config.jsonio import JsonProblem, parse_json
from ablate.lightning_modules.config.yamlio import Json


def parse_squad(text: str) -> Json:
    """A SQuAD file's text: one JSON value, else JSON lines (a list of them); JsonProblem (a ValueError)
    for a key given twice, NaN, or a version its questions contradict."""
    try:
        tree = parse_json(text)
    except JsonProblem as exc:
        if not str(exc).startswith("invalid JSON"):  # JSON, but not strict: not JSON lines either
            raise
        return [parse_json(line) for line in text.splitlines() if line.strip()]
    if isinstance(tree, dict) and "data" in tree:
        check_version(tree)
    return tree


def check_version(tree: Any) -> None:
    """The official JSON's ``version`` and its questions' ``is_impossible`` say the same: SQuAD 1.1 has no
    unanswerable questions; an unanswerable one has no answers, an answerable one at least one.
    JsonProblem (a ValueError) naming the question and both fields."""
    version = str(tree.get("version", ""))
    for article in tree["data"]:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                impossible = qa.get("is_impossible")
                if impossible is None:
                    continue
                if not isinstance(impossible, bool):
                    raise JsonProblem(f"question {qa.get('id')}: is_impossible {impossible!r}: neither true nor false")
                if impossible and version.lstrip("v").startswith("1."):
                    raise JsonProblem(
                        f"version {version!r} has no unanswerable questions, but question {qa.get('id')} has "
                        "is_impossible true"
                    )
                if impossible == bool(qa["answers"]):
                    have = f"{len(qa['answers'])} answers" if qa["answers"] else "no answers"
                    raise JsonProblem(
                        f"question {qa.get('id')}: is_impossible {str(impossible).lower()}, but answers has {have}"
                    )
