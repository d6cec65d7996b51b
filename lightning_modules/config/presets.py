"""Named models: one plain function per published architecture, plus small CPU ones.

Each returns a :class:`ModelConfig`; ``PRESETS`` maps the CLI names to them. ALBERT
presets follow the released configs (V=30000, E=128, all layers shared).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import to_dict
from ablate.lightning_modules.config.model import ModelConfig


def bert_base() -> ModelConfig:
    """BERT-base as compared in the ALBERT paper (V=30000): 108M."""
    return ModelConfig(
        vocab_size=30000, embed_dim=768, hidden_dim=768, num_layers=12, num_heads=12, ffn_dim=3072, sharing="none"
    )


def bert_base_uncased() -> ModelConfig:
    """The public ``bert-base-uncased`` (and ``-cased`` but for V=28996): BERT-base with its released
    WordPiece vocabulary, V=30522 (the size ``data.tokenizer: bert-base-uncased`` has): 109M."""
    return dataclasses.replace(bert_base(), vocab_size=30522)


def distilbert() -> ModelConfig:
    """DistilBERT's student (``distilbert-base-uncased``): BERT-base's width, 6 layers, no token-type
    embedding, its teacher's vocabulary (``bert-base-uncased``'s, V=30522): 66M. Its recipe (teacher
    layers, triple loss) is ``sweeps/recipes/distilbert.yaml``."""
    return dataclasses.replace(bert_base_uncased(), num_layers=6, token_types=0)


def bert_large() -> ModelConfig:
    """BERT-large (V=30000): 334M."""
    return ModelConfig(
        vocab_size=30000, embed_dim=1024, hidden_dim=1024, num_layers=24, num_heads=16, ffn_dim=4096, sharing="none"
    )


def albert_base() -> ModelConfig:
    """ALBERT-base: E=128, H=768, L=12, all shared: 12M."""
    return ModelConfig(
        vocab_size=30000,
        embed_dim=128,
        hidden_dim=768,
        num_layers=12,
        num_heads=12,
        ffn_dim=3072,
        sharing="all",
        dropout=0.0,
    )


def albert_large() -> ModelConfig:
    """ALBERT-large: E=128, H=1024, L=24, all shared: 18M."""
    return ModelConfig(
        vocab_size=30000,
        embed_dim=128,
        hidden_dim=1024,
        num_layers=24,
        num_heads=16,
        ffn_dim=4096,
        sharing="all",
        dropout=0.0,
    )


def albert_xlarge() -> ModelConfig:
    """ALBERT-xlarge: E=128, H=2048, L=24, all shared: 60M published."""
    return ModelConfig(
        vocab_size=30000,
        embed_dim=128,
        hidden_dim=2048,
        num_layers=24,
        num_heads=16,
        ffn_dim=8192,
        sharing="all",
        dropout=0.0,
    )


def albert_xxlarge() -> ModelConfig:
    """ALBERT-xxlarge: E=128, H=4096, L=12, 64 heads, all shared: 235M published."""
    return ModelConfig(
        vocab_size=30000,
        embed_dim=128,
        hidden_dim=4096,
        num_layers=12,
        num_heads=64,
        ffn_dim=16384,
        sharing="all",
        dropout=0.0,
    )


def mobilebert() -> ModelConfig:
    """MobileBERT: 24 layers, inter-block 512, intra-block 128, 4 heads, FFN 512 x F=4, NoNorm,
    ReLU, trigram E=128, Q/K from a shared bottleneck and V from the wide input: 25.3M."""
    return ModelConfig(
        vocab_size=30522,
        embed_dim=128,
        hidden_dim=512,
        intra_dim=128,
        num_layers=24,
        num_heads=4,
        ffn_dim=512,
        num_ffn=4,
        norm="no_norm",
        activation="relu",
        embedding="trigram",
        attention_input="shared_qk",
        dropout=0.0,
        mlm_head="mobilebert",
    )


def mobilebert_tiny() -> ModelConfig:
    """MobileBERT-tiny: as MobileBERT with F=2 and Q, K, V from the block's bottleneck: 15.1M."""
    return ModelConfig(
        vocab_size=30522,
        embed_dim=128,
        hidden_dim=512,
        intra_dim=128,
        num_layers=24,
        num_heads=4,
        ffn_dim=512,
        num_ffn=2,
        norm="no_norm",
        activation="relu",
        embedding="trigram",
        attention_input="bottleneck",
        dropout=0.0,
        mlm_head="mobilebert",
    )


def ibbert_large() -> ModelConfig:
    """IB-BERT-large, MobileBERT's teacher: inter-block 512, intra-block 1024 (inverted bottleneck),
    4 heads reading the 512-wide block input, FFN 4096, F=1, GELU, LayerNorm, trigram E=128: 293M."""
    return ModelConfig(
        vocab_size=30522,
        embed_dim=128,
        hidden_dim=512,
        intra_dim=1024,
        num_layers=24,
        num_heads=4,
        ffn_dim=4096,
        num_ffn=1,
        norm="layer_norm",
        activation="gelu",
        embedding="trigram",
        attention_input="hidden",
        mlm_head="mobilebert",
    )


def mobilebert_mini() -> ModelConfig:
    """A CPU-sized MobileBERT for studies: V=8192, H=128, intra 32, L=4, F=2, NoNorm, ReLU, trigram E=32."""
    return ModelConfig(
        vocab_size=8192,
        embed_dim=32,
        hidden_dim=128,
        intra_dim=32,
        num_layers=4,
        num_heads=4,
        ffn_dim=128,
        num_ffn=2,
        norm="no_norm",
        activation="relu",
        embedding="trigram",
        attention_input="shared_qk",
        max_position=128,
        dropout=0.0,
    )


def ibbert_mini() -> ModelConfig:
    """A CPU-sized IB-BERT teacher for ``mobilebert-mini``: same V, E, H, L and heads, intra-block
    256 (inverted bottleneck) with attention on the 128-wide block input, FFN 1024, GELU, LayerNorm."""
    return ModelConfig(
        vocab_size=8192,
        embed_dim=32,
        hidden_dim=128,
        intra_dim=256,
        num_layers=4,
        num_heads=4,
        ffn_dim=1024,
        num_ffn=1,
        norm="layer_norm",
        activation="gelu",
        embedding="trigram",
        attention_input="hidden",
        max_position=128,
        dropout=0.0,
    )


def albert_tiny() -> ModelConfig:
    """A CPU-sized ALBERT (the quickstart's base): V=8192, E=64, H=128, L=4, all shared."""
    return ModelConfig(
        vocab_size=8192,
        embed_dim=64,
        hidden_dim=128,
        num_layers=4,
        num_heads=4,
        ffn_dim=512,
        sharing="all",
        max_position=128,
        dropout=0.0,
    )


def bert_tiny() -> ModelConfig:
    """A CPU-sized BERT: V=8192, H=128, L=4, not shared."""
    return ModelConfig(
        vocab_size=8192,
        embed_dim=128,
        hidden_dim=128,
        num_layers=4,
        num_heads=4,
        ffn_dim=512,
        sharing="none",
        max_position=128,
    )


def albert_small() -> ModelConfig:
    """A laptop-sized ALBERT for benchmarks: V=8192, E=128, H=256, L=4, all shared."""
    return ModelConfig(
        vocab_size=8192,
        embed_dim=128,
        hidden_dim=256,
        num_layers=4,
        num_heads=4,
        ffn_dim=1024,
        sharing="all",
        max_position=512,
        dropout=0.0,
    )


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "bert-base": bert_base,
    "bert-base-uncased": bert_base_uncased,
    "bert-large": bert_large,
    "distilbert": distilbert,
    "albert-base": albert_base,
    "albert-large": albert_large,
    "albert-xlarge": albert_xlarge,
    "albert-xxlarge": albert_xxlarge,
    "mobilebert": mobilebert,
    "mobilebert-tiny": mobilebert_tiny,
    "ibbert-large": ibbert_large,
    "mobilebert-mini": mobilebert_mini,
    "ibbert-mini": ibbert_mini,
    "albert-tiny": albert_tiny,
    "albert-small": albert_small,
    "bert-tiny": bert_tiny,
}


def get_preset(name: str) -> ModelConfig:
    """The preset called ``name``; ConfigError listing the known names otherwise."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"model.preset: unknown preset {name!r}; known: {', '.join(PRESETS)}") from None


def preset_fields(name: object) -> dict[str, object]:
    """The preset's fields as a plain dict, for merging with YAML keys."""
    return to_dict(get_preset(str(name)))
