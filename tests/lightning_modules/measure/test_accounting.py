"""Parameter counts against the ALBERT paper, and FLOPs/token against torch's flop counter."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.config.presets import get_preset
from ablate.lightning_modules.measure.accounting import flops_per_token, report_for
from ablate.lightning_modules.model.encoder import build_encoder

M = 1e6
TOL = 1.1 * M

# (preset, overrides, published millions): ALBERT paper Tables 2, 3 and 4
PUBLISHED = [
    ("bert-base", {}, 108),
    ("albert-base", {}, 12),
    ("albert-large", {}, 18),
    *[("albert-base", {"embed_dim": e, "sharing": "none"}, p) for e, p in [(64, 87), (128, 89), (256, 93), (768, 108)]],
    *[("albert-base", {"embed_dim": e, "sharing": "all"}, p) for e, p in [(64, 10), (128, 12), (256, 16), (768, 31)]],
    *[
        ("albert-base", {"embed_dim": 768, "sharing": s}, p)
        for s, p in [("all", 31), ("attn", 83), ("ffn", 57), ("none", 108)]
    ],
    *[
        ("albert-base", {"embed_dim": 128, "sharing": s}, p)
        for s, p in [("all", 12), ("attn", 64), ("ffn", 38), ("none", 89)]
    ],
]


@pytest.mark.parametrize(("preset", "overrides", "published"), PUBLISHED)
def test_published_counts(preset, overrides, published):
    report = report_for(dataclasses.replace(get_preset(preset), **overrides))
    assert abs(report.paper_count - published * M) <= TOL, report.paper_count / M
    assert report.paper_count == report.backbone + report.pooler


def test_large_models_where_the_paper_rounds_up():
    """Counted by the same rule, ALBERT-xlarge is 58.7M (paper: 60M) and xxlarge 222.6M (paper: 235M);
    both equal Hugging Face's counts for the released checkpoints (58.7M, 222.6M)."""
    assert report_for(get_preset("albert-xlarge")).paper_count == 58_724_864
    assert report_for(get_preset("albert-xxlarge")).paper_count == 222_595_584


@pytest.mark.parametrize(
    ("preset", "published"), [("mobilebert", 25.3), ("mobilebert-tiny", 15.1), ("ibbert-large", 293)]
)
def test_mobilebert_family_within_4_percent(preset, published):
    """MobileBERT paper Table 1, compared by backbone (embeddings + encoder, no pooler, no heads)."""
    backbone = report_for(get_preset(preset)).backbone
    assert abs(backbone / (published * M) - 1) <= 0.04, backbone / M


def test_backbone_excludes_pooler_and_heads():
    r = report_for(get_preset("bert-base"))
    assert r.backbone == 108_490_752  # 23.44M embeddings + 12 x 7.09M layers
    assert r.embedding + r.encoder == r.backbone
    assert r.heads == r.mlm_head + r.sentence_head and r.sentence_head == r.pooler + 768 * 2 + 2


@pytest.mark.parametrize(
    "overrides",
    [
        {"preset": "bert-tiny"},
        {"preset": "albert-tiny"},
        {"preset": "albert-tiny", "num_ffn": 3, "sharing": "attn", "embed_dim": 32},
        {"preset": "mobilebert-mini"},
        {"preset": "mobilebert-mini", "attention_input": "hidden", "intra_dim": 256, "sharing": "all"},
        {
            "preset": "albert-tiny",
            "sharing": "none",
            "layers": [
                {"num_heads": 2, "qk_dim": 16, "v_dim": 48, "ffn_dim": 300},
                {"num_heads": 4, "qk_dim": 8, "v_dim": 8, "ffn_dim": 64},
                {"num_heads": 1, "qk_dim": 32, "v_dim": 16, "ffn_dim": 128},
                {"num_heads": 3, "qk_dim": 24, "v_dim": 40, "ffn_dim": 10},
            ],
        },
    ],
)
def test_flops_per_token_matches_torch_flop_counter(overrides):
    cfg = build_config({"model": overrides}).model
    encoder = build_encoder(cfg).eval()
    T = 64
    # the math backend decomposes attention into matmuls the counter sees (it skips the CPU flash kernel)
    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        encoder(torch.randint(5, cfg.vocab_size, (1, T)))
    assert counter.get_total_flops() / T == pytest.approx(flops_per_token(encoder, T), rel=1e-6)
