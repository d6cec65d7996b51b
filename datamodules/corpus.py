"""Corpora as streams of documents, read through ``datasets`` in streaming mode (``data.corpus``
resolved by :func:`ablate.datamodules.sources.resolve_corpus`): :func:`iter_documents` reads one
reader's share of a split, a document held out for validation by a hash of its text
(:func:`is_validation`). What a document is in each format: docs/data.md, "The pre-training pipeline"."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import zlib
from collections.abc import Iterator
from typing import Literal

import datasets
from datasets.distributed import split_dataset_by_node

from ablate.datamodules.catalog import hub_hint
from ablate.datamodules.sources import CorpusSpec, error, resolve_corpus
from ablate.lightning_modules.config.errors import DataError
from ablate.lightning_modules.config.experiment import DataConfig

__all__ = [
    "CorpusSpec",
    "Split",
    "check_corpus",
    "document_hash",
    "is_validation",
    "iter_documents",
    "num_shards",
    "open_corpus",
    "partition",
    "resolve_corpus",
]

Split = Literal["train", "validation"]


class _QuietReadFailures(logging.Filter):
    """Drops the line ``datasets`` logs before raising a read failure (``Failed to load JSON from
    file ...``): ablate reports the failure itself, as one line naming the file and record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Failed to load JSON", "Failed to read", "Failed to convert"))


for _name in ("datasets.packaged_modules.json.json", "datasets.packaged_modules.parquet.parquet"):
    logging.getLogger(_name).addFilter(_QuietReadFailures())

_READ_BATCH = 256  # documents per Arrow batch pulled from `datasets`
JSON_CHUNK = 1 << 20
"""Bytes of JSON Lines `datasets` parses at once (its default: 10 MB). A stream's first documents
then arrive after 1 MB is read and parsed, not 10 (each run opens its training and validation
streams, and `datasets` reads a first chunk to learn the columns): a run starts about 0.1 s sooner
per stream, and the throughput of a long run is the same."""
DOC_SHUFFLE_BUFFER = 256
"""Documents in the `datasets` shuffle buffer of the training stream (bounded memory)."""
DOC_SHUFFLE_SHARDS = 1
"""Shards feeding that buffer at once. `datasets` defaults to 10 open readers, each with its
own decompression and Arrow blocks, so memory would grow with the number of shards (+27% peak
RSS for six wiki-en shards against one); one at a time keeps it flat. Shard order is still
shuffled, by seed and epoch."""


def open_corpus(spec: CorpusSpec) -> datasets.IterableDataset:
    """Open a corpus as a streaming ``datasets.IterableDataset`` (nothing is read yet).

    Raises:
        DataError: the corpus cannot be opened (hub unreachable, unreadable file, ...).
    """
    try:
        if spec.builder == "text":
            ds = datasets.load_dataset(
                "text", data_files=list(spec.files), sample_by="paragraph", split="train", streaming=True
            )
        elif spec.is_local:
            chunks = {"chunksize": JSON_CHUNK} if spec.builder == "json" else {}
            ds = datasets.load_dataset(
                spec.builder, data_files=list(spec.files), split="train", streaming=True, **chunks
            )
        else:
            ds = datasets.load_dataset(spec.builder, spec.config_name, split="train", streaming=True)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to open is the corpus's problem
        raise _read_error(spec, exc) from None
    if ds.features is not None and spec.text_field not in ds.features:
        raise DataError(
            f"data.text_field: {spec.text_field!r} is not a column of {spec.source} (columns: {', '.join(ds.features)})"
        )
    return ds


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _bad_json_document(name: str, text: str) -> str | None:
    """A whole-file JSON corpus (``[...]``) that does not parse: where."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{name}: not valid JSON at line {exc.lineno} ({exc.msg}: column {exc.colno})"
    return None


def _bad_record_in(name: str, builder: str) -> str | None:
    """The first unreadable record of one local text or JSON file: ``FILE: problem at line N``."""
    opener = gzip.open if name.endswith(".gz") else open
    n = 0
    try:
        with opener(name, "rb") as fh:
            for n, raw in enumerate(fh, start=1):
                try:
                    line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    return f"{name}: not UTF-8 text at line {n} (byte {exc.start + 1} of the line)"
                if builder != "json" or not line.strip():
                    continue
                if n == 1 and line.lstrip().startswith("["):  # one JSON document, not JSON Lines
                    return _bad_json_document(name, line + b"".join(fh).decode("utf-8", errors="replace"))
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    return f"{name}: not valid JSON at line {n} ({exc.msg}: column {exc.colno})"
                if not isinstance(record, dict):
                    return f'{name}: not a JSON object at line {n} (one record per line: {{"text": ...}})'
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        where = f"after line {n}" if n else "at its start"
        return f"{name}: truncated or corrupt {where} ({_first_line(exc)})"
    except OSError as exc:
        return f"{name}: {exc.strerror or _first_line(exc)}"
    return None


def find_bad_record(spec: CorpusSpec) -> str | None:
    """The first record of a local ``.txt`` or JSON-lines corpus (optionally ``.gz``) that cannot
    be read, as ``FILE: problem at line N`` (not UTF-8, not JSON, truncated gzip), or None.

    Reads the files in order up to that record: called on the error path only, to say where a
    read failed (``datasets`` and Arrow name neither the file nor the line)."""
    if spec.builder not in ("text", "json"):
        return None
    for name in spec.files:
        bad = _bad_record_in(name, spec.builder)
        if bad is not None:
            return bad
    return None


def _read_error(spec: CorpusSpec, exc: BaseException) -> DataError:
    if spec.is_local:
        bad = find_bad_record(spec)
        if bad is not None:
            return error(spec.source, f"cannot read {bad}")
    if isinstance(exc, UnicodeDecodeError):
        return error(spec.source, "not UTF-8 text")
    if spec.is_local:
        return error(spec.source, f"cannot read: {type(exc).__name__}: {_first_line(exc)}")
    hint = hub_hint(spec.source)
    return error(spec.source, f"cannot load this hub dataset: {type(exc).__name__}: {_first_line(exc)}{hint}")


def num_shards(data: DataConfig) -> int:
    """Shards (files, or hub data files) of ``data.corpus``: the units readers split."""
    shards: int = open_corpus(resolve_corpus(data.corpus, data.text_field)).num_shards
    return shards


def document_hash(doc: str) -> float:
    """A stable hash of a document's text, uniform in [0, 1)."""
    digest = hashlib.blake2b(doc.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def is_validation(doc: str, val_fraction: float) -> bool:
    """Whether a document is held out for validation (decided by its text alone)."""
    return document_hash(doc) < val_fraction


def partition(
    ds: datasets.IterableDataset, rank: int, world_size: int, worker: int, num_workers: int
) -> datasets.IterableDataset:
    """One reader's share of a stream; readers are ``world_size * num_workers`` (rank, worker).

    Whole shards go to readers when there are at least as many shards as readers
    (``IterableDataset.shard``); otherwise ``split_dataset_by_node`` over all readers
    gives each one every n-th document. Either way, readers never share a document.
    """
    readers, index = world_size * num_workers, rank * num_workers + worker
    if readers == 1:
        return ds
    if ds.num_shards >= readers:
        return ds.shard(num_shards=readers, index=index, contiguous=False)
    return split_dataset_by_node(ds, rank=index, world_size=readers)


def _clean(text: object, builder: str) -> str:
    if not isinstance(text, str):
        return ""
    if builder == "text":  # a paragraph of a text file: single newlines are line wrapping
        return text.replace("\n", " ").strip()
    return text.strip()


def _group(raws: list[object], builder: str, pending: list[str], doc_chars: int) -> Iterator[str]:
    """Clean documents; for text files, join consecutive paragraphs into documents of about
    ``doc_chars`` characters (one paragraph per line). ``pending`` carries a partial one."""
    for raw in raws:
        doc = _clean(raw, builder)
        if not doc:
            continue
        if builder != "text" or doc_chars == 0:
            yield doc
            continue
        pending[:] = [f"{pending[0]}\n{doc}" if pending else doc]
        if len(pending[0]) >= doc_chars:
            yield pending.pop()


def iter_documents(
    data: DataConfig,
    split: Split | None = "train",
    *,
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    shuffle_seed: int | None = None,
    epoch: int = 0,
    spec: CorpusSpec | None = None,
) -> Iterator[str]:
    """Stream the documents of one split, one reader's share of them.

    Args:
        data: the data config (``corpus``, ``text_field``, ``val_fraction``).
        split: ``train``, ``validation``, or None for every document.
        rank: DDP rank of this reader.
        world_size: number of DDP ranks.
        worker: DataLoader worker id of this reader.
        num_workers: DataLoader workers per rank.
        shuffle_seed: when given, shard order and a small document buffer are shuffled
            with this seed and ``epoch`` (``datasets``' own ``shuffle``/``set_epoch``).
        epoch: epoch number, reshuffling the order each epoch.
        spec: an already resolved corpus (default: resolve ``data.corpus``).

    Yields:
        Non-blank documents, stripped (text-file paragraphs have line wraps joined).

    Raises:
        DataError: the corpus is missing or unreadable (non-UTF-8, malformed json, ...).
    """
    spec = spec or resolve_corpus(data.corpus, data.text_field)
    ds = partition(open_corpus(spec), rank, world_size, worker, num_workers)
    if shuffle_seed is not None:
        ds = ds.shuffle(seed=shuffle_seed, buffer_size=DOC_SHUFFLE_BUFFER, max_buffer_input_shards=DOC_SHUFFLE_SHARDS)
        ds.set_epoch(epoch)
    field = spec.text_field
    batches = ds.iter(batch_size=_READ_BATCH)  # .iter(): we shard ourselves, even in workers
    pending: list[str] = []  # a text-file document still being grouped
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            if pending and (split is None or is_validation(pending[0], data.val_fraction) == (split == "validation")):
                yield pending[0]
            return
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - unreadable data is the corpus's problem
            raise _read_error(spec, exc) from None
        if field not in batch:
            columns = ", ".join(batch)
            raise DataError(f"data.text_field: {field!r} is not a column of {spec.source} (columns: {columns})")
        for doc in _group(batch[field], spec.builder, pending, data.text_doc_chars):
            if split is None or is_validation(doc, data.val_fraction) == (split == "validation"):
                yield doc


_CHECKED: set[str] = set()
"""The corpora :func:`check_corpus` passed in this process, by :func:`_check_key`."""


def _check_key(data: DataConfig, spec: CorpusSpec, max_scan: int) -> str:
    """What a check's outcome depends on: the corpus (its files with sizes and mtimes, or its hub name:
    :meth:`CorpusSpec.identity`), how it is split into documents and splits, and the scan's length."""
    how = (data.text_field, data.val_fraction, data.text_doc_chars, max_scan)
    return json.dumps([spec.identity(), repr(spec), how], sort_keys=True, default=str)


def check_corpus(data: DataConfig, spec: CorpusSpec | None = None, max_scan: int = 200_000) -> None:
    """Fail early if the corpus is missing, empty, or lacks a training or validation document.

    Scans at most ``max_scan`` documents (stopping as soon as both splits have one). A corpus that
    passed once in this process is not scanned again while its files keep their sizes and mtimes
    (a study's later runs); a changed file is checked again.

    Raises:
        DataError: naming the corpus.
    """
    spec = spec or resolve_corpus(data.corpus, data.text_field)
    try:
        key = _check_key(data, spec, max_scan)
    except OSError:  # a file gone since it was resolved: the scan says so
        key = ""
    if key and key in _CHECKED:
        return
    seen, has = 0, {True: False, False: False}
    for doc in iter_documents(data, None, spec=spec):
        has[is_validation(doc, data.val_fraction)] = True
        seen += 1
        if (has[True] and has[False]) or seen >= max_scan:
            break
    if seen == 0:
        raise error(spec.source, "corpus is empty")
    for held_out, name in ((True, "validation"), (False, "training")):
        if not has[held_out]:
            raise error(
                spec.source,
                f"no {name} document among the first {seen} documents "
                f"(data.val_fraction={data.val_fraction}); the corpus is too small",
            )
    if key:
        _CHECKED.add(key)
