"""FinetuneModule: the classifier built on a pre-trained encoder."""

from __future__ import annotations

import torch

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.methods.finetune import FinetuneModule
from ablate.lightning_modules.model.heads import build_pretraining_model


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
    trainer = pl.Trainer(
        max_steps=4,
        val_check_interval=2,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
    )
    trainer.fit(module, batches, dev)
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
