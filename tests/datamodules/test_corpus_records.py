"""A corrupt record inside a corpus: one DataError naming the file and the line, wherever it is read
(here, in the reading process, and in a DataLoader worker, whose error torch re-raises wrapped)."""

from __future__ import annotations

import gzip
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.utils.data import DataLoader, IterableDataset

from ablate.datamodules.corpus import find_bad_record, iter_documents
from ablate.datamodules.sources import resolve_corpus
from ablate.lightning_modules.config.errors import DataError, worker_message
from ablate.lightning_modules.config.experiment import DataConfig

GOOD = [f'{{"text": "Document {i}. It has two sentences."}}\n'.encode() for i in range(60)]


def _jsonl(path: Path, lines: list[bytes], truncate: bool = False) -> Path:
    data = gzip.compress(b"".join(lines)) if path.suffix == ".gz" else b"".join(lines)
    path.write_bytes(data[: len(data) * 2 // 3] if truncate else data)
    return path


@pytest.mark.parametrize(
    ("name", "bad", "expected"),
    [
        ("c.jsonl.gz", b'{"text": "unterminated}\n', "not valid JSON at line 31 (Invalid control character"),
        ("c.jsonl", b'{"text": "caf\xe9"}\n', "not UTF-8 text at line 31 (byte 14"),
        ("c.jsonl", b"[1, 2]\n", "not a JSON object at line 31"),
        ("c.jsonl", b"{'text': 'single quotes'}\n", "not valid JSON at line 31 (Expecting property name"),
        ("c.txt", b"caf\xe9\n", "not UTF-8 text at line 31 (byte 4"),
    ],
)
def test_the_bad_record_is_named_by_file_and_line(tmp_path, name, bad, expected):
    path = _jsonl(tmp_path / name, [*GOOD[:30], bad, *GOOD[30:]])
    spec = resolve_corpus(str(path))
    bad = find_bad_record(spec)
    assert bad is not None and bad.startswith(f"{tmp_path / name}: {expected}"), bad
    with pytest.raises(DataError) as err:
        list(iter_documents(DataConfig(corpus=str(path)), None))
    assert str(err.value).startswith(f"data.corpus: {path}: cannot read {path}: {expected}"), err.value


def test_a_truncated_gzip_and_the_second_of_two_files(tmp_path):
    _jsonl(tmp_path / "a.jsonl.gz", GOOD)
    _jsonl(tmp_path / "b.jsonl.gz", GOOD * 20, truncate=True)
    truncated = r"cannot read \S+/b\.jsonl\.gz: truncated or corrupt after line \d+ \(Compressed file ended"
    with pytest.raises(DataError, match=truncated):
        list(iter_documents(DataConfig(corpus=str(tmp_path)), None))
    assert find_bad_record(resolve_corpus(str(tmp_path / "a.jsonl.gz"))) is None


def test_datasets_logs_no_line_of_its_own(tmp_path, caplog):
    path = _jsonl(tmp_path / "c.jsonl", [*GOOD, b"{oops\n"])
    with caplog.at_level(logging.DEBUG), pytest.raises(DataError):
        list(iter_documents(DataConfig(corpus=str(path)), None))
    assert not [r for r in caplog.records if r.name.startswith("datasets") and r.levelno >= logging.ERROR]


class _Corpus(IterableDataset):
    def __init__(self, corpus: str) -> None:
        self.corpus = corpus

    def __iter__(self) -> Iterator[str]:
        return iter_documents(DataConfig(corpus=self.corpus), None)


def test_an_error_in_a_dataloader_worker_keeps_its_one_line(tmp_path):
    path = _jsonl(tmp_path / "c.jsonl", [*GOOD, b"{oops\n"])
    with pytest.raises(DataError) as err:
        list(DataLoader(_Corpus(str(path)), batch_size=None, num_workers=1))
    message = str(err.value)
    assert "\n" not in message and "Caught" not in message, message
    assert message.startswith(f"data.corpus: {path}: cannot read {path}: not valid JSON at line 61 ("), message


def test_worker_message_leaves_other_text_alone():
    assert worker_message("data.corpus: x: empty") == "data.corpus: x: empty"
    wrapped = (
        "Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n    raise DataError(...)\n'
        "ablate.lightning_modules.config.errors.DataError: data.corpus: x: bad\n"
    )
    assert worker_message(wrapped, DataError) == "data.corpus: x: bad"
    assert str(DataError(wrapped)) == "data.corpus: x: bad"
