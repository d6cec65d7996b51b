"""Intrinsic evaluation: the linear probe on synthetic features, and MLM/NSP/SOP scores of a tiny model."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from ablate.datamodules.pretrain import PretrainDataModule, probe_streams
from ablate.lightning_modules.config.experiment import DataConfig, ObjectiveConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.methods import probe
from ablate.lightning_modules.methods.probe import (
    IntrinsicScores,
    cls_features,
    intrinsic_eval,
    linear_probe,
    mlm_accuracy,
)
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model

VOCAB = 1000


def _blobs(n: int, dim: int, seed: int, shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, dim, generator=g) * 3.0 + 10.0  # off-centre and wide: standardisation matters
    x[:, 0] += shift * (2 * y - 1)
    return x, y


def test_probe_separates_separable_features() -> None:
    x, y = _blobs(400, 16, 0, shift=8.0)
    tx, ty = _blobs(200, 16, 1, shift=8.0)
    assert linear_probe(x, y, tx, ty) > 0.95


def test_probe_is_at_chance_on_random_labels() -> None:
    g = torch.Generator().manual_seed(0)
    x, tx = torch.randn(300, 32, generator=g), torch.randn(1000, 32, generator=g)
    y, ty = torch.randint(0, 2, (300,), generator=g), torch.randint(0, 2, (1000,), generator=g)
    assert abs(linear_probe(x, y, tx, ty) - 0.5) < 0.07


def test_probe_is_deterministic_for_a_seed() -> None:
    x, y = _blobs(200, 16, 0, shift=1.0)
    tx, ty = _blobs(200, 16, 1, shift=1.0)
    assert linear_probe(x, y, tx, ty, seed=3) == linear_probe(x, y, tx, ty, seed=3)


def test_probe_rejects_empty_sets() -> None:
    x, y = _blobs(20, 4, 0, shift=1.0)
    with pytest.raises(ValueError, match="needs examples"):
        linear_probe(x, y, x[:0], y[:0])


def test_scores_as_metrics() -> None:
    assert IntrinsicScores(0.1, 0.6, 0.7).as_metrics() == {
        "intrinsic/mlm_acc": 0.1,
        "intrinsic/nsp_acc": 0.6,
        "intrinsic/sop_acc": 0.7,
    }


@pytest.fixture(scope="module")
def tiny_data(wiki_validation: Path, tmp_path_factory: pytest.TempPathFactory) -> DataConfig:
    return DataConfig(
        corpus=str(wiki_validation),
        max_length=64,
        batch_size=8,
        tokenizer_docs=300,
        num_workers=0,
        shuffle_buffer=50,
        cache_dir=str(tmp_path_factory.mktemp("probe-cache")),
    )


def _tiny_model(sentence: str = "sop") -> PretrainingModel:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=VOCAB, embed_dim=16, hidden_dim=32, num_layers=2, num_heads=2, ffn_dim=64, max_position=64
    )
    return build_pretraining_model(cfg, ObjectiveConfig(sentence=sentence))


def _batches(data: DataConfig, n: int) -> list[dict[str, torch.Tensor]]:
    dm = PretrainDataModule(data, ObjectiveConfig(sentence="sop"), VOCAB, seed=0, val_batches=n)
    return list(dm.val_dataloader())


def test_cls_features_and_mlm_accuracy_match_a_direct_forward(tiny_data: DataConfig) -> None:
    model, batches = _tiny_model(), _batches(tiny_data, 2)
    x, y = cls_features(model, batches)
    assert model.training  # restored
    model.eval()
    with torch.no_grad():
        hidden = [model.encoder(b["input_ids"], b["token_type_ids"], b["attention_mask"])[:, 0] for b in batches]
        outs = [model(b) for b in batches]
    assert x.shape == (sum(len(b["input_ids"]) for b in batches), 32)
    torch.testing.assert_close(x, torch.cat(hidden))
    torch.testing.assert_close(y, torch.cat([b["sentence_label"] for b in batches]))
    correct = sum(int((o.mlm_logits.argmax(-1) == o.mlm_targets).sum()) for o in outs)
    total = sum(o.mlm_targets.numel() for o in outs)
    assert total > 0
    assert mlm_accuracy(model, batches) == pytest.approx(correct / total)


def test_cls_features_skip_unlabelled_rows(tiny_data: DataConfig) -> None:
    batch = _batches(tiny_data, 1)[0]
    batch["sentence_label"][:3] = -100
    x, y = cls_features(_tiny_model(), [batch])
    assert len(x) == len(y) == len(batch["input_ids"]) - 3


def test_a_pass_reads_the_device_once_at_its_end_not_per_batch(tiny_data: DataConfig) -> None:
    """On a GPU a read per batch would make each probe forward wait for the one before."""
    from ablate.benchmarks.host_reads import _watching

    model, batches = _tiny_model(), _batches(tiny_data, 4)
    reads = []
    for n in (1, 4):
        seen: list[str | None] = []
        with _watching(torch.device("cpu"), seen.append):
            probe._run(model, batches[:n])
        reads.append(len(seen))
    assert reads[0] == reads[1] <= 4  # the rows kept (features, labels), the two MLM counts


@pytest.fixture(scope="module")
def scored(tiny_data: DataConfig) -> tuple[PretrainingModel, dict[str, torch.Tensor], IntrinsicScores]:
    model = _tiny_model("none")
    model.train()
    model.encoder.eval()  # a mixed state (e.g. frozen layers) must come back as it was
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scores = intrinsic_eval(model, probe_streams(tiny_data, VOCAB, seed=0), seed=0)
    return model, before, scores


def test_intrinsic_eval_scores_in_range(scored) -> None:
    _, _, scores = scored
    for value in (scores.mlm_acc, scores.nsp_acc, scores.sop_acc):
        assert 0.0 <= value <= 1.0
    assert 0.2 < scores.nsp_acc < 0.85 and 0.2 < scores.sop_acc < 0.85  # a random model is near chance


def test_intrinsic_eval_leaves_the_model_unchanged(scored) -> None:
    model, before, _ = scored
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert model.training and model.mlm_head.training
    assert not any(m.training for m in model.encoder.modules())
    assert all(p.grad is None for p in model.parameters())


def test_intrinsic_eval_is_deterministic(scored, tiny_data: DataConfig) -> None:
    model, _, scores = scored
    again = intrinsic_eval(model, probe_streams(tiny_data, VOCAB, seed=0, train_batches=40, test_batches=10), seed=0)
    assert again == scores


def test_intrinsic_eval_uses_the_budget(tiny_data: DataConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    counts: list[int] = []
    real_run = probe._run

    def counting_run(model, batches):
        batches = list(batches)
        counts.append(len(batches))
        return real_run(model, batches)

    monkeypatch.setattr(probe, "_run", counting_run)
    scores = intrinsic_eval(_tiny_model(), probe_streams(tiny_data, VOCAB, train_batches=3, test_batches=2))
    assert counts == [3, 2, 3, 2]  # nsp train, nsp test, sop train, sop test
    assert all(0.0 <= v <= 1.0 for v in scores.as_metrics().values())


def test_the_probes_training_batches_are_read_once_per_process(tiny_data: DataConfig) -> None:
    """A study's runs probe on the same batches: the second run's are the first's, from memory (the same
    objects), equal to the stream's first batches; another seed reads its own."""
    first = probe_streams(tiny_data, VOCAB, seed=0, train_batches=3, test_batches=2)
    again = probe_streams(tiny_data, VOCAB, seed=0, train_batches=3, test_batches=2)
    for task in ("nsp", "sop"):
        kept, read = first[task][0], again[task][0]
        assert isinstance(kept, list) and len(kept) == 3 and all(a is b for a, b in zip(kept, read, strict=True))
        dm = PretrainDataModule(tiny_data, ObjectiveConfig(sentence=task), VOCAB, seed=0, val_batches=2)
        dm.prepare_data()
        fresh = list(itertools.islice(dm.train_dataloader(), 3))
        assert all(torch.equal(a[k], b[k]) for a, b in zip(kept, fresh, strict=True) for k in a)
    other = probe_streams(tiny_data, VOCAB, seed=1, train_batches=3, test_batches=2)
    assert other["nsp"][0][0] is not first["nsp"][0][0]
