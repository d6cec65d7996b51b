"""TinyBERT's data augmentation on real SST-2 sentences, a real WordPiece and a real (tiny) masked LM."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, normalizers, pre_tokenizers

from ablate.datamodules.augment import augment_rows, cached_augmentation, sample_table
from ablate.datamodules.classification import ClassificationDataModule
from ablate.datamodules.tokenizer import special_ids
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model
from tests.conftest import SHARED_DATA

SST2 = SHARED_DATA / "sst2"
ROWS = 50
TOP_K = 5
_NORM = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
_PRE = pre_tokenizers.BertPreTokenizer()


def _sst2(limit: int) -> list[tuple[str, int]]:
    """The first rows of SST-2's train.tsv, read independently of the module under test."""
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared SST-2 data not found at {SST2} (expected ../shared/data beside the repo)")
    with open(SST2 / "train.tsv", encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        return [(s, int(label)) for s, label in itertools.islice(reader, limit)]


def _words(text: str) -> list[str]:
    return [w for w, _ in _PRE.pre_tokenize_str(_NORM.normalize_str(text))]


@pytest.fixture(scope="module")
def rows() -> list[list[str]]:
    return [[s] for s, _ in _sst2(ROWS)]


@pytest.fixture(scope="module")
def mlm(wiki_tokenizer: Tokenizer) -> PretrainingModel:
    """A freshly initialised bert-tiny with an MLM head over the tokenizer's vocabulary."""
    torch.manual_seed(0)
    cfg = build_config({"model": {"preset": "bert-tiny", "vocab_size": wiki_tokenizer.get_vocab_size()}})
    return build_pretraining_model(cfg.model, cfg.objective)


@pytest.fixture(scope="module")
def all_replaced(rows: list[list[str]], wiki_tokenizer: Tokenizer, mlm: PretrainingModel) -> list[list[str]]:
    return augment_rows(rows, wiki_tokenizer, mlm, copies=2, prob=1.0, top_k=TOP_K, seed=0, progress=False)


def _single_piece(tok: Tokenizer, word: str) -> bool:
    ids = tok.encode(word, add_special_tokens=False).ids
    return len(ids) == 1 and ids[0] != special_ids(tok).unk


def test_same_seed_gives_the_same_copies_and_another_seed_others(
    rows: list[list[str]], wiki_tokenizer: Tokenizer, mlm: PretrainingModel
) -> None:
    def run(seed: int) -> list[list[str]]:
        return augment_rows(rows, wiki_tokenizer, mlm, copies=3, prob=0.4, top_k=TOP_K, seed=seed, progress=False)

    first, again, other = run(0), run(0), run(1)
    assert len(first) == ROWS * 3 and all(len(r) == 1 for r in first)
    assert first == again
    assert first != other
    assert sum(a != b for a, b in zip(first, other, strict=True)) > ROWS  # most copies differ
    assert mlm.training  # the model's mode is restored


def test_prob_one_replaces_every_single_piece_word_and_no_other(
    rows: list[list[str]], wiki_tokenizer: Tokenizer, all_replaced: list[list[str]]
) -> None:
    singles = multis = 0
    for i, (row,) in enumerate(rows):
        before = _words(row)
        for c in range(2):
            after = _words(all_replaced[i * 2 + c][0])
            assert len(after) == len(before), (row, all_replaced[i * 2 + c])
            for old, new in zip(before, after, strict=True):
                if _single_piece(wiki_tokenizer, old):
                    singles += 1
                    assert new != old and wiki_tokenizer.token_to_id(new) is not None and not new.startswith("##")
                else:  # several pieces: TinyBERT would use GloVe neighbours; kept as is
                    multis += 1
                    assert new == old
    assert singles > 200 and multis > 50  # both kinds are really exercised


def test_a_replacement_is_among_the_top_k_at_its_masked_position(
    rows: list[list[str]], wiki_tokenizer: Tokenizer, mlm: PretrainingModel, all_replaced: list[list[str]]
) -> None:
    """Recompute one word's candidates: mask it in the original sentence, unbatched, unpadded."""
    tok, sp = wiki_tokenizer, special_ids(wiki_tokenizer)
    i, row = next((i, r[0]) for i, r in enumerate(rows) if sum(_single_piece(tok, w) for w in _words(r[0])) >= 3)
    enc = tok.encode(row)  # [CLS] ... [SEP]
    words = _words(row)
    checked = 0
    for w, word in enumerate(words):
        if not _single_piece(tok, word):
            continue
        position = enc.word_ids.index(w)
        ids = torch.tensor([enc.ids])
        ids[0, position] = sp.mask
        mlm.eval()
        with torch.no_grad():
            hidden = mlm.encoder(ids, torch.zeros_like(ids), torch.ones_like(ids, dtype=torch.bool))
            logits = mlm.mlm_head(hidden[0, position : position + 1], mlm.encoder.embeddings.word.weight)[0]
        mlm.train()
        banned = [*sp, tok.token_to_id(word)] + [j for t, j in tok.get_vocab().items() if t.startswith("##")]
        logits[banned] = float("-inf")
        top = {tok.id_to_token(j) for j in logits.topk(TOP_K).indices.tolist()}
        for c in range(2):
            assert _words(all_replaced[i * 2 + c][0])[w] in top
        checked += 1
    assert checked >= 3


def test_the_cache_is_written_once_and_read_back(tmp_path: Path) -> None:
    rows = [[s] for s, _ in _sst2(5)]
    calls: list[int] = []

    def compute() -> list[list[str]]:
        calls.append(1)
        return [[s.upper()] for (s,) in rows]

    def fail() -> list[list[str]]:
        raise AssertionError("the cached rows should have been read")

    key: dict[str, object] = {"train": "sst2", "model": "tiny", "copies": 1, "prob": 0.4, "top_k": 5, "seed": 0}
    first = cached_augmentation(tmp_path, key, compute)
    assert cached_augmentation(tmp_path, key, fail) == first == [[s.upper()] for (s,) in rows]
    assert len(calls) == 1
    files = list((tmp_path / "augment").iterdir())
    assert len(files) == 1 and files[0].suffix == ".jsonl" and len(files[0].read_text().splitlines()) == 6
    cached_augmentation(tmp_path, {**key, "seed": 1}, compute)  # another key: another file
    assert len(calls) == 2 and len(list((tmp_path / "augment").iterdir())) == 2


def test_sample_table_lists_each_original_then_its_copies() -> None:
    table = sample_table([["a b"], ["c\td"]], [["x b"], ["a y"], ["c z"], ["w d"]], copies=2, n=1)
    assert table == "example\tcopy\ttext\n0\toriginal\ta b\n0\t1\tx b\n0\t2\ta y\n"
    assert sample_table([["a", "b"]], [["c", "d"]], copies=1).splitlines()[1] == "0\toriginal\ta ||| b"


def test_the_datamodule_adds_copies_to_training_only(
    wiki_tokenizer: Tokenizer, mlm: PretrainingModel, tmp_path: Path
) -> None:
    labels = [y for _, y in _sst2(ROWS)]
    tokenizer_file = tmp_path / "tokenizer.json"
    wiki_tokenizer.save(str(tokenizer_file))
    fields = {"train": str(SST2 / "train.tsv"), "validation": str(SST2 / "validation.tsv")}

    def make(copies: int) -> ClassificationDataModule:
        cfg = FinetuneConfig(**fields, augment_copies=copies, augment_top_k=TOP_K)
        dm = ClassificationDataModule(cfg, tokenizer_file, limit_train=ROWS, mlm=mlm, cache_dir=tmp_path, mlm_id="t")
        dm.setup("fit")
        return dm

    plain, augmented = make(0), make(2)
    assert plain.augment_sample is None
    assert augmented.num_train == ROWS * 3 and plain.num_train == ROWS
    assert augmented.num_validation == plain.num_validation == 872
    assert augmented.train_set is not None and plain.train_set is not None
    assert augmented.train_set.labels.tolist() == labels + list(np.repeat(labels, 2))
    train, base = augmented.train_set, plain.train_set
    assert all((train[i][0] == base[i][0]).all() for i in range(ROWS))  # the originals come first, as they were
    assert sum(len(train[ROWS + i][0]) != len(base[i // 2][0]) or (train[ROWS + i][0] != base[i // 2][0]).any()
               for i in range(2 * ROWS)) > ROWS  # fmt: skip
    sample = augmented.augment_sample
    assert sample is not None and sample.splitlines()[0] == "example\tcopy\ttext"
    assert len(sample.splitlines()) == 1 + 20 * 3
    (cached,) = (tmp_path / "augment").glob("*.jsonl")
    written = cached.stat().st_mtime_ns
    again = make(2).train_set  # read back from the cache, not rewritten
    assert again is not None and (again.ids == train.ids).all() and list((tmp_path / "augment").iterdir()) == [cached]
    assert cached.stat().st_mtime_ns == written


def test_augmentation_without_a_masked_lm_is_a_config_error(tmp_path: Path) -> None:
    cfg = FinetuneConfig(train=str(SST2 / "train.tsv"), validation=str(SST2 / "validation.tsv"), augment_copies=4)
    with pytest.raises(ConfigError) as info:
        ClassificationDataModule(cfg, tmp_path / "tokenizer.json")
    assert str(info.value) == (
        "finetune.augment_copies: augmentation needs a masked LM "
        "(finetune.augment_model or a finetune.source with an MLM head)"
    )
