"""The one JSON reader of ablate, strict as :mod:`~ablate.lightning_modules.config.yamlio` is for YAML: a key
given twice in one object, ``NaN`` or ``Infinity`` where a number goes, or another top-level type than the
caller reads is an error naming the file, the key and its line (Python's ``json`` accepts all three)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ablate.lightning_modules.config.errors import AblateError, ConfigError
from ablate.lightning_modules.config.yamlio import Json

_CONSTANT = re.compile(r'(?:"((?:[^"\\]|\\.)*)"\s*:\s*)?(?<![\w.])(-?Infinity|NaN)(?![\w.])')


class JsonProblem(ValueError):
    """What makes a JSON text unacceptable, said in one line (``duplicate key 'a' at line 3``)."""


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def _pairs(text: str) -> Any:
    """The ``object_pairs_hook`` of :func:`parse_json`: a dict, or JsonProblem for a key given twice."""

    def hook(pairs: list[tuple[str, Json]]) -> dict[str, Json]:
        out: dict[str, Json] = {}
        for key, value in pairs:
            if key in out:
                found = [m.start() for m in re.finditer(re.escape(json.dumps(key)) + r"\s*:", text)]
                where = f" (lines {_line(text, found[0])} and {_line(text, found[1])})" if len(found) == 2 else ""
                raise JsonProblem(f"duplicate key {key!r} in one object{where}; a key may appear once")
            out[key] = value
        return out

    return hook


def _constant(text: str) -> Any:
    """The ``parse_constant`` of :func:`parse_json`: JsonProblem naming the key of ``NaN`` / ``Infinity``."""

    def refuse(name: str) -> float:
        found = _CONSTANT.search(text)
        key = f"{found.group(1)!r}: " if found is not None and found.group(1) is not None else ""
        where = f" at line {_line(text, found.start(2))}" if found is not None else ""
        raise JsonProblem(f"{key}{name}{where} is not a number (JSON has no NaN or Infinity)")

    return refuse


def parse_json(text: str, expect: type | None = None) -> Json:
    """``text`` parsed strictly: JsonProblem (one line, no file) for a syntax error, a key given twice,
    ``NaN``/``Infinity``, or a top-level value that is not an ``expect`` (``dict``, ``list``)."""
    try:
        tree: Json = json.loads(text, object_pairs_hook=_pairs(text), parse_constant=_constant(text))
    except json.JSONDecodeError as exc:
        raise JsonProblem(f"invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise JsonProblem("invalid JSON: nested too deeply") from None
    if expect is not None and not isinstance(tree, expect):
        want = "an object" if expect is dict else "a list" if expect is list else expect.__name__
        raise JsonProblem(f"{want} expected at the top, not {type(tree).__name__ if tree is not None else 'null'}")
    return tree


def read_json(path: str | Path, expect: type | None = dict, error: type[AblateError] = ConfigError) -> Json:
    """The JSON file ``path`` parsed by :func:`parse_json`; ``error`` (``ConfigError``, or ``DataError``
    for a data file) ``PATH: problem`` when it is unreadable, not UTF-8 or not strict JSON."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return parse_json(text, expect)
    except JsonProblem as exc:
        raise error(f"{path}: {exc}") from None
