"""A model's measurement (:func:`~.accounting.metric_counts`) done once per model shape and precision on
one machine and reused by every later run of that shape, in the process and under
``<tracking.root>/cache/measure/``; the key is everything the measurement depends on, and a reusing
run logs :data:`CACHE` and :data:`CACHED_AT` (docs/performance.md, "A repeat run's start")."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.measure.accounting import metric_counts
from ablate.lightning_modules.measure.measuring import describe_machine, training_device
from ablate.lightning_modules.model.heads import PretrainingModel

CACHE = "measure.cache"  # param: "measured" (this run measured) or "reused" (from the cache)
CACHED_AT = "measure.cached_at"  # param on a reusing run: when and where the reused entry was measured
FOLDER = Path("cache") / "measure"  # under the tracking root


@dataclass(frozen=True)
class Entry:
    """One measurement as stored: its metrics, its params, when and by which worker it was made."""

    counts: dict[str, float]
    params: dict[str, str]
    measured_at: str
    worker: str


_MEMO: dict[str, Entry] = {}  # this process's measurements, by key


def structure(model: nn.Module) -> str:
    """The model's structure, weights left out: each module's class and each tensor's name, shape, dtype."""
    parts = [type(m).__qualname__ for m in model.modules()]
    parts += [f"{n}:{tuple(t.shape)}:{t.dtype}:{type(t).__name__}" for n, t in model.state_dict(keep_vars=True).items()]
    return "\n".join(parts)


def cache_key(model: nn.Module, model_cfg: ModelConfig, cfg: ExperimentConfig) -> str:
    """The hex digest of everything the measurement of ``model`` under ``cfg`` depends on."""
    device = training_device(cfg.trainer.accelerator)
    parts = [
        structure(model),
        repr(model_cfg),
        f"T={cfg.data.max_length} B={cfg.data.batch_size} precision={cfg.trainer.precision}",
        f"matmul={torch.get_float32_matmul_precision()} torch={torch.__version__}",
        f"host={socket.gethostname()} device={describe_machine(device)}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def cached_counts(
    model: PretrainingModel, model_cfg: ModelConfig, cfg: ExperimentConfig
) -> tuple[dict[str, float], dict[str, str]]:
    """:func:`~.accounting.metric_counts` of ``model``, measured once per key (module docstring) and
    reused after, with the params :data:`CACHE` and :data:`CACHED_AT` beside ``measure.device``.
    Without ``trainer.measure`` nothing is measured (only counted) and nothing is cached."""
    if not cfg.trainer.measure:
        return metric_counts(model, model_cfg, cfg)
    key = cache_key(model, model_cfg, cfg)
    path = Path(cfg.tracking.root) / FOLDER / f"{key}.json"
    entry = _MEMO.get(key)
    if entry is not None and not path.is_file():  # measured under another root of this process
        _write(path, entry)
    entry = entry or _read(path)
    if entry is not None:
        _MEMO[key] = entry
        return dict(entry.counts), {
            **entry.params,
            CACHE: "reused",
            CACHED_AT: f"{entry.measured_at} by {entry.worker} (key {key})",
        }
    counts, params = metric_counts(model, model_cfg, cfg)
    entry = Entry(counts, params, time.strftime("%Y-%m-%dT%H:%M:%S%z"), f"{socket.gethostname()}:{os.getpid()}")
    _MEMO[key] = entry
    _write(path, entry)
    return dict(counts), {**params, CACHE: "measured"}


def _read(path: Path) -> Entry | None:
    """The entry stored at ``path``; None when there is none or it cannot be read (then it is measured again)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return Entry(
            {str(k): float(v) for k, v in raw["counts"].items()},
            {str(k): str(v) for k, v in raw["params"].items()},
            str(raw["measured_at"]),
            str(raw["worker"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(path: Path, entry: Entry) -> None:
    """Store ``entry`` at ``path`` whole or not at all (a reader never sees half a file); a folder that
    cannot be written leaves the cache to this process."""
    text = json.dumps(
        {"counts": entry.counts, "params": entry.params, "measured_at": entry.measured_at, "worker": entry.worker},
        indent=1,
        sort_keys=True,
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as f:
            f.write(text)
        os.replace(f.name, path)
    except OSError:
        pass


def forget() -> None:
    """Drop this process's measurements (the files stay): the next run reads or measures again."""
    _MEMO.clear()
