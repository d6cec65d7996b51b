"""What an ONNX export is checked by: a fine-tuning run's real rows, read and tokenized by the
fine-tuning data modules' own functions as the run read them (dev batches for parity and the dev
metric, training batches for static int8's calibration); :data:`METRICS` per ``finetune.kind``;
:func:`session` and :func:`outputs` to run a graph with ONNX Runtime. Imports without the ``onnx``
extra (:func:`require_onnx`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn
from torchmetrics.functional import accuracy, pearson_corrcoef

from ablate.datamodules import squad
from ablate.datamodules.classification import collate, encode
from ablate.datamodules.sources import resolve_task
from ablate.datamodules.task_rows import Schema, read_split, splits
from ablate.datamodules.tokenizer import special_ids
from ablate.lightning_modules.config.errors import AblateError, ConfigError, DataError, require
from ablate.lightning_modules.config.finetune import FinetuneConfig

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the ONNX graph's inputs, in this order
DEV_ROWS = 256  # dev rows the export is checked on
CALIBRATION_ROWS = 256  # training rows static int8 is calibrated on
BATCH = 32


@dataclass(frozen=True)
class TaskRows:
    """A run's rows for the export's checks: dev and training batches (inputs and targets)."""

    kind: str  # finetune.kind
    dev: list[dict[str, torch.Tensor]]
    train: list[dict[str, torch.Tensor]]

    @property
    def dev_rows(self) -> int:
        return sum(len(b["input_ids"]) for b in self.dev)


def _tokenizer(path: Path) -> Tokenizer:
    try:
        tok = Tokenizer.from_file(str(path))
        special_ids(tok)
    except Exception as exc:  # noqa: BLE001 - missing, corrupt or lacking specials
        first = (str(exc).splitlines() or [""])[0]
        raise DataError(f"{path}: cannot load the run's tokenizer: {first}") from None
    tok.no_padding()
    tok.no_truncation()
    return tok


def _chunks(n: int) -> list[range]:
    """Row indices of each batch of :data:`BATCH` rows."""
    return [range(i, min(i + BATCH, n)) for i in range(0, n, BATCH)]


def _classification(f: FinetuneConfig, tok: Tokenizer, dev_rows: int, train_rows: int) -> TaskRows:
    train_src, dev_srcs = splits(f)
    pad = special_ids(tok).pad
    out: list[list[dict[str, torch.Tensor]]] = []
    for src, limit in ((dev_srcs[0][1], dev_rows), (train_src, train_rows)):
        texts, labels = read_split(src, Schema.of(f), limit)
        split = encode(tok, texts, labels, f.max_length)
        out.append([collate([split[i] for i in rows], pad_id=pad) for rows in _chunks(len(split))])
    return TaskRows(f.kind, out[0], out[1])


def _span(f: FinetuneConfig, tok: Tokenizer, dev_rows: int, train_rows: int) -> TaskRows:
    assert f.train is not None  # a span run read it
    train_src = resolve_task("finetune.train", f.train, f.train_split, "train")
    dev_src = resolve_task("finetune.validation", f.validation or f.train, f.validation_split, "validation")
    pad = special_ids(tok).pad
    out: list[list[dict[str, torch.Tensor]]] = []
    for src, limit in ((dev_src, dev_rows), (train_src, train_rows)):
        split = squad.encode(tok, squad.read_questions(src, limit, f.no_answer), f)
        n = min(len(split), limit)  # a question may span several windows
        out.append([squad.collate([split[i] for i in rows], pad_id=pad) for rows in _chunks(n)])
    return TaskRows(f.kind, out[0], out[1])


def task_rows(f: FinetuneConfig, tokenizer: Path, dev_rows: int = DEV_ROWS, train_rows: int = 0) -> TaskRows:
    """The first ``dev_rows`` dev rows and ``train_rows`` training rows of the run's task, as batches.

    Raises:
        ConfigError: the run's ``finetune`` section names no data.
        DataError: a file (or the catalog's copy of a hub name) is missing or unreadable, or the
            tokenizer is.
    """
    tok = _tokenizer(tokenizer)
    read = _span if f.kind == "span" else _classification
    return read(f, tok, dev_rows, max(train_rows, 1))


def require_onnx() -> tuple[ModuleType, ModuleType]:
    """onnx and onnxruntime (the ``onnx`` extra), or ConfigError: ``--format onnx needs the onnx extra ...``."""
    try:
        return require("onnx", "onnx"), require("onnxruntime", "onnx")
    except AblateError as exc:
        raise ConfigError(f"--format onnx needs the onnx extra: {exc}") from None


def session(path: Path | str, threads: int | None = None) -> InferenceSession:
    """An ONNX Runtime CPU session of ``path`` (all graph optimizations; ``threads`` intra-op threads, None: ORT's
    default, every core; idle threads sleep rather than spin)."""
    _, ort = require_onnx()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    # no busy-waiting between runs: models timed in turns in one process (ablate bench deploy) get the cores
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def feed(batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A batch as ONNX Runtime's inputs (int64 arrays)."""
    return {name: batch[name].long().numpy() for name in INPUTS}


def outputs(sess: InferenceSession, rows: TaskRows) -> list[torch.Tensor]:
    """The graph's output on each dev batch, shaped as the model's forward returns it ((B, C); span (B, T, 2))."""
    got = []
    for batch in rows.dev:
        out = [torch.from_numpy(np.asarray(o)) for o in sess.run(None, feed(batch))]
        got.append(torch.stack(out, -1) if len(out) == 2 else out[0])
    return got


def torch_outputs(model: nn.Module, rows: TaskRows) -> list[torch.Tensor]:
    """``model``'s output on each dev batch (no gradients)."""
    with torch.no_grad():
        return [model(inputs(batch)).float() for batch in rows.dev]


@dataclass(frozen=True)
class Check:
    """The figures an export was checked by (printed, and kept in ``onnx.json``)."""

    rows: int  # dev rows
    metric_name: str
    metric_torch: float  # ablate's PyTorch model, fp32
    metric_onnx: float  # the exported graph (fp32 or quantized)
    max_abs_diff: float | None = None  # fp32 only: the parity check
    agreement: float | None = None  # quantized: % of predictions as fp32 PyTorch's
    agreement_ablate: float | None = None  # quantized: % of predictions as ablate's own quantized model's
    ablate_quantized: str | None = None  # which model that is
    metric_ablate_quantized: float | None = None  # that model's dev metric on the same rows


def inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A batch's model inputs (what :class:`~ablate.lightning_modules.model.classifier.Classifier` reads)."""
    return {k: batch[k] for k in INPUTS}


def _accuracy(out: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """out: (N, C) logits."""
    preds, target = out.argmax(-1), batch["labels"]
    return accuracy(preds, target, task="multiclass", num_classes=max(int(out.shape[-1]), 2))


def _pearson(out: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """out: (N, 1) scores."""
    return pearson_corrcoef(out[:, 0].double(), batch["labels"].double())


def _span_positions(out: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """out: (N, T, 2) start and end logits; padding never chosen."""
    mask = batch["attention_mask"].bool()[..., None]
    best = out.masked_fill(~mask, float("-inf")).argmax(1)  # (N, 2)
    right = (best[:, 0] == batch["start_positions"]) & (best[:, 1] == batch["end_positions"])
    return right.double().mean()


METRICS: dict[str, tuple[str, Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]]] = {
    "classification": ("accuracy", _accuracy),
    "regression": ("pearson", _pearson),
    "span": ("span accuracy", _span_positions),
}


def _joined(outputs: list[torch.Tensor], rows: TaskRows) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Outputs and targets of every dev batch, as one batch (span outputs padded to the longest window)."""
    if rows.kind != "span":
        targets = {"labels": torch.cat([b["labels"] for b in rows.dev])}
        return torch.cat(outputs), targets
    width = max(int(o.shape[1]) for o in outputs)
    padded = [torch.nn.functional.pad(o, (0, 0, 0, width - o.shape[1])) for o in outputs]
    masks = [
        torch.nn.functional.pad(b["attention_mask"].bool(), (0, width - b["attention_mask"].shape[1])) for b in rows.dev
    ]
    targets = {k: torch.cat([b[k] for b in rows.dev]) for k in ("start_positions", "end_positions")}
    return torch.cat(padded), {**targets, "attention_mask": torch.cat(masks)}


def metric(outputs: list[torch.Tensor], rows: TaskRows) -> float:
    """The dev metric (points) of one output per dev batch (as the model's forward returns it)."""
    out, targets = _joined(outputs, rows)
    return float(METRICS[rows.kind][1](out.float(), targets)) * 100


def predictions(outputs: list[torch.Tensor], rows: TaskRows) -> torch.Tensor | None:
    """Each dev row's prediction (class; span: start * T + end), to compare two models; None for regression."""
    if rows.kind == "regression":
        return None
    out, targets = _joined(outputs, rows)
    if rows.kind == "classification":
        return out.argmax(-1)
    best = out.masked_fill(~targets["attention_mask"][..., None], float("-inf")).argmax(1)
    return best[:, 0] * out.shape[1] + best[:, 1]
