"""SQuAD's windows on the real dev files: labels at the answer's tokens, offsets back to the context's
characters, both file forms, and the bad answers refused naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from ablate.datamodules.sources import resolve_task
from ablate.datamodules.squad import SquadDataModule, read_questions
from ablate.datamodules.tokenizer import train_tokenizer
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.load import build_config
from tests.conftest import SHARED_DATA

SQUAD = SHARED_DATA / "squad"


def _part(name: str, articles: slice) -> dict:
    path = SQUAD / name
    if not path.is_file():
        pytest.skip(f"shared SQuAD data not found at {path}")
    tree = json.loads(path.read_text(encoding="utf-8"))
    return {"version": tree["version"], "data": tree["data"][articles]}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("squad")
    out = {}
    for key, name in (("v1", "dev-v1.1.json"), ("v2", "dev-v2.0.json")):
        out[key] = tmp / f"{key}.json"
        out[key].write_text(json.dumps(_part(name, slice(0, 2))), encoding="utf-8")
    texts = [p["context"] for a in _part("dev-v1.1.json", slice(0, 10))["data"] for p in a["paragraphs"]]
    out["tok"] = tmp / "tokenizer.json"
    train_tokenizer(texts, 1000, lowercase=True).save(str(out["tok"]))
    return out


def _dm(files: dict[str, Path], key: str = "v1", **fields) -> SquadDataModule:
    fields = {"max_query_length": 24, **fields}
    cfg = FinetuneConfig(
        kind="span", metric="f1", train=str(files[key]), validation=str(files[key]), max_length=64, **fields
    )
    dm = SquadDataModule(cfg, files["tok"])
    dm.setup()
    return dm


def test_windows_cover_long_contexts_and_label_the_answer_tokens(files):
    dm = _dm(files, doc_stride=16, max_query_length=16)
    tok = Tokenizer.from_file(str(files["tok"]))
    train = dm.train_set
    assert train is not None and len(train) > 2 * dm.num_train  # contexts of ~150 tokens in windows of <= 64
    windows, labelled = train.dev.windows, 0
    for i in range(len(train)):
        ids, first, start, end, _ = train[i]
        assert len(ids) <= 64 and ids[0] == tok.token_to_id("[CLS]") and ids[first - 1] == tok.token_to_id("[SEP]")
        ref = train.dev.references[int(windows.example[i])]
        assert windows.ctx_start[i] == first and len(windows.spans[i]) == len(ids) - first - 1
        if start == 0:
            assert end == 0
            continue
        labelled += 1
        spans = windows.spans[i]
        text = ref.context[spans[start - first][0] : spans[end - first][1]]
        # the labelled tokens' characters are the answer (WordPiece may split inside a word: the answer lies within)
        assert ref.answers[0] in text and len(text) <= len(ref.answers[0]) + 12, (text, ref.answers[0])
    assert labelled >= dm.num_train  # every answer is wholly in at least one window
    most = windows.max_context
    for q in range(3):  # each context token is some window's max-context token exactly once
        mine = [k for k in range(len(train)) if windows.example[k] == q]
        counts = np.zeros(max(int(windows.spans[k][-1][1]) for k in mine) + 1)
        for k in mine:
            np.add.at(counts, windows.spans[k][most[k], 0], 1)
        assert set(counts[counts > 0]) == {1}


def test_a_batched_fetch_collates_windows_as_one_by_one_does(files):
    """A DataLoader fetches a batch's windows at once (``__getitems__``): padded together they are the batch
    padded window by window, to the longest or to a fixed length, in every field."""
    from ablate.datamodules.squad import collate

    train = _dm(files, doc_stride=16, max_query_length=16).train_set
    assert train is not None
    for index, length in (([5, 0, 3, 9], None), ([2, 1], 64)):
        batched, one_by_one = (
            collate(train.__getitems__(index), 7, length),
            collate([train[i] for i in index], 7, length),
        )
        assert list(batched) == list(one_by_one)
        for key, value in one_by_one.items():
            assert batched[key].dtype == value.dtype and batched[key].tolist() == value.tolist(), key


def test_flat_rows_read_as_the_official_json(files, tmp_path):
    questions = read_questions(resolve_task("finetune.train", str(files["v2"])), None, no_answer=True)
    rows = [
        {
            "id": q.id,
            "title": "t",
            "context": q.context,
            "question": q.question,
            "answers": {"text": list(q.answers), "answer_start": list(q.starts)},
        }
        for q in questions
    ]
    flat = tmp_path / "flat.jsonl"
    flat.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    assert read_questions(resolve_task("finetune.train", str(flat)), None, no_answer=True) == questions
    assert any(not q.answers for q in questions)


def test_a_file_is_parsed_once_while_it_is_unchanged_and_again_once_it_changes(files, tmp_path, monkeypatch):
    """A study's runs read one dev file: parsed once per process; a file written anew is read anew."""
    from ablate.datamodules import squad

    path = tmp_path / "dev.json"
    path.write_text(files["v1"].read_text(encoding="utf-8"), encoding="utf-8")
    parsed = []
    real = squad._parse_file
    monkeypatch.setattr(squad, "_parse_file", lambda p, part: parsed.append(p) or real(p, part))
    src = resolve_task("finetune.train", str(path))
    first = read_questions(src, None, no_answer=False)
    again = read_questions(src, 3, no_answer=False)
    assert parsed == [str(path)] and again == first[:3]
    tree = json.loads(path.read_text(encoding="utf-8"))
    tree["data"] = tree["data"][:1]
    path.write_text(json.dumps(tree), encoding="utf-8")  # another size: read anew
    changed = read_questions(src, None, no_answer=False)
    assert len(parsed) == 2 and 0 < len(changed) < len(first)


def test_the_catalog_names_squad_by_its_hub_name():
    src = resolve_task("finetune.validation", "rajpurkar/squad", None, "validation")
    if not src.files:
        pytest.skip("no data catalog maps rajpurkar/squad")
    questions = read_questions(src, 50, no_answer=False)
    assert len(questions) == 50 and questions[0].id == "56be4db0acb8001400a502ec"


def test_bad_answers_and_unanswerable_questions_are_refused_naming_the_file(files, tmp_path):
    tree = json.loads(files["v1"].read_text(encoding="utf-8"))
    tree["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] += 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(tree), encoding="utf-8")
    with pytest.raises(DataError, match=r"finetune.train: .*bad.json: question \S+: answer .* is not at its answer_st"):
        _dm({**files, "bad": bad}, "bad")
    with pytest.raises(DataError, match=r"v2.json: question \S+ has no answer .*finetune.no_answer"):
        _dm(files, "v2")
    assert _dm(files, "v2", no_answer=True).no_answer_rate > 0.3
    for field, value in (("max_query_length", 62), ("augment_copies", 2)):  # checked with the config, before any data
        task = {"kind": "span", "metric": "f1", "train": str(files["v1"]), "max_length": 64, field: value}
        with pytest.raises(ConfigError, match=f"finetune.{field}"):
            build_config({"finetune": {"source": str(files["v1"].parent), "validation": str(files["v1"]), **task}})


@pytest.mark.parametrize(("device", "pinned"), [("cpu", False), ("cuda", True)])
def test_windows_are_page_locked_on_cuda(files, device, pinned):
    """As a classification task's batches: page-locked on CUDA, not on a CPU (the trainer stands in)."""
    from types import SimpleNamespace

    import torch

    dm = _dm(files)
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
    assert dm.train_dataloader().pin_memory is pinned
    assert dm.val_dataloader().pin_memory is pinned


def test_a_compiled_steps_windows_come_in_whole_batches(files):
    """``whole_batches`` (``trainer.compile``): every training batch holds ``batch_size`` windows, the
    epoch's smaller last one left out (it would compile the layers again); the dev batches are all kept."""
    cfg = FinetuneConfig(
        kind="span",
        metric="f1",
        train=str(files["v1"]),
        validation=str(files["v1"]),
        max_length=64,
        max_query_length=24,
        batch_size=8,
    )
    plain, whole = SquadDataModule(cfg, files["tok"]), SquadDataModule(cfg, files["tok"], whole_batches=True)
    plain.setup()
    whole.setup()
    n = len(plain.train_set)
    assert n % 8 and [len(b["input_ids"]) for b in whole.train_dataloader()] == [8] * (n // 8)
    assert sum(len(b["input_ids"]) for b in plain.train_dataloader()) == n
    assert sum(len(b["input_ids"]) for b in whole.val_dataloader()) == len(whole.val_set)
