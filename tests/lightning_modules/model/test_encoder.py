from __future__ import annotations

import pytest
import torch

from ablate.lightning_modules.config.experiment import prediction_slots
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.model.encoder import Trace, build_encoder, layer_plan
from ablate.lightning_modules.model.heads import build_pretraining_model


def _cfg(**model):
    return build_config({"model": {"preset": "albert-tiny", **model}}).model


def _batch(V=8192, B=4, T=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    labels = torch.full((B, T), -100)
    labels[:, 1::5] = ids[:, 1::5]
    return {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": torch.ones(B, T, dtype=torch.bool),
        "mlm_labels": labels,
        "sentence_label": torch.randint(0, 2, (B,), generator=g),
    }


@pytest.mark.parametrize(("sharing", "n_attn", "n_ffn"), [("none", 4, 4), ("all", 1, 1), ("attn", 1, 4), ("ffn", 4, 1)])
def test_layer_plan_and_unique_modules(sharing, n_attn, n_ffn):
    enc = build_encoder(_cfg(sharing=sharing))
    assert len(enc.attentions) == n_attn and len(enc.ffn_stacks) == n_ffn
    assert len(layer_plan(4, sharing)) == 4


def _copy_shared_into_unshared(shared, unshared, layers=4):
    unshared.embeddings.load_state_dict(shared.embeddings.state_dict())
    for i in range(layers):
        unshared.attentions[i].load_state_dict(shared.attentions[0].state_dict())
        unshared.ffn_stacks[i].load_state_dict(shared.ffn_stacks[0].state_dict())


def test_shared_layers_are_the_same_tensors_and_gradients_accumulate():
    torch.manual_seed(0)
    objective = build_config({}).objective
    shared = build_pretraining_model(_cfg(sharing="all", dropout=0.0), objective)
    unshared = build_pretraining_model(_cfg(sharing="none", dropout=0.0), objective)
    _copy_shared_into_unshared(shared.encoder, unshared.encoder)
    unshared.mlm_head.load_state_dict(shared.mlm_head.state_dict())
    unshared.sentence_head.load_state_dict(shared.sentence_head.state_dict())
    # one tensor, used by all four layers
    assert {step.attention for step in shared.encoder.plan} == {0}
    assert sum(p.numel() for p in shared.parameters()) < sum(p.numel() for p in unshared.parameters())
    batch = _batch()
    shared(batch).loss.backward()
    unshared(batch).loss.backward()
    # the shared tensor's gradient is the sum of what each layer's copy receives
    per_layer = sum(unshared.encoder.attentions[i].inner.qkv.weight.grad for i in range(4))
    torch.testing.assert_close(shared.encoder.attentions[0].inner.qkv.weight.grad, per_layer, atol=1e-6, rtol=1e-4)
    per_layer = sum(unshared.encoder.ffn_stacks[i][0].inner.up.weight.grad for i in range(4))
    torch.testing.assert_close(shared.encoder.ffn_stacks[0][0].inner.up.weight.grad, per_layer, atol=1e-6, rtol=1e-4)


def test_shared_equals_unshared_with_tied_copies():
    """An all-shared model computes what an unshared model computes when its layers hold copies."""
    torch.manual_seed(0)
    shared = build_encoder(_cfg(sharing="all")).eval()
    unshared = build_encoder(_cfg(sharing="none")).eval()
    _copy_shared_into_unshared(shared, unshared)
    ids = _batch()["input_ids"]
    torch.testing.assert_close(shared(ids), unshared(ids))


def test_stacked_ffn_and_padding_mask():
    cfg = _cfg(num_ffn=3, sharing="none")
    enc = build_encoder(cfg).eval()
    assert all(len(stack) == 3 for stack in enc.ffn_stacks)
    ids = _batch(B=2, T=16)["input_ids"]
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[1, 10:] = False
    out_padded = enc(ids, attention_mask=mask)
    out_short = enc(ids[1:, :10])
    torch.testing.assert_close(out_padded[1, :10], out_short[0], atol=1e-5, rtol=1e-5)


def test_mlm_logits_only_at_masked_positions_and_decoder_is_tied():
    objective = build_config({"objective": {"mask_prob": 0.2}}).objective  # the batch masks 1 in 5
    model = build_pretraining_model(_cfg(embed_dim=32), objective)
    batch = _batch()
    out = model(batch)
    labels = batch["mlm_labels"]
    selected = labels[labels != -100]  # row-major
    slots = prediction_slots(labels.numel(), 0.2)  # a static number of rows, not the whole sequence
    assert out.mlm_logits.shape == (slots, 8192) and slots < labels.numel()
    assert torch.equal(out.mlm_targets[: selected.numel()], selected)  # the masked positions first, in order
    assert (out.mlm_targets[selected.numel() :] == -100).all() and out.mlm_valid.sum() == selected.numel()
    assert out.sentence_logits.shape == (4, 2)
    names = [n for n, _ in model.named_parameters()]
    assert not any(
        n.startswith("mlm_head") and "weight" in n and p.shape == (8192, 32) for n, p in model.named_parameters()
    )
    assert "encoder.embeddings.word.weight" in names
    out.loss.backward()
    assert model.encoder.embeddings.word.weight.grad is not None


@pytest.mark.parametrize("preset", ["albert-tiny", "bert-tiny", "mobilebert-mini"])
def test_last_layer_on_the_needed_rows_only_gives_the_same_outputs_and_gradients(preset):
    """The pre-training forward runs the last layer's FFN on masked rows and [CLS] only: its
    losses and every gradient equal those of the full forward (which distillation uses)."""
    torch.manual_seed(0)
    cfg = build_config({"model": {"preset": preset, "dropout": 0.0}}).model
    model = build_pretraining_model(cfg, build_config({}).objective)
    batch = _batch(V=cfg.vocab_size)
    batch["attention_mask"][0, -6:] = False  # with padding too
    sparse = model(batch)
    sparse.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    full = model(batch, Trace(attention=frozenset()))  # the full path: every position of every layer
    full.loss.backward()
    torch.testing.assert_close(sparse.loss, full.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sparse.cls, full.cls, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sparse.mlm_logits, full.mlm_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
