"""MobileBERT bottlenecks and wiring, per-layer (schuBERT) dimensions, embedding simplifications."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.measure.accounting import report_for
from ablate.lightning_modules.model.encoder import build_encoder


def _model(**fields):
    return build_config({"model": {"preset": "mobilebert-mini", **fields}}).model


def _ids(B=2, T=16):
    return torch.randint(5, 8192, (B, T), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("wiring", "qk_in", "v_in"), [("shared_qk", 32, 128), ("bottleneck", 32, None), ("hidden", 128, None)]
)
def test_attention_reads_what_the_wiring_says(wiring, qk_in, v_in):
    enc = build_encoder(_model(attention_input=wiring))
    attn = enc.attentions[0].inner
    assert attn.qkv.in_features == qk_in
    assert (attn.v.in_features if attn.v is not None else None) == v_in
    assert attn.out.out_features == 32  # back to the block width; the residual inside the block is narrow
    assert (enc.bottlenecks[0].shared_qk is not None) == (wiring == "shared_qk")
    out = enc(_ids())
    assert out.shape == (2, 16, 128)  # the residual between blocks stays at H


def test_inverted_bottleneck_is_wider_inside():
    enc = build_encoder(_model(intra_dim=256, attention_input="hidden"))
    neck = enc.bottlenecks[0]
    assert (neck.enter.linear.in_features, neck.enter.linear.out_features) == (128, 256)
    assert enc.ffn_stacks[0][0].inner.up.in_features == 256
    assert enc(_ids()).shape == (2, 16, 128)


def test_stacked_ffns_inside_the_bottleneck_and_nonorm_relu():
    enc = build_encoder(_model(num_ffn=4))
    assert all(len(stack) == 4 and stack[0].inner.up.in_features == 32 for stack in enc.ffn_stacks)
    assert type(enc.ffn_stacks[0][0].norm).__name__ == "NoNorm"
    assert isinstance(enc.ffn_stacks[0][0].inner.activation, nn.ReLU)


def test_trigram_embedding_concatenates_neighbours():
    enc = build_encoder(_model(position="none", token_types=0, embed_norm=False)).eval()
    emb = enc.embeddings
    assert emb.trigram.linear.in_features == 3 * 32 and emb.trigram.linear.out_features == 128
    ids = _ids(1, 5)
    e = emb.word(ids)[0]  # (T, E)
    expected = emb.trigram.linear(torch.cat([e[3], e[2], e[1]]))  # position 2 sees t+1, t, t-1
    torch.testing.assert_close(emb(ids)[0, 2], expected)


def test_per_layer_dimensions_with_k_not_v():
    layers = [
        {"num_heads": 2, "qk_dim": 16, "v_dim": 48, "ffn_dim": 300},
        {"num_heads": 4, "qk_dim": 8, "v_dim": 8, "ffn_dim": 64},
        {"num_heads": 1, "qk_dim": 32, "v_dim": 16, "ffn_dim": 128},
        {"num_heads": 3, "qk_dim": 24, "v_dim": 40, "ffn_dim": 10},
    ]
    cfg = build_config({"model": {"preset": "bert-tiny", "layers": layers}}).model
    enc = build_encoder(cfg)
    for spec, attn, stack in zip(layers, enc.attentions, enc.ffn_stacks, strict=True):
        inner = attn.inner
        assert (inner.num_heads, inner.qk_dim, inner.v_dim) == (spec["num_heads"], spec["qk_dim"], spec["v_dim"])
        assert inner.out.in_features == spec["num_heads"] * spec["v_dim"]
        assert stack[0].inner.up.out_features == spec["ffn_dim"]
    assert enc(_ids(2, 8)).shape == (2, 8, 128)


@pytest.mark.parametrize(
    ("fields", "gone"),
    [({"position": "none"}, "position"), ({"token_types": 0}, "token_type"), ({"embed_norm": False}, "norm")],
)
def test_embedding_simplifications_remove_modules(fields, gone):
    base = build_config({"model": {"preset": "bert-tiny"}}).model
    simple = build_config({"model": {"preset": "bert-tiny", **fields}}).model
    emb = build_encoder(simple).embeddings
    assert getattr(emb, gone) is None or isinstance(getattr(emb, gone), nn.Identity)
    assert report_for(simple).embedding < report_for(base).embedding
    assert build_encoder(simple)(_ids(2, 8)).shape == (2, 8, 128)


def test_dropout_zero_removes_dropout_modules():
    with_dropout = build_encoder(build_config({"model": {"preset": "bert-tiny", "dropout": 0.1}}).model)
    without = build_encoder(build_config({"model": {"preset": "bert-tiny", "dropout": 0.0}}).model)
    assert any(isinstance(m, nn.Dropout) for m in with_dropout.modules())
    assert not any(isinstance(m, nn.Dropout) for m in without.modules())
    assert all(m.inner.dropout_p == 0.0 for m in without.attentions)
