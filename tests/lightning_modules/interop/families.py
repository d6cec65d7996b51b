"""Small models of each family the interop tests convert (ours, in the transformers families' wirings),
and a perturbation that makes a swapped norm or bias show."""

from __future__ import annotations

import torch

from ablate.lightning_modules.config.model import ModelConfig

V = 1000
TOL = 1e-4
BASE = dict(vocab_size=V, num_layers=2, num_heads=4, ffn_dim=128, dropout=0.0, max_position=64)

OURS = {
    "bert": ModelConfig(**BASE, embed_dim=64, hidden_dim=64),
    "albert-all": ModelConfig(**BASE, embed_dim=32, hidden_dim=64, sharing="all", activation="relu"),
    "albert-none": ModelConfig(**BASE, embed_dim=32, hidden_dim=96, sharing="none"),
    "mobilebert-shared_qk": ModelConfig(
        **BASE,
        embed_dim=32,
        hidden_dim=64,
        intra_dim=32,
        num_ffn=3,
        embedding="trigram",
        attention_input="shared_qk",
        norm="no_norm",
        activation="relu",
        mlm_head="mobilebert",
    ),
    "mobilebert-bottleneck": ModelConfig(
        **BASE,
        embed_dim=32,
        hidden_dim=64,
        intra_dim=32,
        num_ffn=2,
        embedding="trigram",
        attention_input="bottleneck",
        norm="layer_norm",
        norm_eps=1e-5,
        mlm_head="mobilebert",
    ),
    "mobilebert-hidden": ModelConfig(
        **{**BASE, "num_layers": 3},
        embed_dim=32,
        hidden_dim=64,
        intra_dim=64,
        num_ffn=2,
        embedding="trigram",
        attention_input="hidden",
        norm="layer_norm",
        norm_eps=1e-5,
        mlm_head="mobilebert",
    ),
}


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int = 1) -> None:
    """Norm gains/biases and all biases away from their 1/0 defaults, so that a swapped one shows."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.ndim == 1:
            p.add_(0.1 * torch.randn(p.shape, generator=g))
