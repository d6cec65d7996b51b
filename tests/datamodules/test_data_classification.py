"""Fine-tuning data: SST-2 batches, sentence pairs, truncation, seeded order, one-line errors."""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
from tokenizers import Tokenizer

from ablate.datamodules.classification import ClassificationDataModule, _trim
from ablate.datamodules.tokenizer import train_tokenizer
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.finetune import FinetuneConfig
from tests.conftest import SHARED_DATA

SST2 = SHARED_DATA / "sst2"
CLS, SEP, PAD = 2, 3, 0
PAIRS = [
    ("A man is playing a guitar on the stage.", "Someone plays music.", 0),
    ("The cat sleeps.", "An animal is awake and running around the house all day long.", 2),
    ("Two kids eat ice cream in the park.", "Children are eating.", 0),
    ("It rains.", "The weather is dry.", 1),
]


def _sst2_rows(name: str, limit: int | None = None) -> list[tuple[str, int]]:
    """Rows of an SST-2 file, read independently of the module under test."""
    with open(SST2 / name, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        return [(s, int(label)) for s, label in itertools.islice(reader, limit)]


@pytest.fixture(scope="module")
def sst2() -> Path:
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared SST-2 data not found at {SST2} (expected ../shared/data beside the repo)")
    return SST2


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1,000-piece WordPiece trained on 3,000 SST-2 sentences (or on the pairs without SST-2)."""
    texts = [s for s, _ in _sst2_rows("train.tsv", 3000)] if (SST2 / "train.tsv").is_file() else []
    texts += [t for a, b, _ in PAIRS for t in (a, b)] * 5
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(texts, 1000, lowercase=True).save(str(path))
    return path


@pytest.fixture(scope="module")
def tok(tokenizer_file: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_file))


@pytest.fixture(scope="module")
def sst2_dm(sst2: Path, tokenizer_file: Path) -> ClassificationDataModule:
    """The whole of SST-2 (67k train rows), set up once."""
    cfg = FinetuneConfig(train=str(sst2 / "train.tsv"), validation=str(sst2 / "validation.tsv"))
    dm = ClassificationDataModule(cfg, tokenizer_file)
    dm.setup("fit")
    return dm


@pytest.fixture()
def make_dm(sst2: Path, tokenizer_file: Path) -> Callable[..., ClassificationDataModule]:
    def make(seed: int = 0, limit_train: int | None = 200, **fields: Any) -> ClassificationDataModule:
        cfg = FinetuneConfig(
            **{"train": str(sst2 / "train.tsv"), "validation": str(sst2 / "validation.tsv"), "batch_size": 16, **fields}
        )
        return ClassificationDataModule(cfg, tokenizer_file, seed=seed, limit_train=limit_train)

    return make


def _longest_first(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Reference truncation, as the tokenizers library (transformers' fast tokenizers) writes
    ``longest_first`` for a pair: the shorter side keeps what it can of the budget, and when both are cut
    the shorter keeps half, the longer half plus the odd token (ties: a is the shorter)."""
    if la + lb <= budget:
        return la, lb
    swap = la > lb
    n1, n2 = (lb, la) if swap else (la, lb)
    n2 = max(n1, budget - n1)
    if n1 + n2 > budget:
        n1, n2 = budget // 2, budget // 2 + budget % 2
    return (n2, n1) if swap else (n1, n2)


def _pairs_file(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"premise": a, "hypothesis": b, "label": y}) + "\n" for a, b, y in PAIRS))
    return path


def _check_row(batch: dict[str, torch.Tensor], i: int, segments: list[list[int]]) -> None:
    """Row ``i`` is [CLS] seg0 [SEP] (seg1 [SEP]) then padding, with matching types and mask."""
    expected = [CLS] + [t for seg in segments for t in (*seg, SEP)]
    types = [0] * (len(segments[0]) + 2) + ([1] * (len(segments[1]) + 1) if len(segments) > 1 else [])
    n = len(expected)
    assert batch["input_ids"][i, :n].tolist() == expected
    assert (batch["input_ids"][i, n:] == PAD).all()
    assert batch["token_type_ids"][i].tolist() == types + [0] * (batch["input_ids"].shape[1] - n)
    assert batch["attention_mask"][i].tolist() == [True] * n + [False] * (batch["input_ids"].shape[1] - n)


def test_sst2_sizes_and_majority(sst2_dm: ClassificationDataModule) -> None:
    assert (sst2_dm.num_train, sst2_dm.num_validation) == (67349, 872)
    dev_positive = sum(label for _, label in _sst2_rows("validation.tsv"))
    assert sst2_dm.majority_accuracy == pytest.approx(dev_positive / 872) == pytest.approx(0.509, abs=1e-3)


def test_sst2_batches_layout_and_file_order(sst2_dm: ClassificationDataModule, tok: Tokenizer) -> None:
    rows = _sst2_rows("validation.tsv")
    batches = list(sst2_dm.val_dataloader())
    assert [len(b["labels"]) for b in batches] == [32] * 27 + [8]  # drop_last False
    assert torch.cat([b["labels"] for b in batches]).tolist() == [label for _, label in rows]
    batch = batches[0]
    assert batch["input_ids"].dtype == batch["token_type_ids"].dtype == batch["labels"].dtype == torch.long
    assert batch["attention_mask"].dtype == torch.bool
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == batch["attention_mask"].shape
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[1] == lengths.max()  # padded to the longest row of the batch
    for i, (sentence, _) in enumerate(rows[:32]):
        _check_row(batch, i, [tok.encode(sentence, add_special_tokens=False).ids])


def test_same_seed_same_batches(make_dm: Callable[..., ClassificationDataModule]) -> None:
    def order(dm: ClassificationDataModule) -> list[list[int]]:
        dm.setup("fit")
        return [b["input_ids"][:, 1].tolist() + b["labels"].tolist() for b in dm.train_dataloader()]

    first, again, other = order(make_dm(seed=1)), order(make_dm(seed=1)), order(make_dm(seed=2))
    assert first == again != other
    dm = make_dm(seed=1)
    assert dm.num_train == 200 and sum(len(b["labels"]) for b in dm.train_dataloader()) == 200
    assert order(dm) != [
        b["input_ids"][:, 1].tolist() + b["labels"].tolist() for b in dm._loader(dm.train_set, shuffle=False)
    ]  # type: ignore[arg-type]


def test_truncation_to_max_length(make_dm: Callable[..., ClassificationDataModule], tok: Tokenizer) -> None:
    dm = make_dm(max_length=8, limit_train=50)
    batch = next(iter(dm.val_dataloader()))
    assert batch["input_ids"].shape[1] == 8
    for i, (sentence, _) in enumerate(_sst2_rows("validation.tsv", 16)):
        _check_row(batch, i, [tok.encode(sentence, add_special_tokens=False).ids[:6]])


def test_sentence_pairs(tmp_path: Path, tokenizer_file: Path, tok: Tokenizer) -> None:
    path = _pairs_file(tmp_path)
    enc = [
        (tok.encode(a, add_special_tokens=False).ids, tok.encode(b, add_special_tokens=False).ids) for a, b, _ in PAIRS
    ]
    assert len(enc[0][0]) > len(enc[0][1]) + 2 and len(enc[1][1]) > len(enc[1][0]) + 2  # both sides get trimmed
    cfg = FinetuneConfig(
        train=str(path), validation=str(path), text_fields=("premise", "hypothesis"), num_labels=3, batch_size=4
    )
    batch = next(iter(ClassificationDataModule(cfg, tokenizer_file).val_dataloader()))
    assert batch["labels"].tolist() == [y for _, _, y in PAIRS]
    for i, (a, b) in enumerate(enc):
        _check_row(batch, i, [a, b])
    short = ClassificationDataModule(FinetuneConfig(**{**cfg.__dict__, "max_length": 10}), tokenizer_file)
    batch = next(iter(short.val_dataloader()))
    assert batch["input_ids"].shape[1] == 10
    for i, (a, b) in enumerate(enc):
        na, nb = _longest_first(len(a), len(b), 7)
        _check_row(batch, i, [a[:na], b[:nb]])


def test_trim_is_longest_first() -> None:
    for la, lb, budget in itertools.product(range(12), range(12), range(5, 14)):
        assert _trim(la, lb, budget) == _longest_first(la, lb, budget)


def test_csv_jsonl_gz_and_quotes(tmp_path: Path, tokenizer_file: Path) -> None:
    tsv = tmp_path / "q.tsv"
    tsv.write_text('sentence\tlabel\nhe said " yes\t1\nNA\t0\n" quoted , text "\t1\n', encoding="utf-8")
    csv_file = tmp_path / "d.csv"
    csv_file.write_text("label,sentence\n0,plain text\n1,more text\n", encoding="utf-8")
    gz = tmp_path / "d.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"sentence": f"text {i}", "label": i % 2}) + "\n" for i in range(5))
    dm = ClassificationDataModule(FinetuneConfig(train=str(csv_file), validation=str(tsv)), tokenizer_file)
    assert (dm.num_train, dm.num_validation) == (2, 3)  # quotes do not merge rows; "NA" is a sentence
    assert dm.majority_accuracy == pytest.approx(1 / 3)  # train tie 0/1 -> label 0
    assert ClassificationDataModule(FinetuneConfig(train=str(gz), validation=str(tsv)), tokenizer_file).num_train == 5


def _tsv(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text, encoding="utf-8")
    return str(tmp_path / name)


@pytest.mark.parametrize(
    ("fields", "error", "pattern"),
    [
        ({"train": None}, ConfigError, r"finetune\.train: required"),
        ({"validation": None}, ConfigError, r"finetune\.validation: required for a local train file$"),
        ({"train": "missing.tsv"}, DataError, r"finetune\.train: .*missing\.tsv: no such file$"),
        ({"validation": "dev.txt"}, DataError, r"finetune\.validation: .*dev\.txt: unknown extension"),
        (
            {"text_fields": ("question",)},
            DataError,
            r"finetune\.text_fields: 'question' is not a column of .*ok\.tsv \(columns: sentence, label\)$",
        ),
        (
            {"label_field": "y"},
            DataError,
            r"finetune\.label_field: 'y' is not a column of .*\(columns: sentence, label\)$",
        ),
        (
            {"validation": "bad_label.tsv"},
            DataError,
            r"finetune\.num_labels: .*bad_label\.tsv has label 2 \(row \d+\) outside \[0, 2\)$",
        ),
        (
            {"validation": "neg_label.tsv"},
            DataError,
            r"finetune\.num_labels: .*neg_label\.tsv has label -1 \(row \d+\) outside",
        ),
        (
            {"validation": "word_label.tsv"},
            DataError,
            r"finetune\.label_field: .*word_label\.tsv has a non-integer label 'pos' \(row 1\)$",
        ),
        ({"validation": "header_only.tsv"}, DataError, r"finetune\.validation: .*header_only\.tsv: no examples$"),
        ({"train": "empty.jsonl"}, DataError, r"finetune\.train: .*empty\.jsonl: no examples$"),
    ],
)
def test_errors_are_one_line_and_name_the_key_or_file(
    tmp_path: Path, tokenizer_file: Path, fields: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    files = {
        "ok.tsv": "sentence\tlabel\ngood film\t1\n",
        "bad_label.tsv": "sentence\tlabel\na\t1\nb\t2\n",
        "neg_label.tsv": "sentence\tlabel\na\t-1\n",
        "word_label.tsv": "sentence\tlabel\na\tpos\n",
        "header_only.tsv": "sentence\tlabel\n",
        "empty.jsonl": "",
    }
    for name, text in files.items():
        _tsv(tmp_path, name, text)
    given = {"train": "ok.tsv", "validation": "ok.tsv", **fields}
    given = {k: str(tmp_path / v) if k in ("train", "validation") and v else v for k, v in given.items()}
    with pytest.raises(error) as info:
        ClassificationDataModule(FinetuneConfig(**given), tokenizer_file).setup("fit")
    message = str(info.value)
    assert "\n" not in message and re.match(pattern, message), message


def test_hub_names_and_unreachable_hub(tmp_path: Path, tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABLATE_DATA_CATALOG", raising=False)  # hub names as a machine without a catalog has them
    calls: list[tuple[Any, ...]] = []

    def unreachable(path: str, name: str | None = None, **kwargs: Any) -> None:
        calls.append((path, name, kwargs.get("split")))
        raise ConnectionError("Couldn't reach 'glue' on the Hub (OfflineModeIsEnabled)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    dm = ClassificationDataModule(FinetuneConfig(train="glue:sst2"), tokenizer_file)  # validation: the hub's
    with pytest.raises(
        DataError,
        match=r"^finetune\.train: glue:sst2: cannot load .*'train' split: "
        r"ConnectionError: Couldn't reach 'glue' on the Hub \(OfflineModeIsEnabled\) "
        r"\(without the hub, map it to local files with ABLATE_DATA_CATALOG\)$",
    ):
        dm.setup("fit")
    with pytest.raises(DataError, match=r"^finetune\.train: nyu-mll/glue/sst2: cannot load"):
        ClassificationDataModule(FinetuneConfig(train="nyu-mll/glue/sst2"), tokenizer_file).prepare_data()
    with pytest.raises(DataError, match=r"^finetune\.train: rajpurkar/squad: cannot load"):  # owner/path: no config
        ClassificationDataModule(FinetuneConfig(train="rajpurkar/squad"), tokenizer_file).prepare_data()
    assert calls == [("glue", "sst2", "train"), ("nyu-mll/glue", "sst2", "train"), ("rajpurkar/squad", None, "train")]


def test_bad_tokenizer_file(tmp_path: Path) -> None:
    path = _pairs_file(tmp_path)
    cfg = FinetuneConfig(train=str(path), validation=str(path), text_fields=("premise", "hypothesis"), num_labels=3)
    with pytest.raises(DataError, match=r"^.*nope\.json: cannot load the tokenizer"):
        ClassificationDataModule(cfg, tmp_path / "nope.json").setup()


def test_tokenizer_padding_and_truncation_settings_are_ignored(tmp_path: Path, tokenizer_file: Path) -> None:
    path = _pairs_file(tmp_path)
    cfg = FinetuneConfig(train=str(path), validation=str(path), text_fields=("premise", "hypothesis"), num_labels=3)
    padded = Tokenizer.from_file(str(tokenizer_file))
    padded.enable_padding(length=64)
    padded.enable_truncation(4)
    padded.save(str(tmp_path / "padded.json"))
    plain = next(iter(ClassificationDataModule(cfg, tokenizer_file).val_dataloader()))
    other = next(iter(ClassificationDataModule(cfg, tmp_path / "padded.json").val_dataloader()))
    assert all(torch.equal(plain[k], other[k]) for k in plain)


@pytest.mark.parametrize(("device", "pinned"), [("cpu", False), ("cuda", True)])
def test_batches_are_page_locked_on_cuda(
    make_dm: Callable[..., ClassificationDataModule], device: str, pinned: bool
) -> None:
    """On CUDA the training and dev loaders hand batches over page-locked, so that Lightning's copy to the
    device does not make the host wait for the device's queue; not on a CPU. The trainer stands in for one
    that placed the run (no GPU needed)."""
    from types import SimpleNamespace

    dm = make_dm()
    dm.setup("fit")
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))  # type: ignore[assignment]
    assert dm.train_dataloader().pin_memory is pinned
    assert dm.val_dataloader().pin_memory is pinned
