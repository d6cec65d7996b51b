"""A fine-tuning run's dev predictions as its ``predictions/`` artifacts (:func:`predictions_finisher`): those of
the validation whose weights the run keeps, taken in that same pass; a span task's in SQuAD's official files, a
classification or regression task's as ``<dev set>.tsv``, written whole before they are logged. The formats:
docs/guides/finetuning.md ("Its dev predictions") and docs/guides/squad.md ("Predictions")."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from ablate.datamodules.classification import ClassificationDataModule
from ablate.datamodules.squad import SquadDataModule
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.methods.finetune import FinetuneModule
from ablate.lightning_modules.methods.span import window_logits
from ablate.lightning_modules.methods.span_predictions import span_predictions
from ablate.sweeps.engine.context import ActiveRun, say
from ablate.sweeps.engine.phases import Finisher

ARTIFACT = "predictions"
"""The artifact folder of a fine-tuning run's dev predictions."""
HEADER = "id\tprediction\tlabel"


class FinetuneRun(Protocol):
    """What the finisher reads of a fine-tuning run's materials (:class:`ablate.sweeps.engine.finetune.FinetuneRun`)."""

    cfg: ExperimentConfig
    module: FinetuneModule
    data: ClassificationDataModule | SquadDataModule


def label_text(value: float | int, f: FinetuneConfig) -> str:
    """A label or prediction as a file shows it: its name (``finetune.label_names``), else its number
    (a regression's score with up to 6 significant digits)."""
    if f.kind == "regression":
        return f"{float(value):.6g}"
    names = f.label_names
    return names[int(value)] if names is not None and 0 <= int(value) < len(names) else str(int(value))


def dev_table(predicted: np.ndarray, labels: np.ndarray, f: FinetuneConfig) -> str:
    """One dev set's TSV: a header, then ``id``, ``prediction``, ``label`` per row in file order."""
    pairs = enumerate(zip(predicted, labels, strict=True))
    rows = (f"{i}\t{label_text(p, f)}\t{label_text(y, f)}" for i, (p, y) in pairs)
    return "\n".join((HEADER, *rows)) + "\n"


def _tables(m: FinetuneRun, folder: Path) -> list[str]:
    """Each dev set's table written into ``folder``; the names of those left out (rows that do not line up)."""
    assert isinstance(m.data, ClassificationDataModule)
    f, kept = m.cfg.finetune, m.module.best_predictions or {}
    missing = []
    for name, split in m.data.val_sets.items():
        predicted = kept.get(name)
        if predicted is None or len(predicted) != len(split.labels):  # a partial pass (several devices)
            missing.append(name)
            continue
        (folder / f"{name}.tsv").write_text(dev_table(predicted.numpy(), split.labels, f), encoding="utf-8")
    return missing


def _span_files(m: FinetuneRun, folder: Path) -> list[str]:
    assert isinstance(m.data, SquadDataModule)
    f, kept = m.cfg.finetune, m.module.best_predictions
    dev = m.data.dev
    if kept is None or len(kept["length"]) != len(dev.windows.example):  # a partial pass (several devices)
        return [f.task]
    starts, ends = window_logits(kept)
    span_predictions(dev, starts, ends, f.n_best, f.max_answer_length).write(folder)
    return []


def log_predictions(
    m: FinetuneRun, handed: object, run: ActiveRun, step: int, metrics: dict[str, float]
) -> dict[str, float]:
    """The finisher: the kept model's dev predictions as the run's ``predictions/`` artifacts."""
    with tempfile.TemporaryDirectory(prefix="ablate-predictions-") as tmp:
        folder = Path(tmp)
        span = isinstance(m.data, SquadDataModule)
        missing = _span_files(m, folder) if span else _tables(m, folder)
        if missing:
            say(f"{run.name or run.run_id[:8]}: no dev predictions kept for {', '.join(missing)}")
        if any(folder.iterdir()):
            run.client.log_artifacts(run.run_id, str(folder), ARTIFACT)
    return {}


def written_names(f: FinetuneConfig) -> list[str]:
    """The files a run of task ``f`` logs under ``predictions/``."""
    if f.kind == "span":
        return ["predictions.json", "nbest_predictions.json", *(["null_odds.json"] if f.no_answer else [])]
    return [f"{name}.tsv" for name in (f.task, *(d.name for d in f.extra_validation))]


R = TypeVar("R", bound=FinetuneRun)
H = TypeVar("H")


def predictions_finisher(f: FinetuneConfig) -> Finisher[R, H]:
    """The finisher a fine-tuning run of task ``f`` logs its dev predictions with."""
    return Finisher(
        "predictions",
        f"the kept model's dev predictions: predictions/ ({', '.join(written_names(f))})",
        log_predictions,
    )
