"""A task's rows: GLUE's TSVs read as written (a backslash escaped), regression labels as numbers, further
dev sets resolved, and the pre-run check of columns and labels naming the setting and the file."""

from __future__ import annotations

import pytest

from ablate.datamodules.classification import collate, encode
from ablate.datamodules.sources import resolve_task
from ablate.datamodules.task_rows import Schema, check_task_data, read_split, splits
from ablate.datamodules.tokenizer import train_tokenizer
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.glue import GLUE
from tests.conftest import SHARED_DATA

STSB = SHARED_DATA / "glue" / "stsb"
STSB_TASK = FinetuneConfig(**{**GLUE["stsb"].finetune_fields(), "extra_validation": ()})


@pytest.fixture()
def stsb():
    if not (STSB / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {STSB}")


def test_stsb_reads_as_written_its_backslash_unescaped_and_its_scores_as_floats(stsb):
    src = resolve_task("finetune.train", "nyu-mll/glue:stsb")  # through the session's data catalog
    texts, labels = read_split(src, Schema.of(STSB_TASK), None)
    assert len(labels) == 5749 and all(isinstance(y, float) for y in labels)
    assert min(labels) == 0.0 and max(labels) == 5.0
    (row,) = [b for b in texts[1] if "general elections" in b and "Nigeria" in b]
    assert row == "Press awash with Nigeria\\'s general elections"  # one backslash, as GLUE has it


def test_regression_targets_are_float_batches():
    tokenizer = train_tokenizer(["a cat and a dog", "the cat said no"] * 20, 100, lowercase=True)
    split = encode(tokenizer, [["a cat", "a dog"], ["the cat", "no"]], [4.5, 0.25], max_length=16)
    batch = collate([split[0], split[1]])
    assert batch["labels"].dtype.is_floating_point and batch["labels"].tolist() == [4.5, 0.25]
    assert collate([encode(tokenizer, [["a"]], [1], 16)[0]])["labels"].dtype == batch["input_ids"].dtype  # long


@pytest.mark.parametrize(
    ("columns", "labels", "kwargs"),
    [
        ([["a cat sat on the mat", "no", "the dog and the cat and a bird", "a"]], [1, 0, 1, 0], {}),
        ([["a cat", "the dog said", "no", "a b c d e"], ["no", "a cat sat", "the mat", "a"]], [0, 1, 1, 0], {}),
        ([["a cat", "the dog said", "no", "a b c d e"], ["no", "a cat sat", "the mat", "a"]], [4.5, 0.25, 1, 3], {}),
        ([["a cat sat on the mat", "no", "the dog", "a"]], [1, 0, 1, 0], {"buckets": (4, 8, 16)}),
        ([["a cat sat on the mat", "no", "the dog", "a"]], [1, 0, 1, 0], {"length": 12, "pad_id": 3}),
    ],
)
def test_a_batched_fetch_collates_as_row_by_row_does(columns, labels, kwargs):
    """A DataLoader fetches a batch's rows at once (``__getitems__``): padded with array operations, the
    batch equals the one padded row by row (singles, pairs, regression targets, buckets, a fixed length)."""
    from torch.utils.data import DataLoader

    tokenizer = train_tokenizer(["a cat and a dog", "the cat said no on the mat", "b c d e bird"] * 20, 100, True)
    split = encode(tokenizer, columns, labels, max_length=16)
    order = [2, 0, 3]
    batched, by_row = collate(split.__getitems__(order), **kwargs), collate([split[i] for i in order], **kwargs)
    assert batched.keys() == by_row.keys()
    for key in by_row:
        assert batched[key].dtype == by_row[key].dtype and batched[key].tolist() == by_row[key].tolist(), key
    (loaded,) = DataLoader(split, batch_size=4, collate_fn=lambda rows: collate(rows, **kwargs))
    assert loaded["input_ids"].tolist() == collate([split[i] for i in range(4)], **kwargs)["input_ids"].tolist()


def _tsv(path, header, rows):
    path.write_text("\n".join(["\t".join(header), *("\t".join(map(str, r)) for r in rows)]) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("task", "rows", "message"),
    [
        (
            {"kind": "regression", "num_labels": 1, "metric": "pearson"},
            [("a", "b", 1.5), ("c", "d", "high")],
            r"^tasks\[2\]\.label_field: .*bad\.tsv has a label 'high' \(row 2\) that is not a number",
        ),
        ({}, [("a", "b", 0), ("c", "d", 2)], r"^tasks\[2\]\.num_labels: .*bad\.tsv has label 2 \(row 2\)"),
        ({}, [("a", "b", 1.0)], r"^tasks\[2\]\.label_field: .*bad\.tsv has a non-integer label 1\.0 \(row 1\)"),
        ({"text_fields": ("sentence1", "question")}, [("a", "b", 0)], r"^tasks\[2\]\.text_fields: 'question' is not"),
        ({"label_field": "score"}, [("a", "b", 0)], r"^tasks\[2\]\.label_field: 'score' is not a column of .*bad\.tsv"),
    ],
)
def test_the_check_before_a_run_names_the_setting_and_the_file(tmp_path, task, rows, message):
    bad = _tsv(tmp_path / "bad.tsv", ["sentence1", "sentence2", "label"], rows)
    fields = {"text_fields": ("sentence1", "sentence2"), **task}
    with pytest.raises(DataError, match=message):
        check_task_data(FinetuneConfig(train=bad, validation=bad, **fields), "tasks[2]")


def test_good_files_pass_the_check(tmp_path):
    scores = _tsv(tmp_path / "scores.tsv", ["sentence1", "sentence2", "label"], [("a", "b", 1.5), ("c", "d", 4)])
    regression = {"kind": "regression", "num_labels": 1, "metric": "pearson", "text_fields": ("sentence1", "sentence2")}
    check_task_data(FinetuneConfig(train=scores, validation=scores, **regression))
    classes = _tsv(tmp_path / "classes.tsv", ["sentence", "label"], [("a", 0), ("b", 2)])
    check_task_data(FinetuneConfig(train=classes, validation=classes, num_labels=3))


def test_only_the_rows_a_run_reads_are_checked(tmp_path):
    rows = [("a", "b", 1)] * 3 + [("c", "d", 7)]
    data = _tsv(tmp_path / "late.tsv", ["sentence1", "sentence2", "label"], rows)
    fields = {"text_fields": ("sentence1", "sentence2"), "train": data, "validation": data}
    check_task_data(FinetuneConfig(**fields, train_examples=3, validation_examples=3))
    with pytest.raises(DataError, match=r"^finetune\.num_labels: .*late\.tsv has label 7 \(row 4\)"):
        check_task_data(FinetuneConfig(**fields))


def test_further_dev_sets_resolve_by_split_or_file(tmp_path):
    local = _tsv(tmp_path / "dev.tsv", ["sentence", "label"], [("a", 1)])
    hub = FinetuneConfig(**{**GLUE["mnli"].finetune_fields(), "train": "someone/glue:mnli"})  # in no catalog
    _, dev = splits(hub)
    assert [(name, src.split, src.builder) for name, src in dev] == [
        ("mnli", "validation_matched", "someone/glue"),
        ("mnli-mm", "validation_mismatched", "someone/glue"),
    ]
    with pytest.raises(ConfigError, match=r"^finetune\.extra_validation\[0\]\.data: required beside a local dev"):
        splits(FinetuneConfig(train=local, validation=local, extra_validation=({"name": "other"},)))
    _, dev = splits(FinetuneConfig(train=local, validation=local, extra_validation=({"name": "o", "data": local},)))
    assert [name for name, _ in dev] == ["sst2", "o"]
