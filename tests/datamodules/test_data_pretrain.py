"""PretrainDataModule: batch format, determinism, validation, workers, early errors."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from ablate.datamodules.pretrain import PretrainDataModule
from ablate.datamodules.transfer import GROUP, GroupedLoader, PackedBatch, packed, unpack
from ablate.lightning_modules.config.errors import DataError
from ablate.lightning_modules.config.experiment import DataConfig, ObjectiveConfig

VOCAB = 2000


def _dm(data: DataConfig, seed: int = 0, val_batches: int | None = 3, **objective) -> PretrainDataModule:  # type: ignore[no-untyped-def]
    dm = PretrainDataModule(data, ObjectiveConfig(**objective), VOCAB, seed, val_batches=val_batches)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _take(loader, n: int) -> list[dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    """The first ``n`` batches as the module sees them (from workers they arrive packed)."""
    return [unpack(b) for b in itertools.islice(iter(loader), n)]


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    if len(a) != len(b):
        return False
    return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("sentence", "masking"), [("sop", "token"), ("nsp", "whole_word"), ("none", "ngram")])
def test_batch_format(wiki_data: Callable[..., DataConfig], sentence: str, masking: str) -> None:
    data = wiki_data()
    dm = _dm(data, sentence=sentence, masking=masking)
    assert dm.tokenizer is not None and dm.tokenizer_path is not None and dm.tokenizer_path.is_file()
    pad, _, cls, sep, mask = dm.special_ids
    assert (pad, cls, sep, mask) == (0, 2, 3, 4)
    for batch in _take(dm.train_dataloader(), 4):
        ids, types, attn = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
        labels, sent = batch["mlm_labels"], batch["sentence_label"]
        assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "mlm_labels", "sentence_label"}
        assert ids.dtype == types.dtype == labels.dtype == sent.dtype == torch.long and attn.dtype == torch.bool
        assert ids.shape == types.shape == attn.shape == labels.shape and ids.shape[0] == data.batch_size
        assert ids.shape[1] <= data.max_length and attn[:, -1].any()  # T = longest in the batch
        assert (ids[:, 0] == cls).all() and (ids[~attn] == pad).all() and (types[~attn] == 0).all()
        original = torch.where(labels == -100, ids, labels)
        lengths = attn.sum(1)
        assert (original[torch.arange(len(ids)), lengths - 1] == sep).all()
        assert ((original == sep) & attn).sum(1).tolist() == [1 if sentence == "none" else 2] * len(ids)
        assert (labels[~attn] == -100).all() and (labels[original == sep] == -100).all()
        assert (labels[:, 0] == -100).all()
        assert (labels != -100).any()
        if sentence == "none":
            assert (sent == -100).all() and (types == 0).all()
        else:
            assert set(sent.tolist()) <= {0, 1}
            first_sep = (original == sep).int().argmax(1)
            for row, (k, n) in enumerate(zip(first_sep.tolist(), lengths.tolist(), strict=True)):
                assert types[row, : k + 1].eq(0).all() and types[row, k + 1 : n].eq(1).all()
    fill = sum(b["attention_mask"].sum().item() for b in _take(dm.train_dataloader(), 10)) / (10 * 8 * 64)
    assert fill > 0.75


def test_same_seed_same_batches(wiki_data: Callable[..., DataConfig]) -> None:
    data = wiki_data()
    first = _take(_dm(data, seed=1, masking="ngram").train_dataloader(), 3)
    again = _take(_dm(data, seed=1, masking="ngram").train_dataloader(), 3)
    other = _take(_dm(data, seed=2, masking="ngram").train_dataloader(), 3)
    assert _same(first, again) and not _same(first, other)


def test_validation_is_finite_and_deterministic(wiki_data: Callable[..., DataConfig]) -> None:
    data = wiki_data(val_fraction=0.02)
    dm = _dm(data, val_batches=None)
    loader = dm.val_dataloader()
    one, two = list(loader), list(loader)
    assert 0 < len(one) < 100 and _same(one, two)
    assert len(list(_dm(data, val_batches=2).val_dataloader())) == 2


def test_train_stream_is_endless(tmp_path: Path) -> None:
    corpus = tmp_path / "small.txt"
    corpus.write_text(
        "\n\n".join(f"Paragraph {i} starts here. It has a second sentence. And a third one." for i in range(40)),
        encoding="utf-8",
    )
    data = DataConfig(
        corpus=str(corpus), cache_dir=str(tmp_path), max_length=16, batch_size=4, val_fraction=0.2, text_doc_chars=0
    )
    dm = _dm(data)
    assert len(_take(dm.train_dataloader(), 200)) == 200  # many epochs of a tiny corpus


def test_two_workers(wiki_data: Callable[..., DataConfig]) -> None:
    data = wiki_data(num_workers=2)
    dm = _dm(data, val_batches=3)
    assert isinstance(next(iter(dm.train_dataloader())), PackedBatch)  # one buffer per batch from a worker
    batches = _take(dm.train_dataloader(), 6)
    assert len(batches) == 6 and not _same(batches[:1], batches[1:2])
    assert len(list(dm.val_dataloader())) == 3
    again = _dm(data, val_batches=3)
    assert _same(_take(again.train_dataloader(), 6), batches)
    # handed over GROUP at a time, the batches come in the order a loader of one at a time gives them
    loader = dm.train_dataloader()
    assert isinstance(loader, GroupedLoader) and loader.batch_size == GROUP
    plain = DataLoader(loader.dataset, batch_size=None, collate_fn=packed(None, 2), num_workers=2)
    assert _same(_take(loader, 3 * 2 * GROUP + 1), _take(plain, 3 * 2 * GROUP + 1))
    # a resumed fit's loader skips what was consumed: the same batches as the first loader from there on
    resumed = _dm(data, val_batches=3)
    resumed.load_state_dict({"train_batches": 5})
    assert _same(_take(resumed.train_dataloader(), 2 * GROUP), _take(again.train_dataloader(), 5 + 2 * GROUP)[5:])


def test_corpus_errors_before_training(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    dm = PretrainDataModule(DataConfig(corpus=str(missing), cache_dir=str(tmp_path)), ObjectiveConfig(), VOCAB, 0)
    with pytest.raises(DataError, match=f"^data.corpus: {missing}: no such file"):
        dm.prepare_data()
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    dm = PretrainDataModule(DataConfig(corpus=str(empty), cache_dir=str(tmp_path)), ObjectiveConfig(), VOCAB, 0)
    with pytest.raises(DataError, match="corpus is empty"):
        dm.setup("fit")


@pytest.mark.parametrize(("device", "pinned"), [("cpu", False), ("cuda", True)])
def test_loader_workers_and_pinned_memory_follow_the_trainer(
    wiki_data: Callable[..., DataConfig], device: str, pinned: bool
) -> None:
    """Batches are page-locked when the trainer trains on CUDA (Lightning then copies them with
    non_blocking=True), not on a CPU; the loader uses ``data.num_workers`` resolved for the
    trainer's devices. The trainer stands in for one that placed the run (no GPU needed)."""
    from types import SimpleNamespace

    dm = _dm(wiki_data(num_workers="auto"))
    dm.trainer = SimpleNamespace(
        global_rank=0,
        world_size=1,  # type: ignore[assignment]
        strategy=SimpleNamespace(root_device=torch.device(device)),
    )
    loader = dm.train_dataloader()
    assert loader.pin_memory is pinned
    assert loader.num_workers == dm.data.workers(1) >= 1 and loader.persistent_workers
