"""Fine-tuning batches are padded to their longest row, not to ``finetune.max_length``: the same
logits and accuracy at fp32 as padding every row to ``max_length`` (or classifying it alone), on
the real SST-2 dev set. Padding keys are masked out and the classifier reads [CLS], so only float
rounding differs (MobileBERT's trigram embedding, which reads a row's next token, is the exception)."""

from __future__ import annotations

import csv
import itertools

import pytest
import torch

from ablate.datamodules.classification import ClassificationDataModule, bucket_lengths, collate
from ablate.datamodules.tokenizer import special_ids, train_tokenizer
from ablate.lightning_modules.config.experiment import ObjectiveConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.model.classifier import build_classifier
from ablate.lightning_modules.model.heads import build_pretraining_model
from tests.conftest import SHARED_DATA

SST2 = SHARED_DATA / "sst2"
MAX_LENGTH = 128
BATCHES = 8  # of 32 rows: the first 256 dev sentences


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> ClassificationDataModule:
    """SST-2's dev set with a 1,000-piece tokenizer trained on 3,000 training sentences."""
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared SST-2 data not found at {SST2}")
    with open(SST2 / "train.tsv", encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        texts = [row[0] for row in itertools.islice(reader, 1, 3001)]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(texts, 1000, lowercase=True).save(str(path))
    cfg = FinetuneConfig(
        train=str(SST2 / "validation.tsv"), validation=str(SST2 / "validation.tsv"), max_length=MAX_LENGTH
    )
    dm = ClassificationDataModule(cfg, path)
    dm.setup("fit")
    return dm


def _compiled_classifier() -> tuple[torch.nn.Module, torch.nn.Module]:
    """A 1-layer classifier (eval) and its whole forward compiled with static shapes (aot_eager), dynamo reset."""
    torch.manual_seed(0)
    model_cfg = ModelConfig(
        vocab_size=1000, hidden_dim=32, embed_dim=32, num_layers=1, num_heads=2, ffn_dim=64, max_position=MAX_LENGTH
    )
    classifier = build_classifier(build_pretraining_model(model_cfg, ObjectiveConfig()), 2, 0.0, 0.5).eval()
    compiled = torch.compile(classifier, backend="aot_eager", dynamic=False)
    torch._dynamo.reset()
    return classifier, compiled


@pytest.mark.parametrize("sharing", ["none", "all"])  # BERT and ALBERT
def test_padding_to_the_longest_row_gives_the_same_logits_and_accuracy(dev, sharing):
    torch.manual_seed(0)
    model_cfg = ModelConfig(
        vocab_size=1000,
        embed_dim=32 if sharing == "all" else 64,
        hidden_dim=64,
        num_layers=2,
        num_heads=2,
        ffn_dim=128,
        sharing=sharing,
        max_position=MAX_LENGTH,
        dropout=0.0,
    )
    pretrained = build_pretraining_model(model_cfg, ObjectiveConfig(sentence="sop"))
    classifier = build_classifier(pretrained, 2, 0.0, 0.5).eval()  # a wide init: logits far apart
    pad = special_ids(dev.tokenizer).pad
    rows = [dev.val_set[i] for i in range(len(dev.val_set))]
    longest, full, widths = [], [], []
    with torch.no_grad():
        loader = itertools.islice(dev.val_dataloader(), BATCHES)
        for start, batch in zip(itertools.count(0, dev.cfg.batch_size), loader, strict=False):
            chunk = rows[start : start + dev.cfg.batch_size]
            assert batch["input_ids"].shape[1] == max(len(ids) for ids, _, _ in chunk)  # padded to the longest
            widths.append(batch["input_ids"].shape[1])
            longest.append(classifier(batch))
            padded = collate(chunk, pad, length=MAX_LENGTH)
            assert padded["input_ids"].shape[1] == MAX_LENGTH
            full.append(classifier(padded))
        alone = torch.cat([classifier(collate([row], pad)) for row in rows[:64]])
    longest_logits, full_logits = torch.cat(longest), torch.cat(full)
    assert max(widths) <= MAX_LENGTH and min(widths) < MAX_LENGTH  # shorter batches: less work
    torch.testing.assert_close(longest_logits, full_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(longest_logits[:64], alone, rtol=1e-4, atol=1e-5)
    labels = torch.tensor([y for _, _, y in rows[: len(longest_logits)]])
    accuracy = [(logits.argmax(-1) == labels).float().mean() for logits in (longest_logits, full_logits)]
    assert accuracy[0] == accuracy[1]
    assert longest_logits.std(0).min() > 1e-3  # the rows are told apart: the comparison is not vacuous


def test_a_compiled_step_sees_a_few_bucketed_widths_and_the_same_logits(dev):
    """With ``bucketed`` (``trainer.compile``), training batches are padded to a bucket's width: the
    same rows and logits as padded to their longest, and the compiled classifier builds one graph per
    width it meets, not one per batch length."""
    from torch._dynamo.utils import counters

    buckets = bucket_lengths(MAX_LENGTH)
    assert buckets == (16, 32, 64, 128) and bucket_lengths(100) == (16, 32, 64, 100)
    bucketed = ClassificationDataModule(dev.cfg, dev.tokenizer_path, bucketed=True)
    bucketed.setup("fit")
    assert bucketed.train_set is dev.train_set  # the split tokenized once in this process
    classifier, compiled = _compiled_classifier()
    counters.clear()
    pairs = zip(bucketed.train_dataloader(), dev.train_dataloader(), strict=True)  # the same seed, the same rows
    lengths, widths = set(), set()
    with torch.no_grad():
        for padded, plain in itertools.islice(pairs, BATCHES):
            width, longest = padded["input_ids"].shape[1], plain["input_ids"].shape[1]
            assert width == min(b for b in buckets if b >= longest)
            assert torch.equal(padded["input_ids"][:, :longest], plain["input_ids"])
            assert not padded["attention_mask"][:, longest:].any()
            torch.testing.assert_close(compiled(padded), classifier(plain), rtol=1e-4, atol=1e-5)
            lengths.add(longest)
            widths.add(width)
    assert len(lengths) > len(widths)  # batches of many lengths, a few widths
    assert counters["stats"]["unique_graphs"] == len(widths)


def test_a_compiled_steps_batches_are_all_of_one_size_so_an_epoch_compiles_nothing_more(dev):
    """SST-2's 872 dev rows in batches of 32: bucketed (a compiled step), the epoch's last 8 rows are left
    out rather than given as a batch of their own size, which would compile every layer again; the batches
    are the plain loader's first 27, and a whole epoch builds one graph per width."""
    from torch._dynamo.utils import counters

    bucketed = ClassificationDataModule(dev.cfg, dev.tokenizer_path, bucketed=True)
    bucketed.setup("fit")
    plain = [b["labels"] for b in dev.train_dataloader()]
    whole = list(bucketed.train_dataloader())
    assert [len(b) for b in plain[-2:]] == [32, 872 % 32] and len(whole) == 872 // 32
    assert all(len(b["labels"]) == 32 for b in whole)
    assert torch.equal(torch.cat([b["labels"] for b in whole]), torch.cat(plain)[: 27 * 32])
    classifier, compiled = _compiled_classifier()
    counters.clear()
    with torch.no_grad():
        for batch in whole:
            compiled(batch)
    assert counters["stats"]["unique_graphs"] == len({b["input_ids"].shape[1] for b in whole})
