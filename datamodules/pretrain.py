"""The pre-training LightningDataModule: MLM + SOP/NSP batches from a streamed corpus
(docs/data.md, "The pre-training pipeline")."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import MLFlowLogger
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from ablate.datamodules.corpus import Split, check_corpus
from ablate.datamodules.handover import direct_context
from ablate.datamodules.memo import Kept, files_state
from ablate.datamodules.sources import resolve_corpus
from ablate.datamodules.stream import PretrainStream
from ablate.datamodules.tokenizer import SpecialIds, load_or_train_tokenizer, special_ids
from ablate.datamodules.transfer import GROUP, GroupedLoader, PackedGroup, TrainPosition, packed, unpack
from ablate.lightning_modules.config.errors import FAIL_REASON, AblateError
from ablate.lightning_modules.config.experiment import DataConfig, ObjectiveConfig


class PretrainDataModule(TrainPosition, pl.LightningDataModule):
    """Streams pre-training batches; trains or loads the WordPiece tokenizer first.

    Batches are dicts of tensors (:func:`ablate.datamodules.stream.collate`): ``input_ids``,
    ``token_type_ids``, ``attention_mask`` (bool), ``mlm_labels``, ``sentence_label``.

    Args:
        data: corpus, tokenizer and batching settings.
        objective: sentence task (``sop|nsp|none``) and masking strategy.
        vocab_size: ``model.vocab_size``, the size of the trained tokenizer (of ``data.tokenizer``:
            checked; None there: its own, for a run whose model is its source's, :func:`vocab_size`).
        seed: run seed (shuffling, pairs and masking derive from it).
        val_batches: cap on batches per validation pass (per rank); None = every
            held-out document once.

    Attributes:
        tokenizer: the trained ``tokenizers.Tokenizer`` (after ``prepare_data``/``setup``).
        tokenizer_path: its cached JSON file, to log as a run artifact.
    """

    def __init__(
        self,
        data: DataConfig,
        objective: ObjectiveConfig,
        vocab_size: int | None,
        seed: int,
        val_batches: int | None = None,
    ) -> None:
        super().__init__()
        if val_batches is not None and val_batches <= 0:
            raise ValueError("val_batches must be positive or None")
        self.data, self.objective = data, objective
        self.vocab_size, self.seed, self.val_batches = vocab_size, seed, val_batches
        self.tokenizer: Tokenizer | None = None
        self.tokenizer_path: Path | None = None
        self._checked = False
        self.skip_train_batches = 0  # set when a run resumes from a checkpoint (load_state_dict)

    def _ensure_ready(self) -> None:
        if not self._checked:  # DataError for a missing/empty/unreadable corpus, before training
            check_corpus(self.data, resolve_corpus(self.data.corpus, self.data.text_field))
            self._checked = True
        if self.tokenizer is None:
            self.tokenizer, self.tokenizer_path = load_or_train_tokenizer(self.data, self.vocab_size)

    def prepare_data(self) -> None:
        """Check the corpus and train (or load) the tokenizer, once per node."""
        self._ensure_ready()

    def setup(self, stage: str | None = None) -> None:
        """Check the corpus and load the tokenizer (trained by ``prepare_data``) on every rank."""
        self._ensure_ready()

    @property
    def special_ids(self) -> SpecialIds:
        """Ids of ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (0..4)."""
        self._ensure_ready()
        assert self.tokenizer is not None
        return special_ids(self.tokenizer)

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _loader(self, split: Split, max_batches: int | None) -> DataLoader[dict[str, torch.Tensor]]:
        self._ensure_ready()
        assert self.tokenizer is not None
        rank, world_size = self._rank()
        stream = PretrainStream(
            self.data,
            self.objective,
            self.tokenizer.to_str(),
            self.seed,
            split,
            rank=rank,
            world_size=world_size,
            max_batches=max_batches,
            skip=self.skip_train_batches if split == "train" else 0,
        )
        trainer = self.trainer
        workers = self.data.workers(trainer.world_size if trainer is not None else 1)
        on_cuda = self.pinned()
        if workers > 0:  # the Rust tokenizer's thread pool must not be used across fork
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if workers > 0 and max_batches is None:  # an endless stream: its batches a few at a time
            return GroupedLoader(
                stream,
                batch_size=GROUP,
                collate_fn=PackedGroup.pack,
                num_workers=workers,
                persistent_workers=True,
                prefetch_factor=2,  # groups: 2 x GROUP batches ready in each worker
                multiprocessing_context=direct_context(),
                pin_memory=on_cuda,  # page-locked batches: Lightning's copy to the GPU does not block
                first_worker=stream.skip,  # worker w yields global batches w, w + workers, ...
            )
        return DataLoader(
            stream,
            batch_size=None,
            collate_fn=packed(None, workers),
            num_workers=workers,
            persistent_workers=workers > 0,
            prefetch_factor=4 if workers > 0 else None,
            multiprocessing_context=direct_context() if workers > 0 else None,
            pin_memory=on_cuda,
        )

    def on_exception(self, exception: BaseException) -> None:
        """A user's error stopping the fit (a corrupt corpus record, read in a DataLoader worker or
        here) is tagged on the run as its failure reason (``ablate.fail_reason``), the one line the
        command prints; the run itself is ended FAILED by whoever started it."""
        if not isinstance(exception, AblateError) or self.trainer is None:
            return
        for logger in self.trainer.loggers:
            if not isinstance(logger, MLFlowLogger):  # the only logger with a run to tag
                continue
            run_id = logger.run_id
            if run_id is None:
                continue
            try:
                logger.experiment.set_tag(run_id, FAIL_REASON, str(exception)[:500])
            except Exception:  # noqa: BLE001 - a store problem must not hide the error itself
                pass

    def on_after_batch_transfer(self, batch: object, dataloader_idx: int) -> object:
        """Batches from workers arrive packed (:mod:`ablate.datamodules.transfer`): the dict, as views."""
        return unpack(batch)

    def train_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        """Endless training batches, reshuffled each epoch of the corpus (seed + epoch); a fit resumed
        from a checkpoint skips the batches it consumed, and the next fit (a run's next phase) starts
        the stream afresh, as it does in a run that was not interrupted."""
        loader = self._loader("train", None)
        self.take_skip()
        return loader

    def val_dataloader(self) -> DataLoader[dict[str, torch.Tensor]]:
        """Finite, deterministic validation batches: the same pairs and masks every time, so they are
        read and tokenized once per process (:func:`validation_batches`) and handed over from memory to
        every later validation, phase and run that asks for the same ones."""
        self._ensure_ready()
        assert self.tokenizer is not None
        rank, world_size = self._rank()
        batches = validation_batches(
            PretrainStream(
                self.data,
                self.objective,
                self.tokenizer.to_str(),
                self.seed,
                "validation",
                rank=rank,
                world_size=world_size,
                max_batches=self.val_batches,
            )
        )
        return DataLoader(batches, batch_size=None, pin_memory=self.pinned())  # type: ignore[arg-type]  # a list


_VALIDATION: Kept[list[dict[str, torch.Tensor]]] = Kept(8)
_PROBES: Kept[list[dict[str, torch.Tensor]]] = Kept(4)  # the intrinsic probes' training batches
"""The validation batches read in this process (the last 8 sets asked for), by what they are made of
(:func:`validation_batches`)."""


def validation_batches(stream: PretrainStream) -> list[dict[str, torch.Tensor]]:
    """The batches of ``stream`` (a validation split, finite and deterministic), read once per process,
    in this process (the same batches whatever ``data.num_workers``): keyed by everything they are made
    of (the data and objective settings, the tokenizer, the seed, the rank, the number of batches) and
    the corpus files' state (a rewritten file is read again)."""
    made_of: tuple[object, ...] = (stream.data, stream.objective, stream.tokenizer_json, stream.seed, stream.split)
    made_of += (stream.rank, stream.world_size, stream.max_batches, _files_state(stream.data))
    return _VALIDATION.get(made_of, lambda: list(stream))


def _files_state(data: DataConfig) -> tuple[tuple[str, int, int], ...]:
    """Size and modification time of the corpus's local files (none for a hub or builtin corpus)."""
    corpus = resolve_corpus(data.corpus, data.text_field)
    return files_state(getattr(corpus, "files", None) or ())


Batches = Iterable[dict[str, Any]]


def _first_batches(dm: PretrainDataModule, n: int) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(dm.train_dataloader(), n))


def probe_streams(
    data: DataConfig, vocab_size: int, seed: int = 0, train_batches: int = 40, test_batches: int = 10
) -> dict[str, tuple[Batches, Batches]]:
    """The intrinsic probes' data (:func:`ablate.lightning_modules.methods.probe.intrinsic_eval`): for each
    sentence task, ``nsp`` and ``sop``, the first ``train_batches`` batches of the training stream
    and the first ``test_batches`` of the validation stream.

    The run's data config with its tokenizer (found by fingerprint), default masking (token,
    15%) for every model, and loaders in this process (no workers).
    """
    data = dataclasses.replace(data, num_workers=0)  # no worker processes; same tokenizer fingerprint
    streams: dict[str, tuple[Batches, Batches]] = {}
    for task in ("nsp", "sop"):
        dm = PretrainDataModule(data, ObjectiveConfig(sentence=task), vocab_size, seed, val_batches=test_batches)
        dm.prepare_data()
        # the training batches too are read once per process: every run of a study probes on the same ones
        tokenizer = files_state([dm.tokenizer_path] if dm.tokenizer_path else [])
        made_of = (data, task, vocab_size, seed, train_batches, _files_state(data), tokenizer)
        train = _PROBES.get(made_of, functools.partial(_first_batches, dm, train_batches))
        streams[task] = (train, dm.val_dataloader())
    return streams
