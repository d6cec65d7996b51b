"""Which units of each prunable dimension survive: the common currency of gates, surgery and budgets.

Dimensions (schuBERT's names): ``h`` the hidden size (one set, shared by the embedding and
every layer), and per layer i ``heads`` (a_i), ``qk`` (query/key width per head, k_i,
shared by the layer's heads), ``v`` (value width per head, v_i) and ``ffn`` (f_i).
"""

from __future__ import annotations

import dataclasses

import torch

from ablate.lightning_modules.config.model import LayerSpec, ModelConfig

DIMS = ("h", "heads", "qk", "v", "ffn")
LAYER_DIMS = ("heads", "qk", "v", "ffn")
# the paper's variants: which dimensions get gates
VARIANTS: dict[str, tuple[str, ...]] = {
    "schubert-h": ("h",),
    "schubert-f": ("ffn",),
    "schubert-a": ("heads",),
    "schubert-all": DIMS,
}


@dataclasses.dataclass(frozen=True)
class Keep:
    """Sorted indices (1-d long tensors) of the units kept: ``h`` once, the others per layer."""

    h: torch.Tensor
    heads: tuple[torch.Tensor, ...]
    qk: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    ffn: tuple[torch.Tensor, ...]

    @classmethod
    def everything(cls, cfg: ModelConfig) -> Keep:
        """Keep every unit of ``cfg``'s model."""
        specs = cfg.layer_specs()
        return cls(
            h=torch.arange(cfg.hidden_dim),
            heads=tuple(torch.arange(s.num_heads) for s in specs),
            qk=tuple(torch.arange(s.qk_dim) for s in specs),
            v=tuple(torch.arange(s.v_dim) for s in specs),
            ffn=tuple(torch.arange(s.ffn_dim) for s in specs),
        )

    def config(self, cfg: ModelConfig) -> ModelConfig:
        """``cfg`` shrunk to the kept units: per-layer ``model.layers``, H (and E when E = H)."""
        layers = tuple(
            LayerSpec(num_heads=len(a), qk_dim=len(k), v_dim=len(v), ffn_dim=len(f))
            for a, k, v, f in zip(self.heads, self.qk, self.v, self.ffn, strict=False)
        )
        H = len(self.h)
        E = H if cfg.embed_dim == cfg.hidden_dim else cfg.embed_dim
        return dataclasses.replace(cfg, hidden_dim=H, embed_dim=E, layers=layers)  # validated again
