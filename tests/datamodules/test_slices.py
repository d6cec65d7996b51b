"""Slices in the data catalog: a split read from part of one file (SQuAD articles, rows of a TSV), the
count read equal to the slice, a bad slice refused in one line at load or where the file cannot give it,
and the run's tags saying what was read."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ablate.cli import main
from ablate.datamodules.catalog import ENV, active_catalog
from ablate.datamodules.provenance import data_tags
from ablate.datamodules.slices import Slice, overlap, parse_range
from ablate.datamodules.sources import resolve_corpus, resolve_task
from ablate.datamodules.squad import read_questions
from ablate.datamodules.task_rows import Schema, check_task_data, read_split
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.load import build_config
from tests.conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[2]
SQUAD = SHARED_DATA / "squad" / "dev-v1.1.json"
MNLI = SHARED_DATA / "glue" / "mnli" / "validation_matched.tsv"
MNLI_SCHEMA = Schema("label", ("premise", "hypothesis"), "classification", 3)


def _catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, splits: dict[str, dict[str, str]]) -> Path:
    """A catalog of ``splits`` (hub name -> split -> YAML of its value), set as ABLATE_DATA_CATALOG."""
    for need in (SQUAD, MNLI):
        if not need.is_file():
            pytest.skip(f"shared data not found at {need}")
    lines = ["datasets:"]
    for name, entry in splits.items():
        lines += [f"  {name}:", *(f"    {split}: {value}" for split, value in entry.items())]
    path = tmp_path / "catalog.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setenv(ENV, str(path))
    return path


def _articles() -> list[dict]:
    return json.loads(SQUAD.read_text(encoding="utf-8"))["data"]


def _ids(articles: list[dict]) -> list[str]:
    return [qa["id"] for a in articles for p in a["paragraphs"] for qa in p["qas"]]


def test_squad_articles_split_a_dev_file_into_train_and_validation(tmp_path, monkeypatch):
    _catalog(
        tmp_path,
        monkeypatch,
        {
            "rajpurkar/squad": {
                "train": f'{{file: {SQUAD}, articles: "8:"}}',
                "validation": f'{{file: {SQUAD}, articles: ":8"}}',
            }
        },
    )
    articles = _articles()
    train = read_questions(resolve_task("finetune.train", "rajpurkar/squad"), None, False)
    dev = read_questions(resolve_task("finetune.validation", "rajpurkar/squad", None, "validation"), None, False)
    assert [q.id for q in train] == _ids(articles[8:]) and [q.id for q in dev] == _ids(articles[:8])
    assert len(train) + len(dev) == 10_570 and not {q.id for q in train} & {q.id for q in dev}
    limited = read_questions(resolve_task("finetune.train", "rajpurkar/squad"), 5, False)
    assert [q.id for q in limited] == _ids(articles[8:])[:5]  # a limit counts within the slice


def test_squad_rows_are_questions_and_a_slice_past_the_end_is_one_line(tmp_path, monkeypatch):
    path = _catalog(
        tmp_path,
        monkeypatch,
        {
            "rajpurkar/squad": {
                "train": f'{{file: {SQUAD}, rows: "100:300"}}',
                "validation": f'{{file: {SQUAD}, articles: "40:60"}}',
            }
        },
    )
    train = read_questions(resolve_task("finetune.train", "rajpurkar/squad"), None, False)
    assert [q.id for q in train] == _ids(_articles())[100:300]
    src = resolve_task("finetune.validation", "rajpurkar/squad", None, "validation")
    with pytest.raises(DataError) as info:
        read_questions(src, None, False)
    assert str(info.value) == (
        f"finetune.validation: rajpurkar/squad: {ENV}: {path}: validation: articles 40:60: the file has 48 articles"
    )


def test_mnli_rows_of_a_dev_tsv_train_and_score(tmp_path, monkeypatch):
    _catalog(
        tmp_path,
        monkeypatch,
        {
            "nyu-mll/glue:mnli": {
                "train": f'{{file: {MNLI}, rows: "0:5000"}}',
                "validation_matched": f'{{file: {MNLI}, rows: "5000:"}}',
            }
        },
    )
    rows = MNLI.read_text(encoding="utf-8").splitlines()[1:]  # GLUE's TSVs: no quoting, a row a line
    train = resolve_task("finetune.train", "nyu-mll/glue:mnli")
    texts, labels = read_split(train, MNLI_SCHEMA, None)
    assert len(labels) == 5000 and texts[0][0] == rows[0].split("\t")[0]
    dev = resolve_task("finetune.validation", "nyu-mll/glue:mnli", "validation_matched")
    texts, labels = read_split(dev, MNLI_SCHEMA, None)
    assert len(labels) == len(rows) - 5000 == 4815 and texts[1][0] == rows[5000].split("\t")[1]
    assert len(read_split(dev, MNLI_SCHEMA, 7)[1]) == 7  # a limit counts within the slice


def test_rows_past_the_end_are_refused_by_the_run_and_the_study_check(tmp_path, monkeypatch):
    path = _catalog(
        tmp_path,
        monkeypatch,
        {
            "nyu-mll/glue:mnli": {
                "train": f'{{file: {MNLI}, rows: "9000:12000"}}',
                "validation_matched": f'{{file: {MNLI}, rows: "20000:"}}',
                "validation_mismatched": f'{{file: {MNLI}, rows: "0:1000"}}',
            }
        },
    )
    head = f"finetune.train: nyu-mll/glue:mnli: {ENV}: {path}: train: rows 9000:12000"
    with pytest.raises(DataError, match=f"^{head}: the file has 9815 rows$"):
        read_split(resolve_task("finetune.train", "nyu-mll/glue:mnli"), MNLI_SCHEMA, None)
    cfg = FinetuneConfig(
        train="nyu-mll/glue:mnli", label_field="label", text_fields=("premise", "hypothesis"), num_labels=3
    )
    with pytest.raises(DataError, match=f"^{head}: the file has 9815 rows$"):
        check_task_data(cfg)  # the labels alone, before any run
    assert len(read_split(resolve_task("finetune.train", "nyu-mll/glue:mnli"), MNLI_SCHEMA, 300)[1]) == 300
    dev = resolve_task("finetune.validation", "nyu-mll/glue:mnli", "validation_matched")
    with pytest.raises(DataError, match=r": validation_matched: rows 20000:: the file has at most 20000 rows$"):
        read_split(dev, MNLI_SCHEMA, None)


def test_each_run_is_tagged_with_the_slice_it_read(tmp_path, monkeypatch):
    path = _catalog(
        tmp_path,
        monkeypatch,
        {"rajpurkar/squad": {"train": f'{{file: {SQUAD}, articles: "8:"}}', "validation": str(SQUAD)}},
    )
    cfg = build_config({"regime": "finetune", "finetune": {"source": "runs:/x", "task": "squad"}})
    tags = data_tags(cfg)
    real = SQUAD.resolve()  # the tag names the file itself (../shared may be a link)
    assert tags["ablate.data.finetune.train"] == f"train split via {ENV} ({path}): 1 file: {real}, articles 8:"
    assert tags["ablate.data.finetune.validation"].endswith(f"1 file: {real}")


def test_overlapping_slices_of_one_file_are_allowed_with_a_warning(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    path = _catalog(
        tmp_path,
        monkeypatch,
        {
            "rajpurkar/squad": {
                "train": f'{{file: {SQUAD}, articles: ":40"}}',
                "validation": f'{{file: {SQUAD}, articles: "30:"}}',
            },
            "nyu-mll/glue:mnli": {
                "train": f'{{file: {MNLI}, rows: ":100"}}',
                "validation": f'{{file: {MNLI}, rows: "100:"}}',
            },
        },
    )
    assert active_catalog() is not None
    notes = [r.getMessage() for r in caplog.records]
    assert notes == [
        f"{ENV}: {path}: datasets.rajpurkar/squad: train and validation both read articles 30:40 of {SQUAD} "
        "(a model would be scored on what it trained on)"
    ]


def test_a_corpus_reads_whole_files(tmp_path, monkeypatch):
    wiki = SHARED_DATA / "wiki-en"
    path = _catalog(tmp_path, monkeypatch, {"a/corpus": {"train": f'{{file: {MNLI}, rows: ":10"}}'}})
    assert wiki  # the corpus is refused before any file is read
    with pytest.raises(DataError, match=f"^data.corpus: a/corpus: {ENV}: {path}: train: rows 0:10: a corpus reads"):
        resolve_corpus("a/corpus")


BAD = {
    "a bad range": ('{file: x.tsv, rows: "a:b"}', "datasets.a/b:c.train: rows: 'a:b': not a range"),
    "a negative start": ('{file: x.tsv, rows: "-5:"}', "datasets.a/b:c.train: rows: '-5:': not a range"),
    "a step": ('{file: x.tsv, rows: "0:10:2"}', "datasets.a/b:c.train: rows: '0:10:2': not a range"),
    "empty": ('{file: x.tsv, rows: "10:10"}', "datasets.a/b:c.train: rows: '10:10': an empty range"),
    "a number": ("{file: x.tsv, rows: 10}", "datasets.a/b:c.train: rows: 10: give a range as a string"),
    "articles of a TSV": ('{file: x.tsv, articles: ":8"}', "datasets.a/b:c.train: articles: x.tsv: not SQuAD's"),
    "rows of a text file": ('{file: x.txt, rows: ":8"}', "datasets.a/b:c.train: rows: x.txt: not a .tsv, .csv"),
    "both": ('{file: x.json, rows: ":8", articles: ":8"}', "datasets.a/b:c.train: give one of rows or articles"),
    "neither": ("{file: x.json}", "datasets.a/b:c.train: give one of rows or articles"),
    "no file": ('{rows: ":8"}', "datasets.a/b:c.train: file: give the one file to slice"),
    "a glob": ('{file: "x/*.tsv", rows: ":8"}', "datasets.a/b:c.train: file: x/*.tsv: a glob; a slice is of one file"),
    "unknown key": ('{file: x.tsv, row: ":8"}', "datasets.a/b:c.train: row: unknown key"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_slice_is_refused_at_load_in_one_line(case, tmp_path, monkeypatch, capsys):
    value, message = BAD[case]
    path = tmp_path / "catalog.yaml"
    path.write_text(f"datasets:\n  a/b:c:\n    train: {value}\n", encoding="utf-8")
    monkeypatch.setenv(ENV, str(path))
    with pytest.raises(ConfigError) as info:
        active_catalog()
    assert str(info.value).startswith(f"{ENV}: {path}: {message}"), str(info.value)
    assert main(["sweep", "--check", str(ROOT / "sweeps" / "studies" / "quickstart.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {ENV}: {path}: {message}") and err.count("\n") == 1, err


def test_ranges_and_overlaps():
    assert parse_range("40:") == (40, None) and parse_range(":8") == (0, 8) and parse_range(" 3 : 9 ") == (3, 9)
    assert parse_range(":") == (0, None)
    assert str(Slice("rows", 0, 5000)) == "rows 0:5000" and str(Slice("articles", 8)) == "articles 8:"
    assert overlap(Slice("rows", 0, 10), Slice("rows", 10)) is None
    assert overlap(Slice("rows", 0, 10), None) == Slice("rows", 0, 10)  # a whole file and a part of it
    assert overlap(Slice("rows", 0, 10), Slice("articles", 0, 10)) is None and overlap(None, None) is None
    assert Slice("articles", 0, 49).problem(48) == "the file has 48 articles" and Slice("rows", 3).problem(4) is None
