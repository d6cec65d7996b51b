"""The dev set of a span task (SQuAD) as its metrics read it: the questions' references and where each
window (a model input) reads its context. :mod:`ablate.datamodules.squad` builds it;
:mod:`ablate.lightning_modules.methods.squad_metrics` scores predictions against it. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Reference:
    """One question as the metrics see it: its id, its context and its reference answers' texts
    (none: unanswerable, SQuAD 2.0)."""

    id: str
    context: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Windows:
    """Where each window (a model input) of the dev questions reads its context.

    Attributes:
        example: (N,) the question (index into the references) each window reads.
        ctx_start: (N,) the position of the window's first context token in its input.
        spans: per window, (n, 2) the characters [start, end) of its n context tokens in the context.
        max_context: per window, (n,) whether the window sees each of its context tokens with its
            most context of all windows (the start of an answer must be such a token).
    """

    example: np.ndarray
    ctx_start: np.ndarray
    spans: list[np.ndarray]
    max_context: list[np.ndarray]


@dataclass(frozen=True)
class SpanDev:
    """The dev set of a span task: its questions and the windows its model reads."""

    references: list[Reference]
    windows: Windows
    no_answer: bool
