"""The fine-tuning LightningDataModule of GLUE-style tasks: single-sentence or sentence-pair
classification and regression (STS-B), read from local files, hub splits or the data catalog's copies
(docs/data.md), each row ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``; a dev loader per dev set, and
TinyBERT's augmentation of the training split (:mod:`ablate.datamodules.augment`). Reading and
checking the rows: :mod:`ablate.datamodules.task_rows`."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import Counter
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset

from ablate.datamodules.augment import MaskedLM, augment_rows, cached_augmentation, sample_table, vocab_digest
from ablate.datamodules.memo import Kept, files_state
from ablate.datamodules.rows import Rows, longest, padded
from ablate.datamodules.sources import TaskData
from ablate.datamodules.task_rows import READ_BATCH, Labels, Schema, read_columns, read_split, splits
from ablate.datamodules.tokenizer import cache_root, special_ids
from ablate.datamodules.transfer import TrainPosition, task_loader, unpack
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.experiment import DataConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig

_READ_BATCH = READ_BATCH  # texts per encode_batch call


def _trim(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Lengths after trimming the longer sequence first, as transformers' ``longest_first`` does: when
    both are cut, each keeps half the budget, and an odd budget's extra token stays with the longer
    text (ties: b)."""
    excess = la + lb - budget
    if excess <= 0:
        return la, lb
    if excess <= abs(la - lb):
        return (la - excess, lb) if la > lb else (la, lb - excess)
    half, odd = divmod(budget, 2)
    return (half + odd, half) if la > lb else (half, half + odd)


Example = tuple[np.ndarray, int, int | float]
"""One row of an :class:`EncodedSplit`: its token ids, its tokens of type 0, its label (a class or a number)."""


class EncodedSplit(Dataset[Example]):
    """Tokenized examples in flat arrays: ``ids[offsets[i]:offsets[i+1]]`` is row ``i``.

    Attributes:
        ids: every row's token ids ([CLS]/[SEP] included), concatenated (int32).
        offsets: row boundaries, ``len(self) + 1`` of them.
        first: tokens of type 0 per row ([CLS] a [SEP]).
        labels: class per row (int64), or regression target (float32).
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, first: np.ndarray, labels: np.ndarray) -> None:
        self.ids, self.offsets, self.first, self.labels = ids, offsets, first, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Example:
        label = self.labels[i].item()  # a Python int (a class) or float (a regression target)
        return self.ids[self.offsets[i] : self.offsets[i + 1]], int(self.first[i]), label

    def __getitems__(self, index: list[int]) -> Rows[EncodedSplit]:
        """Rows ``index`` at once (a DataLoader's batched fetch), for :func:`collate` to pad together."""
        return Rows(self, index)


_ENCODED: Kept[EncodedSplit] = Kept(8)
"""The task splits tokenized in this process (the last 8), by what they are made of (``_encode``)."""


def encode(tok: Tokenizer, texts: list[list[str]], labels: Labels, max_length: int) -> EncodedSplit:
    """Tokenize one (``[texts_a]``) or two (``[texts_a, texts_b]``) text columns.

    Args:
        tok: a WordPiece tokenizer with ``[CLS]``/``[SEP]`` (its post-processor is not used).
        texts: the text columns, each as long as ``labels``.
        labels: class (int) or regression target (float) per example.
        max_length: tokens per row, specials included; longer rows are truncated (pairs: the
            longer side first).
    """
    sp = special_ids(tok)
    encode_batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
    ids: list[int] = []
    lengths, first = [], []
    for start in range(0, len(labels), _READ_BATCH):  # in chunks: Encodings are heavy
        cols = [
            [e.ids for e in encode_batch(col[start : start + _READ_BATCH], add_special_tokens=False)] for col in texts
        ]
        for a, *b in zip(*cols, strict=False):
            if b:
                na, nb = _trim(len(a), len(b[0]), max_length - 3)
                ids += [sp.cls, *a[:na], sp.sep, *b[0][:nb], sp.sep]
            else:
                na, nb = min(len(a), max_length - 2), -1
                ids += [sp.cls, *a[:na], sp.sep]
            lengths.append(na + nb + 3)
            first.append(na + 2)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    regression = any(isinstance(y, float) for y in labels)
    targets = np.asarray(labels, dtype=np.float32 if regression else np.int64)
    return EncodedSplit(np.asarray(ids, dtype=np.int32), offsets, np.asarray(first, dtype=np.int64), targets)


def bucket_lengths(max_length: int, smallest: int = 16) -> tuple[int, ...]:
    """The widths a compiled fine-tuning step's batches are padded to: powers of two from ``smallest``,
    then ``max_length`` (128: 16, 32, 64, 128). One graph (and CUDA graph) per width, at most 4 or 5 of
    them, where padding every batch to ``max_length`` would cost 2-3x the step (SST-2)."""
    widths = []
    width = smallest
    while width < max_length:
        widths.append(width)
        width *= 2
    return (*widths, max_length)


def collate(
    rows: list[Example] | Rows[EncodedSplit], pad_id: int = 0, length: int | None = None, buckets: tuple[int, ...] = ()
) -> dict[str, torch.Tensor]:
    """Pad rows of :class:`EncodedSplit` to the longest one (or to ``length`` tokens, at least the
    longest; or to the first of ``buckets`` that holds the longest): the batch dict of tensors.

    The loaders pad to the longest row: every layer's cost grows with T, and a classification
    batch is far shorter than ``finetune.max_length`` (SST-2's batches of 32 are about 50
    tokens long at ``max_length`` 128; ``ablate bench loop --regime finetune`` measures the
    step on both). Padding keys are masked out of attention and the logits read [CLS], so a
    row's logits do not depend on its batch's padding (up to float rounding; MobileBERT's
    trigram embedding reads a row's next token, [PAD] or the end, and is the exception).
    """
    if isinstance(rows, Rows):  # a batched fetch: padded together
        split, index = rows.split, rows.index
        width = max(longest(split.offsets, index), length or 0)
        width = next((b for b in buckets if b >= width), width)
        labels = split.labels[index]
        target = np.float32 if labels.dtype.kind == "f" else np.int64
        batch = padded(split.ids, split.offsets, split.first, index, width, pad_id)
        return {**batch, "labels": torch.from_numpy(labels.astype(target))}
    lengths = torch.tensor([len(ids) for ids, _, _ in rows])
    width = max(int(lengths.max()), length or 0)
    width = next((b for b in buckets if b >= width), width)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, (ids, _, _) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.from_numpy(ids.astype(np.int64))
    positions = torch.arange(input_ids.shape[1])[None, :]
    mask = positions < lengths[:, None]
    first = torch.tensor([f for _, f, _ in rows])[:, None]
    regression = isinstance(rows[0][2], float)
    return {
        "input_ids": input_ids,
        "token_type_ids": ((positions >= first) & mask).long(),
        "attention_mask": mask,
        "labels": torch.tensor([y for _, _, y in rows], dtype=torch.float32 if regression else torch.long),
    }


class ClassificationDataModule(TrainPosition, pl.LightningDataModule):
    """Reads, checks and tokenizes ``finetune.train``/``finetune.validation`` once, in ``setup``.

    Batches: ``input_ids``, ``token_type_ids`` (B, T) long, padded with [PAD] to the longest row;
    ``attention_mask`` (B, T) bool; ``labels`` (B,) long (classes) or float (regression targets).

    Args:
        cfg: the ``finetune`` section (data, fields, ``num_labels``, ``max_length``, ``batch_size``).
        tokenizer_path: the pre-trained run's WordPiece tokenizer (JSON file).
        seed: seeds the training order (the same seed gives the same batches).
        num_workers: DataLoader workers (0: collate in the main process).
        limit_train: keep only the first N training examples (quick runs, tests).
        mlm: the masked LM that proposes replacements for ``finetune.augment_copies`` (the caller
            resolves ``finetune.augment_model``); unused without augmentation.
        cache_dir: where augmented training sets are cached (under ``augment/``); None:
            ``$ABLATE_CACHE`` or ``~/.cache/ablate``, as ``data.cache_dir``'s default.
        mlm_id: the masked LM's identity (a run id, a path), part of the cache key.
        bucketed: pad training batches to :func:`bucket_lengths` widths (a compiled step: a few fixed
            shapes, which CUDA graphs need), not to their longest row.

    Attributes:
        tokenizer, train_set, val_set: the tokenizer and the tokenized splits (after ``setup``);
            with augmentation, ``train_set`` holds the originals, then every example's copies
            (example 0's first), each with its original's label. ``val_set`` is the task's own dev
            set; ``val_sets`` every dev set by name (the task's first, then ``extra_validation``'s).
        augment_sample: a TSV of the first examples and their copies (after ``setup``), or None
            without augmentation.

    Raises:
        ConfigError: ``finetune.train`` is unset, ``finetune.validation`` is unset for a local file,
            a further dev set has no data beside a local dev file, or ``finetune.augment_copies`` is
            set without ``mlm``.
        DataError: a local file (or the data catalog's copy of a hub name) is missing or has an
            unknown extension.
    """

    def __init__(
        self,
        cfg: FinetuneConfig,
        tokenizer_path: str | Path,
        seed: int = 0,
        num_workers: int = 0,
        limit_train: int | None = None,
        mlm: MaskedLM | None = None,
        cache_dir: str | Path | None = None,
        mlm_id: str = "",
        bucketed: bool = False,
    ) -> None:
        super().__init__()
        if limit_train is not None and limit_train <= 0:
            raise ValueError("limit_train must be positive or None")
        self.cfg, self.tokenizer_path, self.seed = cfg, Path(tokenizer_path), seed
        self.num_workers, self.limit_train = num_workers, limit_train
        self.buckets = bucket_lengths(cfg.max_length) if bucketed else ()
        self._train_src, self._dev_srcs = splits(cfg)
        if cfg.augment_copies > 0 and mlm is None:
            raise ConfigError(
                "finetune.augment_copies: augmentation needs a masked LM "
                "(finetune.augment_model or a finetune.source with an MLM head)"
            )
        self.mlm, self.mlm_id = mlm, mlm_id
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else cache_root(DataConfig())
        self.augment_sample: str | None = None
        self.tokenizer: Tokenizer | None = None
        self.train_set: EncodedSplit | None = None
        self.val_sets: dict[str, EncodedSplit] = {}

    @property
    def val_set(self) -> EncodedSplit | None:
        """The task's own dev set (None before ``setup``)."""
        return self.val_sets.get(self.cfg.task)

    @property
    def dev_names(self) -> list[str]:
        """The dev sets' names, in loader order: the task's, then ``finetune.extra_validation``'s."""
        return [name for name, _ in self._dev_srcs]

    def prepare_data(self) -> None:
        """Download hub splits into the ``datasets`` cache (once per node); local files: nothing."""
        fields = ["label_field", *["text_fields"] * len(self.cfg.text_fields)]
        for src in (self._train_src, *(src for _, src in self._dev_srcs)):
            if not src.files:
                read_columns(src, [self.cfg.label_field, *self.cfg.text_fields], 1, fields)

    def _load_tokenizer(self) -> Tokenizer:
        try:
            tok = Tokenizer.from_file(str(self.tokenizer_path))
            special_ids(tok)
            tok.no_padding()  # a transformers tokenizer.json may pad or truncate: rows are built here
            tok.no_truncation()
        except Exception as exc:  # noqa: BLE001 - missing, corrupt or lacking specials
            first = (str(exc).splitlines() or [""])[0]
            raise DataError(f"{self.tokenizer_path}: cannot load the tokenizer: {first}") from None
        return tok

    def _encode(self, src: TaskData, limit: int | None, augment: bool = False) -> EncodedSplit:
        """A split read, checked and tokenized: once per process for a split that is not augmented
        (later runs of a worker take it from memory; keyed by the split, its files' state, what is read
        of it, the tokenizer and ``max_length``)."""
        if augment and self.cfg.augment_copies > 0:
            return self._read_and_encode(src, limit, augment)
        assert self.tokenizer is not None
        made_of: tuple[object, ...] = (src, files_state(src.files), Schema.of(self.cfg), limit, self.cfg.max_length)
        made_of += (self.tokenizer.to_str(),)
        return _ENCODED.get(made_of, lambda: self._read_and_encode(src, limit, augment=False))

    def _read_and_encode(self, src: TaskData, limit: int | None, augment: bool) -> EncodedSplit:
        assert self.tokenizer is not None
        texts, labels = read_split(src, Schema.of(self.cfg), limit)
        if augment and self.cfg.augment_copies > 0:
            rows = [list(row) for row in zip(*texts, strict=True)]
            copies = self._augment(src, rows)
            texts = [col + [row[f] for row in copies] for f, col in enumerate(texts)]
            labels = [*labels, *(y for y in labels for _ in range(self.cfg.augment_copies))]
            self.augment_sample = sample_table(rows, copies, self.cfg.augment_copies)
        return encode(self.tokenizer, texts, labels, self.cfg.max_length)

    def _augment(self, src: TaskData, rows: list[list[str]]) -> list[list[str]]:
        """TinyBERT's augmented copies of the training ``rows``, cached by everything they depend on."""
        assert self.tokenizer is not None and self.mlm is not None
        tok, mlm, cfg = self.tokenizer, self.mlm, self.cfg
        norm = tok.normalizer
        lowercase = norm is not None and norm.normalize_str("A") == "a"  # the vocabulary is uncased
        files = [{"path": f, "size": os.path.getsize(f), "mtime": os.path.getmtime(f)} for f in src.files]
        key: dict[str, object] = {
            "train": src.name,
            "files": files,
            "texts": hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest(),
            "model": self.mlm_id,
            "copies": cfg.augment_copies,
            "prob": cfg.augment_prob,
            "top_k": cfg.augment_top_k,
            "seed": self.seed,
            "vocab": vocab_digest(tok),
            "lowercase": lowercase,
        }

        def compute() -> list[list[str]]:
            print(  # the status line of a phase before the run exists; a progress bar follows on a terminal
                f"{cfg.task}: augmenting {len(rows)} training examples, {cfg.augment_copies} copies each "
                f"(TinyBERT's augmentation; candidates from the masked LM {self.mlm_id}); cached for later runs",
                file=sys.stderr,
                flush=True,
            )
            args = (cfg.augment_copies, cfg.augment_prob, cfg.augment_top_k, self.seed, lowercase)
            return augment_rows(rows, tok, mlm, *args)

        return cached_augmentation(self.cache_dir, key, compute)

    def setup(self, stage: str | None = None) -> None:
        """Read, check and tokenize the training split and every dev set (first call only).

        Raises:
            DataError: unreadable or empty split, missing column, label outside ``[0, num_labels)``
                (classification) or not a number (regression), or an unusable tokenizer.
        """
        if self.train_set is not None:
            return
        self.tokenizer = self._load_tokenizer()
        train = self._encode(self._train_src, self.limit_train, augment=True)
        self.val_sets = {name: self._encode(src, self.cfg.validation_examples) for name, src in self._dev_srcs}
        self.train_set = train

    def _ready(self) -> tuple[EncodedSplit, EncodedSplit]:
        self.setup()
        assert self.train_set is not None and self.val_set is not None
        return self.train_set, self.val_set

    @property
    def num_train(self) -> int:
        """Training examples (after ``limit_train``; with augmentation, the copies included)."""
        return len(self._ready()[0])

    @property
    def num_validation(self) -> int:
        """Examples of the task's own dev set."""
        return len(self._ready()[1])

    @property
    def majority_accuracy(self) -> float | None:
        """Dev accuracy of always predicting the most frequent training label (ties: lowest); None
        for regression."""
        if self.cfg.kind == "regression":
            return None
        train, val = self._ready()
        counts = Counter(train.labels.tolist())
        majority = min(counts, key=lambda label: (-counts[label], label))
        return float((val.labels == majority).mean())

    def _loader(self, split: EncodedSplit, shuffle: bool, skip: int = 0) -> DataLoader[Example]:
        """Training batches padded to a bucket's width and all of ``batch_size`` rows when ``bucketed`` (a
        compiled step: a few shapes), dev batches (scored eager) to their longest row."""
        assert self.tokenizer is not None
        buckets = self.buckets if shuffle else ()
        collate_rows = partial(collate, pad_id=special_ids(self.tokenizer).pad, buckets=buckets)
        size = self.cfg.batch_size
        return task_loader(
            split, size, collate_rows, self.seed, shuffle, self.num_workers, skip, self.pinned(), bool(buckets)
        )

    def train_dataloader(self) -> DataLoader[Example]:
        """Training batches, shuffled by a generator seeded with ``seed``."""
        return self._loader(self._ready()[0], shuffle=True, skip=self.take_skip())

    def on_after_batch_transfer(self, batch: object, dataloader_idx: int) -> object:
        """Batches from workers arrive packed (:mod:`ablate.datamodules.transfer`): the dict, as views."""
        return unpack(batch)

    def val_dataloader(self) -> DataLoader[Example] | list[DataLoader[Example]]:
        """Dev batches in file order: one loader, or one per dev set (``dev_names``'s order)."""
        self._ready()
        loaders = [self._loader(split, shuffle=False) for split in self.val_sets.values()]
        return loaders[0] if len(loaders) == 1 else loaders
