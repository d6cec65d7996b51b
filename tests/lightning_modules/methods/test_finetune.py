"""FinetuneModule: the classifier built on a pre-trained encoder."""

from __future__ import annotations

import pytest
import torch

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.methods.finetune import FinetuneModule
from ablate.lightning_modules.model.heads import build_pretraining_model
from tests.lightning import bare_trainer


def _cfg(sentence: str = "sop", **finetune):
    return build_config(
        {
            "model": {
                "preset": "albert-tiny",
                "vocab_size": 200,
                "hidden_dim": 32,
                "embed_dim": 16,
                "num_heads": 2,
                "ffn_dim": 64,
                "max_position": 32,
            },
            "objective": {"sentence": sentence},
        },
        {"finetune.source": "runs:/x", **{f"finetune.{k}": v for k, v in finetune.items()}},
    )


def _batch(C: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (4, 10), generator=g)
    return {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": torch.ones_like(ids).bool(),
        "labels": torch.arange(4) % C,
    }


def test_the_encoder_and_pooler_come_from_the_pretrained_model_which_stays_unchanged():
    cfg = _cfg()
    pretrained = build_pretraining_model(cfg.model, cfg.objective)
    before = {k: v.clone() for k, v in pretrained.state_dict().items()}
    module = FinetuneModule(cfg, pretrained)
    enc = module.model.encoder.state_dict()
    assert all(torch.equal(v, pretrained.encoder.state_dict()[k]) for k, v in enc.items())
    assert torch.equal(module.model.head.pooler.weight, pretrained.sentence_head.pooler.weight)
    loss = module.training_step(_batch(), 0)
    loss.backward()
    assert all(p.grad is None for p in pretrained.parameters())  # a copy is trained, not the source
    assert all(torch.equal(v, pretrained.state_dict()[k]) for k, v in before.items())


def test_a_model_without_sentence_head_gets_a_fresh_pooler_and_more_classes():
    cfg = _cfg(sentence="none", num_labels=3)
    module = FinetuneModule(cfg, build_pretraining_model(cfg.model, cfg.objective))
    assert module.model.head.pooler.in_features == 32 and module.model.head.classifier.out_features == 3
    assert module.model(_batch(3)).shape == (4, 3)


def _trainer(max_steps: int, callbacks: list | None = None):
    """A bare CPU Trainer validating one dev batch every 2 steps."""
    return bare_trainer(max_steps, val_every=2, val_batches=1, callbacks=callbacks or [])


def test_the_best_validations_weights_are_kept_during_fit_only_and_restored():
    """Early stopping's choice is what the run leaves; a later validation (of the quantized
    classifier, whose state holds packed tensors and dtypes) keeps nothing."""
    import copy

    import lightning.pytorch as pl

    from ablate.lightning_modules.config.quant import QuantConfig
    from ablate.lightning_modules.methods.quantization.apply import quantize

    cfg = _cfg(num_labels=2, max_steps=4, val_every=2)
    module = FinetuneModule(cfg, build_pretraining_model(cfg.model, cfg.objective))
    from torch.utils.data import DataLoader

    batches = DataLoader([_batch() for _ in range(4)], batch_size=None)
    dev = DataLoader([_batch()], batch_size=None)
    _trainer(max_steps=4).fit(module, batches, dev)
    assert module.best_state is not None and module.best is not None
    kept = copy.deepcopy(module.best_state)
    torch.nn.init.zeros_(module.model.head.classifier.weight)  # the weights drift after the best validation
    module.restore_best()
    assert all(torch.equal(v, kept[k]) for k, v in module.model.state_dict().items())
    module.best = -1.0  # the quantized classifier scores "better": still nothing is kept
    module.model = quantize(module.model, QuantConfig(method="dynamic-int8"))
    pl.Trainer(logger=False, enable_progress_bar=False, accelerator="cpu", limit_val_batches=1).validate(
        module, dev, verbose=False
    )
    assert all(torch.equal(v, kept[k]) for k, v in module.best_state.items())


def test_a_regression_head_has_one_output_trained_by_squared_error():
    cfg = _cfg(kind="regression", num_labels=1, metric="pearson")
    module = FinetuneModule(cfg, build_pretraining_model(cfg.model, cfg.objective))
    batch = {**_batch(), "labels": torch.tensor([0.5, 4.0, 2.5, 1.0])}
    out = module.model(batch)
    assert out.shape == (4, 1)
    loss = module.task_output(module.model, batch, None).loss  # the label term
    assert torch.allclose(loss, ((out.squeeze(-1) - batch["labels"]) ** 2).mean())
    assert set(module.dev_metrics()) == {"pearson", "spearman", "loss"}


def test_glues_metrics_f1_of_class_1_for_two_classes_and_correlations():
    from ablate.lightning_modules.methods.finetune import METRICS, computed

    preds, labels = torch.tensor([1, 1, 0, 0, 1]), torch.tensor([1, 0, 0, 1, 1])
    tp, fp, fn = 2, 1, 1  # F1 of the positive class, as GLUE scores MRPC and QQP
    assert float(METRICS["f1"](2)(preds, labels)) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    per_class = [2 * 1 / (2 * 1 + 1 + 1), 2 * 2 / (2 * 2 + 1 + 1)]  # macro over three classes' ...
    three = METRICS["f1"](3)(torch.tensor([0, 0, 1, 1, 1, 2]), torch.tensor([0, 1, 1, 1, 0, 2]))
    assert float(three) == pytest.approx((per_class[0] + per_class[1] + 1.0) / 3)
    x, y = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 3.0, 2.0, 4.0])
    pearson, spearman = METRICS["pearson"](1), METRICS["spearman"](1)
    pearson.update(x, y)
    spearman.update(x, y)
    assert float(computed(pearson)) == pytest.approx(0.8) and float(computed(spearman)) == pytest.approx(0.8)
    flat = METRICS["pearson"](1)
    flat.update(torch.ones(4), y)  # a constant prediction: undefined, scored 0
    assert float(computed(flat)) == 0.0


def test_a_source_read_in_eval_mode_fine_tunes_in_train_mode_and_validates_in_eval_mode():
    """A model read from a run or a folder is in eval mode, and Lightning keeps each module's mode: the fit
    puts the classifier, its copied encoder included, in train mode (its dropout on) for every step,
    and validation in eval mode (the run's dropout off there)."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    cfg = _cfg(num_labels=2, max_steps=3, val_every=2)
    source = build_pretraining_model(cfg.model, cfg.objective).eval()  # as load_pretrained returns it
    module = FinetuneModule(cfg, source)
    assert not module.model.encoder.training  # the copy came in eval mode
    seen: list[tuple[str, bool]] = []

    class Modes(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(("train", all(m.training for m in pl_module.model.modules())))

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            seen.append(("validate", any(m.training for m in pl_module.model.modules())))

    batches = DataLoader([_batch() for _ in range(3)], batch_size=None)
    _trainer(max_steps=3, callbacks=[Modes()]).fit(module, batches, DataLoader([_batch()], batch_size=None))
    assert seen[:4] == [("train", True), ("train", True), ("validate", False), ("train", True)]
