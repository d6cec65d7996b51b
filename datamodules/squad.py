"""The span task's LightningDataModule: SQuAD v1.1 and v2.0 question answering, from the official
JSON or the hub's flat rows, each answer checked at its ``answer_start``; ``[CLS] question [SEP]
context [SEP]`` read in windows ``finetune.doc_stride`` tokens apart, a training window labelled with
the answer's tokens or [CLS] (docs/guides/squad.md, "Data" and "Windows and answers")."""

from __future__ import annotations

import gzip
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, TextIO

import datasets
import lightning.pytorch as pl
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset

from ablate.datamodules.catalog import hub_hint
from ablate.datamodules.rows import Rows, longest, padded
from ablate.datamodules.slices import Slice, SliceError
from ablate.datamodules.sources import TaskData, resolve_task
from ablate.datamodules.span_dev import Reference, SpanDev, Windows
from ablate.datamodules.squad_json import parse_squad
from ablate.datamodules.tokenizer import special_ids
from ablate.datamodules.transfer import TrainPosition, task_loader, unpack
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.yamlio import Json

_BATCH = 4096  # texts per encode_batch call


@dataclass(frozen=True)
class Question:
    """One SQuAD question: its id, question, context and answers (texts and character starts)."""

    id: str
    question: str
    context: str
    answers: tuple[str, ...]
    starts: tuple[int, ...]


def _official(tree: Mapping[str, Json]) -> list[Question]:
    """The questions of the official SQuAD JSON, in file order."""
    articles: Any = tree["data"]  # as parsed: a malformed file raises KeyError or TypeError (read_questions says so)
    return [
        Question(
            str(qa["id"]),
            str(qa["question"]),
            str(p["context"]),
            tuple(str(a["text"]) for a in qa["answers"]),
            tuple(int(a["answer_start"]) for a in qa["answers"]),
        )
        for article in articles
        for p in article["paragraphs"]
        for qa in p["qas"]
    ]


def _flat(rows: Sequence[Json]) -> list[Question]:
    """The questions of the hub's flat rows."""
    out = []
    for row in rows:
        r: Any = row  # as parsed: a malformed row raises KeyError or TypeError (read_questions says so)
        answers = r["answers"]
        out.append(
            Question(
                str(r["id"]),
                str(r["question"]),
                str(r["context"]),
                tuple(str(t) for t in answers["text"]),
                tuple(int(s) for s in answers["answer_start"]),
            )
        )
    return out


def _open(path: str) -> TextIO:
    return gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")  # noqa: SIM115


def _read_file(path: str, part: Slice | None = None) -> list[Question]:
    """A local file: the official JSON, a JSON list of flat rows, or JSON lines of flat rows; ``part``
    the data catalog's slice of it (articles of the official JSON, or rows: questions), else SliceError.
    Parsed once per process while the file is unchanged (a study's runs read the same dev set)."""
    stat = os.stat(path)
    return list(_parsed(path, stat.st_size, stat.st_mtime_ns, part))


@lru_cache(maxsize=4)
def _parsed(path: str, size: int, mtime_ns: int, part: Slice | None) -> tuple[Question, ...]:
    """:func:`_read_file`'s questions, kept by the file's path, size and modification time (errors are not kept)."""
    return tuple(_parse_file(path, part))


def _parse_file(path: str, part: Slice | None) -> list[Question]:
    with _open(path) as fh:
        text = fh.read()
    tree: Any = parse_squad(text)  # as parsed: a malformed file raises KeyError or TypeError (read_questions)
    official = isinstance(tree, dict) and "data" in tree
    if part is not None and part.unit == "articles" and not official:
        raise SliceError("the file holds flat rows, not the official JSON's articles: slice it by rows")
    if part is not None and part.unit == "articles":
        return _official({"data": part.take(tree["data"])})
    questions = _official(tree) if official else _flat(tree if isinstance(tree, list) else [tree])
    return questions if part is None else part.take(questions)


def read_questions(src: TaskData, limit: int | None, no_answer: bool) -> list[Question]:
    """The first ``limit`` questions of a split (None: all), checked: each answer at its
    ``answer_start``; a question without answers only with ``no_answer``. DataError naming the file."""
    try:
        if src.files:
            questions = [q for path in src.files for q in _read_file(path, src.slice)]
        else:
            ds: Any = datasets.load_dataset(src.builder, src.config, split=src.split)
            questions = _flat(list(ds))
    except SliceError as exc:
        raise src.slice_error(str(exc)) from None
    except (KeyError, TypeError, ValueError, OSError) as exc:
        what = "cannot read" if src.files else f"cannot load the hub dataset's {src.split!r} split"
        hint = "" if src.files else hub_hint(src.name)
        first = (str(exc).splitlines() or [""])[0]
        raise DataError(
            f"{src.key}: {src.name}: {what} SQuAD questions (official JSON or flat rows: id, context, "
            f"question, answers): {type(exc).__name__}: {first}{hint}"
        ) from None
    questions = questions[:limit]
    if not questions:
        raise DataError(f"{src.key}: {src.name}: no questions")
    for q in questions:
        for text, start in zip(q.answers, q.starts, strict=True):
            if q.context[start : start + len(text)] != text:
                raise DataError(
                    f"{src.key}: {src.name}: question {q.id}: answer {text!r} is not at its answer_start "
                    f"{start} in the context"
                )
        if not q.answers and not no_answer:
            raise DataError(f"{src.key}: {src.name}: question {q.id} has no answer (SQuAD 2.0: set finetune.no_answer)")
    return questions


Feature = tuple[np.ndarray, int, int, int, int]
"""One window: its token ids, its tokens of type 0, its answer's first and last positions, its index."""


@dataclass
class SpanSplit(Dataset[Feature]):
    """Windows in flat arrays: ``ids[offsets[i]:offsets[i+1]]`` is window ``i``.

    Attributes:
        ids: every window's token ids, concatenated (int32).
        offsets: window boundaries (len + 1).
        first: tokens of type 0 per window ([CLS] question [SEP]): where its context starts.
        start, end: the answer's first and last token per window (0: [CLS], no answer here).
        dev: the questions and each window's characters (what the answers are read back with).
    """

    ids: np.ndarray
    offsets: np.ndarray
    first: np.ndarray
    start: np.ndarray
    end: np.ndarray
    dev: SpanDev

    def __len__(self) -> int:
        return len(self.first)

    def __getitem__(self, i: int) -> Feature:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.ids[a:b], int(self.first[i]), int(self.start[i]), int(self.end[i]), i

    def __getitems__(self, index: list[int]) -> Rows[SpanSplit]:
        """Windows ``index`` at once (a DataLoader's batched fetch), for :func:`collate` to pad together."""
        return Rows(self, index)


def _windows(n: int, room: int, stride: int) -> list[tuple[int, int]]:
    """BERT's document spans: (start, length) of windows of at most ``room`` tokens over ``n``."""
    out, start = [], 0
    while True:
        length = min(n - start, room)
        out.append((start, length))
        if start + length >= n:
            return out
        start += min(length, stride)


def _max_context(spans: list[tuple[int, int]], n: int) -> list[np.ndarray]:
    """BERT's ``_check_is_max_context`` for every window: whether it sees each of its tokens with their
    most context of all windows (the least of the left and right context, plus a hundredth of the
    window's length; the first such window on a tie)."""
    pos = np.arange(n)
    best, arg = np.full(n, -1.0), np.full(n, -1)
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        score = np.minimum(pos - start, end - pos) + 0.01 * length
        better = (pos >= start) & (pos <= end) & (score > best)
        best, arg = np.where(better, score, best), np.where(better, i, arg)
    return [arg[start : start + length] == i for i, (start, length) in enumerate(spans)]


def encode(tok: Tokenizer, questions: list[Question], cfg: FinetuneConfig) -> SpanSplit:
    """Tokenize ``questions`` into windows: ``[CLS] question [SEP] context [SEP]``, the question cut to
    ``finetune.max_query_length`` tokens, the context read in windows ``finetune.doc_stride`` tokens apart; a
    training window labelled with the first answer's first and last tokens, or [CLS] where it holds none."""
    sp = special_ids(tok)
    encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
    ids: list[int] = []
    lengths, first, starts, ends, example, ctx_start = [], [], [], [], [], []
    spans: list[np.ndarray] = []
    max_context: list[np.ndarray] = []
    for lo in range(0, len(questions), _BATCH):
        chunk = questions[lo : lo + _BATCH]
        q_enc = encode_batch([q.question for q in chunk], add_special_tokens=False)
        c_enc = tok.encode_batch([q.context for q in chunk], add_special_tokens=False)  # with offsets
        for k, (q, qe, ce) in enumerate(zip(chunk, q_enc, c_enc, strict=True)):
            q_ids = qe.ids[: cfg.max_query_length]
            c_ids, c_off = ce.ids, np.asarray(ce.offsets, dtype=np.int64).reshape(-1, 2)
            room = cfg.max_length - len(q_ids) - 3
            doc = _windows(len(c_ids), room, cfg.doc_stride)
            most = _max_context(doc, len(c_ids))
            # the first answer's tokens: the first token ending after its start, the last starting before its end
            s = e = -1
            if q.answers:
                a0, a1 = q.starts[0], q.starts[0] + len(q.answers[0])
                s, e = int(np.searchsorted(c_off[:, 1], a0, side="right")), int(np.searchsorted(c_off[:, 0], a1)) - 1
            for w, (start, length) in enumerate(doc):
                head = len(q_ids) + 2
                ids += [sp.cls, *q_ids, sp.sep, *c_ids[start : start + length], sp.sep]
                lengths.append(head + length + 1)
                first.append(head)
                inside = 0 <= s <= e and start <= s and e < start + length
                starts.append(s - start + head if inside else 0)
                ends.append(e - start + head if inside else 0)
                example.append(lo + k)
                ctx_start.append(head)
                spans.append(c_off[start : start + length])
                max_context.append(most[w])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    refs = [Reference(q.id, q.context, q.answers) for q in questions]
    windows = Windows(np.asarray(example, dtype=np.int64), np.asarray(ctx_start, dtype=np.int64), spans, max_context)
    return SpanSplit(
        np.asarray(ids, dtype=np.int32),
        offsets,
        np.asarray(first, dtype=np.int64),
        np.asarray(starts, dtype=np.int64),
        np.asarray(ends, dtype=np.int64),
        SpanDev(refs, windows, cfg.no_answer),
    )


def collate(
    rows: list[Feature] | Rows[SpanSplit], pad_id: int = 0, length: int | None = None
) -> dict[str, torch.Tensor]:
    """Pad windows to the longest one (or to ``length`` tokens, at least the longest): the batch dict."""
    if isinstance(rows, Rows):  # a batched fetch: padded together
        split, index = rows.split, rows.index
        width = max(longest(split.offsets, index), length or 0)
        batch = padded(split.ids, split.offsets, split.first, index, width, pad_id)
        spans = {"start_positions": split.start[index], "end_positions": split.end[index], "feature": index}
        return {**batch, **{k: torch.from_numpy(v.astype(np.int64)) for k, v in spans.items()}}
    lengths = torch.tensor([len(r[0]) for r in rows])
    width = max(int(lengths.max()), length or 0)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r[0])] = torch.from_numpy(r[0].astype(np.int64))
    positions = torch.arange(width)[None, :]
    mask = positions < lengths[:, None]
    first = torch.tensor([r[1] for r in rows])[:, None]
    return {
        "input_ids": input_ids,
        "token_type_ids": ((positions >= first) & mask).long(),
        "attention_mask": mask,
        "start_positions": torch.tensor([r[2] for r in rows], dtype=torch.long),
        "end_positions": torch.tensor([r[3] for r in rows], dtype=torch.long),
        "feature": torch.tensor([r[4] for r in rows], dtype=torch.long),
    }


class SquadDataModule(TrainPosition, pl.LightningDataModule):
    """Reads, checks and tokenizes ``finetune.train``/``finetune.validation`` once, in ``setup``.

    Batches: ``input_ids``, ``token_type_ids`` (B, T) long, padded with [PAD] to the longest row;
    ``attention_mask`` (B, T) bool; ``start_positions``, ``end_positions`` and ``feature`` (the
    window's index in its split) (B,) long.

    Args:
        cfg: the ``finetune`` section (data, ``max_length``, ``doc_stride``, ``max_query_length``,
            ``batch_size``, ``no_answer``).
        tokenizer_path: the pre-trained run's WordPiece tokenizer (JSON file).
        seed: seeds the training order.
        num_workers: DataLoader workers.
        limit_train: keep only the first N training questions.
        whole_batches: every training batch of ``batch_size`` windows, an epoch's smaller last one left
            out (a compiled step would compile again for its size).

    Attributes:
        tokenizer, train_set, val_set: after ``setup``; ``val_set.dev`` holds the dev questions and
            the windows' characters the answers are read back with.

    Raises:
        ConfigError: ``finetune.train`` unset, ``finetune.validation`` unset for a local file,
            ``finetune.augment_copies`` set, or no room for the context beside the question.
    """

    def __init__(
        self,
        cfg: FinetuneConfig,
        tokenizer_path: str | Path,
        seed: int = 0,
        num_workers: int = 0,
        limit_train: int | None = None,
        whole_batches: bool = False,
    ) -> None:
        super().__init__()
        self.whole_batches = whole_batches
        if cfg.train is None:
            raise ConfigError("finetune.train: required to fine-tune (a data file or a hub name)")
        self.cfg, self.tokenizer_path, self.seed = cfg, Path(tokenizer_path), seed
        self.num_workers, self.limit_train = num_workers, limit_train
        self._train_src = resolve_task("finetune.train", cfg.train, cfg.train_split, "train")
        if cfg.validation is None and self._train_src.is_file:
            raise ConfigError("finetune.validation: required for a local train file")
        val = cfg.validation or cfg.train
        self._val_src = resolve_task("finetune.validation", val, cfg.validation_split, "validation")
        self.augment_sample: str | None = None  # TinyBERT's augmentation is a classification task's
        self.tokenizer: Tokenizer | None = None
        self.train_set: SpanSplit | None = None
        self.val_set: SpanSplit | None = None

    def _load_tokenizer(self) -> Tokenizer:
        try:
            tok = Tokenizer.from_file(str(self.tokenizer_path))
            special_ids(tok)
            tok.no_padding()
            tok.no_truncation()
        except Exception as exc:  # noqa: BLE001 - missing, corrupt or lacking specials
            first = (str(exc).splitlines() or [""])[0]
            raise DataError(f"{self.tokenizer_path}: cannot load the tokenizer: {first}") from None
        return tok

    def setup(self, stage: str | None = None) -> None:
        """Read, check and tokenize both splits (first call only)."""
        if self.train_set is not None:
            return
        self.tokenizer = self._load_tokenizer()
        f = self.cfg
        limits = [x for x in (self.limit_train, f.train_examples) if x is not None]
        limit = min(limits) if limits else None
        train = encode(self.tokenizer, read_questions(self._train_src, limit, f.no_answer), f)
        val = encode(self.tokenizer, read_questions(self._val_src, f.validation_examples, f.no_answer), f)
        self.train_set, self.val_set = train, val

    def _ready(self) -> tuple[SpanSplit, SpanSplit]:
        self.setup()
        assert self.train_set is not None and self.val_set is not None
        return self.train_set, self.val_set

    @property
    def dev(self) -> SpanDev:
        """The dev questions and their windows."""
        return self._ready()[1].dev

    @property
    def num_train(self) -> int:
        """Training questions."""
        return len(self._ready()[0].dev.references)

    @property
    def num_validation(self) -> int:
        """Dev questions."""
        return len(self.dev.references)

    @property
    def majority_accuracy(self) -> float | None:
        """None: a span task has no majority class (a classification task's baseline)."""
        return None

    @property
    def no_answer_rate(self) -> float:
        """The dev questions without an answer (what always answering nothing scores as exact match)."""
        refs = self.dev.references
        return sum(not r.answers for r in refs) / len(refs)

    def _loader(self, split: SpanSplit, shuffle: bool, skip: int = 0) -> DataLoader[Feature]:
        assert self.tokenizer is not None
        collate_rows = partial(collate, pad_id=special_ids(self.tokenizer).pad)
        whole = self.whole_batches and shuffle
        size = self.cfg.batch_size
        return task_loader(split, size, collate_rows, self.seed, shuffle, self.num_workers, skip, self.pinned(), whole)

    def train_dataloader(self) -> DataLoader[Feature]:
        """Training windows, shuffled by a generator seeded with ``seed``."""
        return self._loader(self._ready()[0], shuffle=True, skip=self.take_skip())

    def val_dataloader(self) -> DataLoader[Feature]:
        """Dev windows in file order."""
        return self._loader(self._ready()[1], shuffle=False)

    def on_after_batch_transfer(self, batch: object, dataloader_idx: int) -> object:
        """Batches from workers arrive packed (:mod:`ablate.datamodules.transfer`): the dict, as views."""
        return unpack(batch)
