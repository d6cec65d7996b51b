"""The fine-tuning LightningDataModule: GLUE-style single-sentence or sentence-pair classification.

``finetune.train``/``finetune.validation`` are local ``.tsv``/``.csv``/``.json``/``.jsonl`` files
(optionally ``.gz``), streamed through ``datasets`` (nothing cached), or ``datasets`` hub names
(``nyu-mll/glue:sst2``, ``path/config``, ``path:config``) whose ``train``/``validation`` splits (or
``finetune.train_split``/``validation_split``) go to the ``datasets`` cache, or are read from the
local copies the data catalog maps them to (:mod:`ablate.datamodules.sources`).
A row is ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` (token type 1 from b on).
Batches: ``input_ids``, ``token_type_ids`` (B, T) long, padded with [PAD] to the longest row;
``attention_mask`` (B, T) bool; ``labels`` (B,) long. With ``finetune.augment_copies``, the training
split is enlarged by TinyBERT's data augmentation (:mod:`ablate.datamodules.augment`), cached on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import datasets
import lightning.pytorch as pl
import numpy as np
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader, Dataset

from ablate.datamodules.augment import augment_rows, cached_augmentation, sample_table, vocab_digest
from ablate.datamodules.catalog import hub_hint
from ablate.datamodules.sources import TaskData, resolve_task
from ablate.datamodules.tokenizer import cache_root, special_ids
from ablate.datamodules.transfer import packed, unpack
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.experiment import DataConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.model.heads import PretrainingModel

_READ_BATCH = 8192  # rows per batch pulled from `datasets`, and texts per encode_batch call


def _read(src: TaskData, columns: list[str], limit: int | None) -> dict[str, list[Any]]:
    """The ``columns`` of a split (the first ``limit`` rows), read through ``datasets``."""
    if src.files and os.path.getsize(src.files[0]) == 0:
        raise DataError(f"{src.key}: {src.name}: no examples")
    columns = list(dict.fromkeys(columns))  # label first, then the text fields
    kwargs: dict[str, Any] = {}
    if src.builder == "csv":  # SST-2 has quotes inside sentences; "NA", "null" are sentences too
        kwargs = {"delimiter": "\t" if ".tsv" in Path(src.files[0]).suffixes else ",", "quoting": 3, "na_filter": False}
    found: list[str] | None = None
    out: dict[str, list[Any]] = {c: [] for c in columns}
    try:
        if src.files:
            ds: Any = datasets.load_dataset(
                src.builder, data_files=list(src.files), split="train", streaming=True, **kwargs
            )
        else:
            ds = datasets.load_dataset(src.builder, src.config, split=src.split)
        for batch in ds.iter(batch_size=_READ_BATCH):
            found = found or list(batch)
            if any(c not in batch for c in columns):
                break
            n = len(batch[columns[0]])
            take = n if limit is None else min(n, limit - len(out[columns[0]]))
            for c in columns:
                out[c].extend(batch[c][:take])
            if limit is not None and len(out[columns[0]]) >= limit:
                break
    except Exception as exc:  # noqa: BLE001 - any failure to read is the data's problem
        what = "cannot read" if src.files else f"cannot load the hub dataset's {src.split!r} split"
        first = (str(exc).splitlines() or [""])[0] + ("" if src.files else hub_hint(src.name))
        raise DataError(f"{src.key}: {src.name}: {what}: {type(exc).__name__}: {first}") from None
    for c, field in zip(columns, ("finetune.label_field", *["finetune.text_fields"] * 2), strict=False):
        if found is not None and c not in found:
            raise DataError(f"{field}: {c!r} is not a column of {src.name} (columns: {', '.join(found)})")
    if not out[columns[0]]:
        raise DataError(f"{src.key}: {src.name}: no examples")
    return out


def _check_labels(src: TaskData, labels: list[Any], num_labels: int) -> list[int]:
    """``labels``, checked to be integers in ``[0, num_labels)``."""
    bad = [v for v in labels if not isinstance(v, int)]
    if bad:
        raise DataError(f"finetune.label_field: {src.name} has a non-integer label {bad[0]!r}")
    out = [v for v in labels if not 0 <= v < num_labels]
    if out:
        raise DataError(f"finetune.num_labels: {src.name} has label {out[0]} outside [0, {num_labels})")
    return labels


def _trim(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Lengths after trimming the longer sequence first (ties: b), as ``longest_first``."""
    excess = la + lb - budget
    if excess <= 0:
        return la, lb
    if excess <= abs(la - lb):
        return (la - excess, lb) if la > lb else (la, lb - excess)
    rest, m = excess - abs(la - lb), min(la, lb)
    return m - rest // 2, m - (rest + 1) // 2


Example = tuple[np.ndarray, int, int]
"""One row of an :class:`EncodedSplit`: its token ids, its tokens of type 0, its label."""


class EncodedSplit(Dataset[Example]):
    """Tokenized examples in flat arrays: ``ids[offsets[i]:offsets[i+1]]`` is row ``i``.

    Attributes:
        ids: every row's token ids ([CLS]/[SEP] included), concatenated (int32).
        offsets: row boundaries, ``len(self) + 1`` of them.
        first: tokens of type 0 per row ([CLS] a [SEP]).
        labels: class per row (int64).
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, first: np.ndarray, labels: np.ndarray) -> None:
        self.ids, self.offsets, self.first, self.labels = ids, offsets, first, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Example:
        return self.ids[self.offsets[i] : self.offsets[i + 1]], int(self.first[i]), int(self.labels[i])


def encode(tok: Tokenizer, texts: list[list[str]], labels: list[int], max_length: int) -> EncodedSplit:
    """Tokenize one (``[texts_a]``) or two (``[texts_a, texts_b]``) text columns.

    Args:
        tok: a WordPiece tokenizer with ``[CLS]``/``[SEP]`` (its post-processor is not used).
        texts: the text columns, each as long as ``labels``.
        labels: class per example.
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
    return EncodedSplit(
        np.asarray(ids, dtype=np.int32), offsets, np.asarray(first, dtype=np.int64), np.asarray(labels, dtype=np.int64)
    )


def collate(rows: list[Example], pad_id: int = 0, length: int | None = None) -> dict[str, torch.Tensor]:
    """Pad rows of :class:`EncodedSplit` to the longest one (or to ``length`` tokens, at least the
    longest): the batch dict of tensors.

    The loaders pad to the longest row: every layer's cost grows with T, and a classification
    batch is far shorter than ``finetune.max_length`` (SST-2's batches of 32 are about 50
    tokens long at ``max_length`` 128; ``ablate bench loop --regime finetune`` measures the
    step on both). Padding keys are masked out of attention and the logits read [CLS], so a
    row's logits do not depend on its batch's padding (up to float rounding; MobileBERT's
    trigram embedding reads a row's next token, [PAD] or the end, and is the exception).
    """
    lengths = torch.tensor([len(ids) for ids, _, _ in rows])
    width = max(int(lengths.max()), length or 0)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, (ids, _, _) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.from_numpy(ids.astype(np.int64))
    positions = torch.arange(input_ids.shape[1])[None, :]
    mask = positions < lengths[:, None]
    first = torch.tensor([f for _, f, _ in rows])[:, None]
    return {
        "input_ids": input_ids,
        "token_type_ids": ((positions >= first) & mask).long(),
        "attention_mask": mask,
        "labels": torch.tensor([y for _, _, y in rows], dtype=torch.long),
    }


class ClassificationDataModule(pl.LightningDataModule):
    """Reads, checks and tokenizes ``finetune.train``/``finetune.validation`` once, in ``setup``.

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

    Attributes:
        tokenizer, train_set, val_set: the tokenizer and the tokenized splits (after ``setup``);
            with augmentation, ``train_set`` holds the originals, then every example's copies
            (example 0's first), each with its original's label.
        augment_sample: a TSV of the first examples and their copies (after ``setup``), or None
            without augmentation.

    Raises:
        ConfigError: ``finetune.train`` is unset, ``finetune.validation`` is unset for a local file,
            or ``finetune.augment_copies`` is set without ``mlm``.
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
        mlm: PretrainingModel | None = None,
        cache_dir: str | Path | None = None,
        mlm_id: str = "",
    ) -> None:
        super().__init__()
        if limit_train is not None and limit_train <= 0:
            raise ValueError("limit_train must be positive or None")
        if cfg.train is None:
            raise ConfigError("finetune.train: required to fine-tune (a data file or a hub name)")
        self.cfg, self.tokenizer_path, self.seed = cfg, Path(tokenizer_path), seed
        self.num_workers, self.limit_train = num_workers, limit_train
        self._train_src = resolve_task("finetune.train", cfg.train, cfg.train_split, "train")
        if cfg.validation is None and self._train_src.is_file:
            raise ConfigError("finetune.validation: required for a local train file")
        val = cfg.validation or cfg.train
        self._val_src = resolve_task("finetune.validation", val, cfg.validation_split, "validation")
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
        self.val_set: EncodedSplit | None = None

    def prepare_data(self) -> None:
        """Download hub splits into the ``datasets`` cache (once per node); local files: nothing."""
        for src in (self._train_src, self._val_src):
            if not src.files:
                _read(src, [self.cfg.label_field, *self.cfg.text_fields], 1)

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
        assert self.tokenizer is not None
        cols = _read(src, [self.cfg.label_field, *self.cfg.text_fields], limit)
        labels = _check_labels(src, cols[self.cfg.label_field], self.cfg.num_labels)
        texts = [["" if t is None else str(t) for t in cols[f]] for f in self.cfg.text_fields]
        if augment and self.cfg.augment_copies > 0:
            rows = [list(row) for row in zip(*texts, strict=True)]
            copies = self._augment(src, rows)
            texts = [col + [row[f] for row in copies] for f, col in enumerate(texts)]
            labels = labels + [y for y in labels for _ in range(self.cfg.augment_copies)]
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
        """Read, check and tokenize both splits (first call only).

        Raises:
            DataError: unreadable or empty split, missing column, label outside
                ``[0, num_labels)``, or an unusable tokenizer.
        """
        if self.train_set is not None:
            return
        self.tokenizer = self._load_tokenizer()
        train = self._encode(self._train_src, self.limit_train, augment=True)
        self.val_set, self.train_set = self._encode(self._val_src, self.cfg.validation_examples), train

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
        """Dev examples."""
        return len(self._ready()[1])

    @property
    def majority_accuracy(self) -> float:
        """Dev accuracy of always predicting the most frequent training label (ties: lowest)."""
        train, val = self._ready()
        counts = Counter(train.labels.tolist())
        majority = min(counts, key=lambda label: (-counts[label], label))
        return float((val.labels == majority).mean())

    def _loader(self, split: EncodedSplit, shuffle: bool) -> DataLoader[Example]:
        assert self.tokenizer is not None
        if self.num_workers > 0:  # the Rust tokenizer's thread pool must not be used across fork
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        generator = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(
            split,
            self.cfg.batch_size,
            shuffle=shuffle,
            generator=generator,
            drop_last=False,
            collate_fn=packed(partial(collate, pad_id=special_ids(self.tokenizer).pad), self.num_workers),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader[Example]:
        """Training batches, shuffled by a generator seeded with ``seed``."""
        return self._loader(self._ready()[0], shuffle=True)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Batches from workers arrive packed (:mod:`datamodules.transfer`): the dict, as views."""
        return unpack(batch)

    def val_dataloader(self) -> DataLoader[Example]:
        """Dev batches in file order."""
        return self._loader(self._ready()[1], shuffle=False)
