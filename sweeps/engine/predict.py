"""``ablate predict RUN FILE``: a fine-tuning run's model (its ``model/`` artifacts: the best validation's float
weights) and tokenizer predict every row of a file of its task, written as the task's benchmark takes it: GLUE's
submission TSV, or SQuAD's ``predictions.json``. Everything is checked before anything is written. The formats:
docs/guides/glue.md ("Test-set predictions") and docs/guides/squad.md ("Predictions")."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from ablate.datamodules import squad
from ablate.datamodules.classification import collate, encode
from ablate.datamodules.sources import resolve_task
from ablate.datamodules.task_rows import _header, read_columns
from ablate.datamodules.tokenizer import special_ids
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.glue import GLUE
from ablate.lightning_modules.config.jsonio import JsonProblem, parse_json
from ablate.lightning_modules.measure.measuring import placed
from ablate.lightning_modules.methods.finetune import predictions
from ablate.lightning_modules.methods.span_predictions import span_predictions
from ablate.lightning_modules.model.span import span_logits
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.predictions import label_text
from ablate.sweeps.engine.weights import finetune_run_params, load_run_classifier, load_run_span, run_tokenizer, store

BATCH = 64
INDEX_COLUMNS = ("index", "idx", "id")
"""A row's id in a file, the first of these its header has (GLUE's test files: ``index``; the hub: ``idx``)."""
SUBMISSION = {
    "cola": "CoLA",
    "sst2": "SST-2",
    "mrpc": "MRPC",
    "qqp": "QQP",
    "stsb": "STS-B",
    "mnli": "MNLI-m",
    "qnli": "QNLI",
    "rte": "RTE",
    "wnli": "WNLI",
}
"""A GLUE task's submission file name (without ``.tsv``)."""
NAMED = frozenset({"mnli", "qnli", "rte", "ax"})
"""The GLUE tasks whose submissions name the label (the others give its number)."""


@dataclass(frozen=True)
class Predicted:
    """What :func:`predict_run` wrote: the file, its rows, and the task."""

    path: Path
    rows: int
    task: str


def glue_name(f: FinetuneConfig) -> str | None:
    """The GLUE task a run's ``finetune`` is (``finetune.glue``, or a task named as one), or None."""
    name = f.glue or f.task
    return name if name in GLUE else None


def submission_label(value: float | int, f: FinetuneConfig) -> str:
    """A prediction as the task's benchmark takes it (see the module)."""
    glue = glue_name(f)
    if glue is None or f.kind == "regression":
        return label_text(value, f)
    names = GLUE[glue].label_names
    return names[int(value)] if glue in NAMED and names is not None else str(int(value))


def default_output(f: FinetuneConfig, file: Path) -> Path:
    """Where the predictions go without ``--out``: in the working folder, named as the benchmark names them."""
    if f.kind == "span":
        return Path("predictions.json")
    glue = glue_name(f)
    if glue is None:
        return Path(f"{f.task}.tsv")
    name = SUBMISSION[glue]
    return Path(f"{name}m.tsv" if glue == "mnli" and "mismatched" in file.name else f"{name}.tsv")


def _check_file(file: str) -> Path:
    path = Path(file).expanduser()
    if not path.exists():
        raise DataError(f"FILE: {file}: no such file")
    if not path.is_file():
        raise DataError(f"FILE: {file}: is a folder, not a file")
    return path


def _check_out(out: Path) -> Path:
    if out.is_dir():
        raise ConfigError(f"--out: {out}: is a folder; name the file to write")
    if not out.parent.is_dir():
        raise ConfigError(f"--out: {out}: its folder {out.parent} does not exist")
    return out


def _rows(f: FinetuneConfig, path: Path) -> tuple[list[str], list[list[str]]]:
    """A file's ids and text columns (the task's ``text_fields``); DataError naming a missing column."""
    src = resolve_task("FILE", str(path))
    header = _header(src)
    for column in f.text_fields:
        if column not in header:
            raise DataError(
                f"FILE: {path}: no column {column!r} (the run's task {f.task} reads {', '.join(f.text_fields)}; "
                f"its columns: {', '.join(header) or 'none'})"
            )
    index = next((c for c in INDEX_COLUMNS if c in header), None)
    columns = [*f.text_fields, *([index] if index is not None else [])]
    read = read_columns(src, columns, None, ["text_fields"] * len(columns))
    texts = [["" if t is None else str(t) for t in read[c]] for c in f.text_fields]
    ids = [str(i) for i in read[index]] if index is not None else [str(i) for i in range(len(texts[0]))]
    return ids, texts


def _answers(qa: dict[str, Any]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    answers = qa.get("answers") or []
    if isinstance(answers, dict):  # the hub's flat rows: {text: [...], answer_start: [...]}
        return tuple(map(str, answers.get("text", []))), tuple(map(int, answers.get("answer_start", [])))
    return tuple(str(a["text"]) for a in answers), tuple(int(a["answer_start"]) for a in answers)


def _question(qa: dict[str, Any], context: str) -> squad.Question:
    return squad.Question(str(qa["id"]), str(qa["question"]), context, *_answers(qa))


def _questions(path: Path) -> list[squad.Question]:
    """A SQuAD file's questions (the official JSON or flat rows; answers optional); DataError otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
        try:
            tree: Any = parse_json(text, expect=None)
        except JsonProblem as whole:  # JSON lines, or a JSON document that breaks a rule (said as it is)
            if not str(whole).startswith("invalid JSON"):
                raise
            tree = [parse_json(line, expect=dict) for line in text.splitlines() if line.strip()]
        if isinstance(tree, dict) and "data" in tree:
            out = [_question(qa, p["context"]) for a in tree["data"] for p in a["paragraphs"] for qa in p["qas"]]
        else:
            out = [_question(r, str(r["context"])) for r in (tree if isinstance(tree, list) else [tree])]
    except (KeyError, TypeError, ValueError, OSError) as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise DataError(
            f"FILE: {path}: cannot read SQuAD questions (the official JSON, or rows with id, question, "
            f"context): {type(exc).__name__}: {first}"
        ) from None
    if not out:
        raise DataError(f"FILE: {path}: no questions")
    return out


def _tokenizer(uri: str, run_id: str, workdir: Path) -> Tokenizer:
    path = run_tokenizer(store(uri), run_id, workdir)
    if path is None:
        raise ConfigError(f"RUN: run {run_id} logged no tokenizer, and its model reads the tokenizer's ids")
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.no_truncation()
    return tok


def _batches(n: int) -> Iterator[list[int]]:
    for lo in range(0, n, BATCH):
        yield list(range(lo, min(lo + BATCH, n)))


def _classify(cfg: ExperimentConfig, model: torch.nn.Module, tok: Tokenizer, texts: list[list[str]]) -> np.ndarray:
    f = cfg.finetune
    split = encode(tok, texts, [0] * len(texts[0]), f.max_length)
    out = []
    with placed(model, None, train=False) as device, torch.inference_mode():
        for index in _batches(len(split)):
            batch = collate([split[i] for i in index], pad_id=special_ids(tok).pad)
            logits = model({k: v.to(device) for k, v in batch.items()})
            out.append(predictions(logits, f.kind == "regression").cpu())
    return torch.cat(out).numpy()


def _span(cfg: ExperimentConfig, model: torch.nn.Module, tok: Tokenizer, questions: list[squad.Question]) -> Any:
    f = cfg.finetune
    split = squad.encode(tok, questions, f)
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    with placed(model, None, train=False) as device, torch.inference_mode():
        for index in _batches(len(split)):
            batch = squad.collate([split[i] for i in index], pad_id=special_ids(tok).pad)
            start, end = span_logits(model({k: v.to(device) for k, v in batch.items()}), batch["attention_mask"])
            for row, n in enumerate(batch["attention_mask"].sum(dim=1).tolist()):
                starts.append(start[row, :n].cpu().numpy())
                ends.append(end[row, :n].cpu().numpy())
    return span_predictions(split.dev, starts, ends, f.n_best, f.max_answer_length).answers


def _write(out: Path, text: str) -> None:
    """``text`` into ``out``, whole: a temporary file beside it, renamed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def predict_run(uri: str, run_id: str, file: str, out: Path | None = None) -> Predicted:
    """Run ``run_id``'s fine-tuned model on ``file`` and write its predictions (see the module)."""
    finetune_run_params(uri, run_id, "RUN: ", ("RUN: ", "ablate predict reads a fine-tuning run's model"))
    path = _check_file(file)
    if out is not None:
        _check_out(out)
    with tracking.quiet_downloads(), tempfile.TemporaryDirectory(prefix="ablate-predict-") as tmp:
        span = store(uri).get_run(run_id).data.params.get("finetune.kind") == "span"
        cfg, model = load_run_span(uri, run_id) if span else load_run_classifier(uri, run_id)
        f = cfg.finetune
        target = _check_out(out if out is not None else default_output(f, path))
        tok = _tokenizer(uri, run_id, Path(tmp))
        if f.kind == "span":
            answers = _span(cfg, model, tok, _questions(path))
            _write(target, json.dumps(answers, indent=4, ensure_ascii=False) + "\n")
            return Predicted(target, len(answers), f.task)
        ids, texts = _rows(f, path)
        predicted = _classify(cfg, model, tok, texts)
        lines = [f"{i}\t{submission_label(p, f)}" for i, p in zip(ids, predicted, strict=True)]
        _write(target, "\n".join(("index\tprediction", *lines)) + "\n")
        return Predicted(target, len(lines), f.task)
