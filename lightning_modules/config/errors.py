"""Errors a user can cause. The CLI turns each into one line ``error: ...`` and exit status 2."""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Collection
from types import ModuleType

from pydantic import ConfigDict, ValidationError


class AblateError(Exception):
    """Base class for every error caused by user input (config, corpus, storage, ...).

    The message must name the offending key or file, e.g. ``model.num_heads: ...``.

    Raised in a DataLoader worker (a corrupt corpus record), it reaches the training process
    rebuilt by torch from a message ``Caught DataError in DataLoader worker process 0.`` plus
    the worker's traceback; the error keeps only the worker's own one-line message
    (:func:`worker_message`).
    """

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (worker_message(args[0], type(self)),)
        super().__init__(*args)


class FieldError(ValueError):
    """A validator's finding about one field: ``key`` (dotted, relative to the model validated) and
    ``msg``. Pydantic keeps the exception (``ctx["error"]``), so :func:`format_error` names the key
    without reading it back out of the text; ``str()`` is ``key: msg`` for everyone else."""

    def __init__(self, key: str, msg: str) -> None:
        super().__init__(f"{key}: {msg}")
        self.key = key
        self.msg = msg


class ConfigError(AblateError):
    """A config file, override or study spec is malformed or describes an impossible model."""


class DataError(AblateError):
    """A corpus is missing, empty or unreadable."""


class StorageError(AblateError):
    """A tracking or study storage cannot be reached or used."""


FAIL_REASON = "ablate.fail_reason"
"""The MLflow tag (and Optuna trial attribute) holding why a run failed: ``ablate.sweeps.engine.tracking.FAIL_REASON``,
here so that the data layer can tag a run its corpus failed."""


def worker_message(text: str, cls: type[BaseException] = AblateError) -> str:
    """The original message of an error of type ``cls`` that torch re-raised from a DataLoader
    worker (``Caught DataError in DataLoader worker process 0.\\nOriginal Traceback ...``,
    the traceback's last line being ``ablate.lightning_modules.config.errors.DataError: MESSAGE``);
    any other text unchanged."""
    if not text.startswith(f"Caught {cls.__name__} ") or "\nOriginal Traceback" not in text:
        return text
    prefix = f"\n{cls.__module__}.{cls.__qualname__}: "
    at = text.rfind(prefix)
    return text[at + len(prefix) :].strip() if at >= 0 else text


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` (dotted names too), a package that ablate's extra ``extra`` installs.

    Raises:
        AblateError: one line with the command that installs it, e.g. ``transformers is not
            installed: run pip install -e '.[hf]' in the ablate checkout``, if it is missing or
            cannot be imported. (Not ``pip install 'ablate[hf]'``: the ``ablate`` on PyPI is
            another project.)
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        install = f"run pip install -e '.[{extra}]' in the ablate checkout"
        missing = exc.name
        if isinstance(exc, ModuleNotFoundError) and missing and (module + ".").startswith(missing + "."):
            raise AblateError(f"{missing} is not installed: {install}") from None
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise AblateError(f"{module} cannot be imported ({first}): {install}") from None


def require_driver(url: str) -> None:
    """Check that the database driver of a SQLAlchemy URL is installed: ``postgresql://`` (and
    ``postgresql+psycopg://``) needs psycopg, from the extra ``postgres`` (an AblateError if not).
    SQLite and other drivers are left to SQLAlchemy."""
    if url.split(":", 1)[0].lower() in ("postgresql", "postgresql+psycopg"):
        require("psycopg", "postgres")


STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)  # NaN and infinity are never a setting
"""The pydantic config of every config and spec dataclass: an unknown key is an error."""


def _dotted(where: str, loc: tuple[int | str, ...]) -> str:
    key = where
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def did_you_mean(key: str, known: Collection[str]) -> str:
    """`` (did you mean model.embed_dim?)`` for an unknown dotted ``key`` (list positions such as
    ``tasks[0].`` left out when matching) among the ``known`` dotted keys: keys of other sections with
    the same last part, else the closest key of the same section; ``""`` when none is close."""
    plain = re.sub(r"\[\d+\]", "", key)
    parent, _, leaf = plain.rpartition(".")
    elsewhere = sorted(k for k in known if k.rpartition(".")[2] == leaf and k != plain)
    if elsewhere:  # the right name in another section (model.max_steps: trainer.max_steps)
        return f" (did you mean {' or '.join(elsewhere[:3])}?)"
    siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(leaf, siblings, n=1)
    return f" (did you mean {key[: len(key) - len(leaf)]}{close[0]}?)" if close else ""


def spec_keys(cls: type, prefix: str = "") -> set[str]:
    """The dotted keys of a pydantic dataclass, its nested dataclasses' (in lists and optionals
    too) included: what :func:`did_you_mean` matches an unknown key of a study or report spec against."""
    keys: set[str] = set()
    for name, info in getattr(cls, "__pydantic_fields__", {}).items():
        keys.add(prefix + name)
        pending, seen = [info.annotation], []
        while pending:
            kind = pending.pop()
            if isinstance(kind, type) and hasattr(kind, "__pydantic_fields__"):
                seen.append(kind)
            elif getattr(kind, "__origin__", None) is not dict:
                pending.extend(getattr(kind, "__args__", ()))
        for nested in seen:
            keys |= spec_keys(nested, f"{prefix}{name}.")
    return keys


def format_error(exc: ValidationError, where: str = "", known: Collection[str] = ()) -> str:
    """One line naming the dotted key of each problem, e.g. ``report.metrics[2].name: Field required``.

    ``where`` prefixes the keys (``report`` for a study's report section). A validator's
    :class:`FieldError` names its field (``num_heads``: must divide ...). An unknown key says the
    closest of the ``known`` dotted keys (relative to what was validated): ``model.embd_dim: unknown
    key (did you mean model.embed_dim?)``.
    """
    errors = exc.errors(include_url=False)
    locs = [tuple(e["loc"]) for e in errors]
    parts = []
    for err, loc in zip(errors, locs, strict=True):
        if err["type"] == "too_short" and any(o[: len(loc)] == loc and len(o) > len(loc) for o in locs):
            continue  # pydantic's echo of an invalid item, already reported
        key, msg = _dotted(where, loc), err["msg"].removeprefix("Value error, ")
        found = (err.get("ctx") or {}).get("error")
        if isinstance(found, FieldError):
            key, msg = _dotted(key, (found.key,)), found.msg
        elif err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            msg = "unknown key" + did_you_mean(_dotted("", loc), known)
        elif err["type"] == "missing":
            msg = "required key is missing"
        parts.append(f"{key}: {msg}" if key else msg)
    return "; ".join(dict.fromkeys(parts))
