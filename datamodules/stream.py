"""Documents -> tokenized sentences -> segment pairs -> masked, padded batches: :class:`PretrainStream`,
the ``IterableDataset`` behind the pre-training DataLoaders, one reader's share of the corpus per
DataLoader worker and DDP rank, seeded from ``(seed, split, epoch, rank, worker)`` (docs/data.md,
"The pre-training pipeline")."""

from __future__ import annotations

import hashlib
import itertools
import random
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

import torch
from tokenizers import Tokenizer

from ablate.datamodules.corpus import Split, iter_documents
from ablate.datamodules.masking import mask_tokens
from ablate.datamodules.pairs import Instance, SentenceTask, create_instances, split_sentences
from ablate.datamodules.sources import resolve_corpus
from ablate.datamodules.tokenizer import NUM_SPECIAL, SpecialIds, continuation_mask, special_ids
from ablate.lightning_modules.config.errors import DataError
from ablate.lightning_modules.config.experiment import DataConfig, ObjectiveConfig

T = TypeVar("T")
ENCODE_DOCS = 64
"""Documents tokenized per ``encode_batch`` call."""
NSP_RECENT_DOCS = 32
"""Recent documents kept for drawing NSP's random next segments."""


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (unlike ``hash``, same in every process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items (the last one may be shorter)."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def tokenize_documents(
    docs: Iterable[str], tokenizer: Tokenizer, chunk: int = ENCODE_DOCS
) -> Iterator[list[list[int]]]:
    """Each document as a list of tokenized sentences (no special tokens).

    Sentences of ``chunk`` documents go through one ``encode_batch_fast`` call (Rust,
    no offsets), which is where the time goes.
    """
    for docs_chunk in batched(docs, chunk):
        sentences = [split_sentences(doc) for doc in docs_chunk]
        flat = [s for doc in sentences for s in doc]
        ids = [enc.ids for enc in tokenizer.encode_batch_fast(flat, add_special_tokens=False)]
        start = 0
        for doc in sentences:
            yield [s for s in ids[start : start + len(doc)] if s]
            start += len(doc)


def iter_instances(
    docs: Iterable[list[list[int]]],
    rng: random.Random,
    max_length: int,
    short_seq_prob: float,
    task: SentenceTask,
    recent_docs: int = NSP_RECENT_DOCS,
) -> Iterator[Instance]:
    """Instances of a stream of tokenized documents; NSP draws from the recent ones."""
    recent: deque[list[list[int]]] = deque(maxlen=recent_docs)
    for doc in docs:
        yield from create_instances(doc, rng, max_length, short_seq_prob, task, recent)
        if task == "nsp" and doc:
            recent.append(doc)


def shuffle_buffer(items: Iterable[T], size: int, rng: random.Random) -> Iterator[T]:
    """Approximate streaming shuffle with a buffer of ``size`` items (0 or 1 = none)."""
    if size <= 1:
        yield from items
        return
    buf: list[T] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        yield buf[j]
        buf[j] = item
    rng.shuffle(buf)
    yield from buf


def collate(
    instances: Sequence[Instance],
    ids: SpecialIds,
    objective: ObjectiveConfig,
    vocab_size: int,
    continuation: torch.Tensor,
    generator: torch.Generator,
    width: int | None = None,
) -> dict[str, torch.Tensor]:
    """Pad instances into a batch and mask it.

    With ``width`` (``data.max_length``), every batch is padded to it: one shape for every
    step, so a compiled model runs one graph (and CUDA graphs can replay it). Instances are
    packed up to that length, so little is padding.

    Returns:
        ``input_ids`` (B, T) long ``[CLS] A [SEP] B [SEP]`` then ``[PAD]``;
        ``token_type_ids`` (B, T) long, 1 on ``B [SEP]``; ``attention_mask`` (B, T) bool;
        ``mlm_labels`` (B, T) long, -100 except at selected positions; ``sentence_label``
        (B,) long. T is ``width``, or the longest sequence in the batch without it.
    """
    rows, types = [], []
    for a, b, _ in instances:
        first = [ids.cls, *a, ids.sep]
        rows.append(first + [*b, ids.sep] if b else first)
        types.append((len(first), len(b) + 1 if b else 0))
    width = max(width or 0, *(len(r) for r in rows))
    input_ids = torch.tensor([r + [ids.pad] * (width - len(r)) for r in rows], dtype=torch.long)
    positions = torch.arange(width)
    len_a = torch.tensor([t[0] for t in types]).unsqueeze(1)
    length = torch.tensor([t[0] + t[1] for t in types]).unsqueeze(1)
    attention_mask = positions < length
    token_type_ids = ((positions >= len_a) & attention_mask).long()
    special = (input_ids == ids.cls) | (input_ids == ids.sep) | ~attention_mask
    word_starts = ~continuation[input_ids]
    masked, labels = mask_tokens(
        input_ids,
        special,
        vocab_size,
        ids.mask,
        objective.mask_prob,
        objective.masking,
        objective.max_ngram,
        generator,
        word_starts,
        num_special=NUM_SPECIAL,
    )
    return {
        "input_ids": masked,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "mlm_labels": labels,
        "sentence_label": torch.tensor([inst.label for inst in instances], dtype=torch.long),
    }


class DocumentStream(torch.utils.data.IterableDataset[str]):
    """Documents of one split; each DataLoader worker (and DDP rank) reads its own share.

    Args:
        data: corpus settings.
        split: ``train``, ``validation`` or None (every document).
        rank: DDP rank; world_size: DDP world size.
    """

    def __init__(self, data: DataConfig, split: Split | None = "train", rank: int = 0, world_size: int = 1) -> None:
        super().__init__()
        self.data, self.split, self.rank, self.world_size = data, split, rank, world_size

    def __iter__(self) -> Iterator[str]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from iter_documents(
            self.data, self.split, rank=self.rank, world_size=self.world_size, worker=worker, num_workers=num_workers
        )


class PretrainStream(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """Batches of one split for one DDP rank; DataLoader workers split it further.

    Args:
        data: corpus and batching settings.
        objective: sentence task and masking.
        tokenizer_json: the tokenizer serialised (``Tokenizer.to_str()``), cheap to
            send to workers.
        seed: run seed; epochs, ranks and workers derive their own from it.
        split: ``train`` (endless, reshuffled each epoch) or ``validation`` (one
            deterministic pass: fixed order, pairs and masks).
        rank: DDP rank; world_size: DDP world size.
        max_batches: stop after this many batches in all (validation cap), or None.
        skip: global batches already consumed (a run resumed from a checkpoint): they are
            built and dropped, so the stream and its masks continue exactly where they were.
    """

    def __init__(
        self,
        data: DataConfig,
        objective: ObjectiveConfig,
        tokenizer_json: str,
        seed: int,
        split: Split,
        rank: int = 0,
        world_size: int = 1,
        max_batches: int | None = None,
        skip: int = 0,
    ) -> None:
        super().__init__()
        self.data, self.objective, self.seed, self.split = data, objective, seed, split
        self.tokenizer_json = tokenizer_json
        self.rank, self.world_size, self.max_batches, self.skip = rank, world_size, max_batches, skip

    def _instances(self, tokenizer: Tokenizer, worker: int, num_workers: int) -> Iterator[Instance]:
        data, train = self.data, self.split == "train"
        spec = resolve_corpus(data.corpus, data.text_field)
        for epoch in itertools.count() if train else range(1):
            rng = random.Random(derive_seed(self.seed, self.split, epoch, self.rank, worker))
            docs = iter_documents(
                data,
                self.split,
                rank=self.rank,
                world_size=self.world_size,
                worker=worker,
                num_workers=num_workers,
                shuffle_seed=derive_seed(self.seed, "docs") if train and data.shuffle_buffer else None,
                epoch=epoch,
                spec=spec,
            )
            tokenized = tokenize_documents(docs, tokenizer)
            instances = iter_instances(tokenized, rng, data.max_length, data.short_seq_prob, self.objective.sentence)
            if train:
                instances = shuffle_buffer(instances, data.shuffle_buffer, rng)
            produced = False
            for instance in instances:
                produced = True
                yield instance
            if train and not produced:
                raise DataError(
                    f"data.corpus: {data.corpus}: no training example for rank {self.rank} worker {worker} "
                    f"of {num_workers}; the corpus is too small for this many workers"
                )

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        tokenizer = Tokenizer.from_str(self.tokenizer_json)
        ids = special_ids(tokenizer)
        continuation = torch.tensor(continuation_mask(tokenizer), dtype=torch.bool)
        vocab_size = tokenizer.get_vocab_size()
        generator = torch.Generator().manual_seed(derive_seed(self.seed, self.split, "mask", self.rank, worker))
        batches = batched(self._instances(tokenizer, worker, num_workers), self.data.batch_size)
        if self.max_batches is not None:  # worker w yields global batches w, w + k, ... < cap
            batches = itertools.islice(batches, len(range(worker, self.max_batches, num_workers)))
        skip = len(range(worker, self.skip, num_workers))  # worker w yielded global batches w, w + k, ...
        for i, chunk in enumerate(batches):
            batch = collate(
                chunk,
                ids,
                self.objective,
                vocab_size,
                continuation,
                generator,  # advances the masks
                self.data.max_length,
            )
            if i >= skip:
                yield batch
