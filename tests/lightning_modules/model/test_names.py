"""The parameter names of lightning_modules.names are the model's own, in every family."""

from __future__ import annotations

import pytest

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.model import names
from ablate.lightning_modules.model.heads import build_pretraining_model

FAMILIES = {
    "bert": {"preset": "bert-tiny"},
    "albert, all shared, E != H": {"preset": "albert-tiny"},
    "attention shared": {"preset": "albert-tiny", "sharing": "attn"},
    "mobilebert, bottleneck, F=2": {"preset": "mobilebert-mini"},
    "schubert per-layer dims": {
        "preset": "bert-tiny",
        "layers": [{"num_heads": 2, "qk_dim": 16, "v_dim": 32, "ffn_dim": 64}] * 4,
    },
}


def _expected(cfg) -> set[str]:
    """Every module the names module says a model of ``cfg`` has."""
    attn = 1 if cfg.sharing in ("all", "attn") else cfg.num_layers
    ffn = 1 if cfg.sharing in ("all", "ffn") else cfg.num_layers
    out = {names.embeddings("word"), names.mlm_head("transform"), names.sentence_head("pooler")}
    out |= {names.sentence_head("classifier")} | ({names.embeddings("norm")} if cfg.embed_norm else set())
    for i in range(attn):
        out |= {names.attention(i, "inner.qkv"), names.attention(i, "inner.out"), names.attention(i, "norm")}
    for i in range(ffn):
        out.add(names.ffn_stack(i))
        for j in range(cfg.num_ffn):
            out |= {names.ffn(i, j, "inner.up"), names.ffn(i, j, "inner.down"), names.ffn(i, j, "norm")}
    if cfg.intra_dim is not None:
        out |= {names.bottleneck(i) for i in range(cfg.num_layers)}
    if cfg.embed_dim != cfg.hidden_dim:
        out.add(names.embeddings("trigram.linear" if cfg.embedding == "trigram" else "projection"))
    return out


@pytest.mark.parametrize("model", FAMILIES.values(), ids=FAMILIES.keys())
def test_every_name_is_a_module_of_the_model(model):
    cfg = build_config({"model": model, "objective": {"sentence": "sop"}})
    net = build_pretraining_model(cfg.model, cfg.objective)
    modules = {name for name, _ in net.named_modules()}
    assert _expected(cfg.model) <= modules, sorted(_expected(cfg.model) - modules)
    assert net.get_submodule(names.embeddings("word")).weight.shape[0] == cfg.model.vocab_size
    # every parameter lives under one of the three top-level names
    tops = (names.ENCODER + ".", names.MLM_HEAD + ".", names.SENTENCE_HEAD + ".")
    assert all(key.startswith(tops) for key in net.state_dict())


def test_a_part_is_appended_with_a_dot():
    assert names.attention(2, "inner.qkv") == "encoder.attentions.2.inner.qkv"
    assert names.ffn(0, 1, "norm.weight") == "encoder.ffn_stacks.0.1.norm.weight"
    assert (names.attention(3), names.sentence_head()) == ("encoder.attentions.3", "sentence_head")
