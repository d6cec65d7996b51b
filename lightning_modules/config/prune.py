"""The ``prune`` section of the config: schuBERT's search for per-layer dimensions.

A run prunes when ``prune.source`` names a trained model; otherwise the section is inert.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT

Method = Literal["schubert-h", "schubert-f", "schubert-a", "schubert-all", "uniform", "fewer-layers"]


@dataclass(frozen=True, config=STRICT)
class PruneConfig:
    """Source, method and schedule of a pruning run.

    Attributes:
        source: the trained model to prune: ``runs:/RUN_ID`` (an ablate run of this MLflow
            store), an ``ablate export`` folder or a transformers checkpoint. None: no pruning.
        method: ``schubert-*`` learn gates on the hidden size (h), FFN (f), heads (a) or all
            of h, a, k, v, f, and remove the smallest; the baselines ``uniform`` (every
            dimension shrunk by one factor) and ``fewer-layers`` (L reduced) reach the same
            size at once, keeping the largest-norm units (the first layers).
        target: eta, the backbone parameters to reach: a count (> 1) or a fraction of the
            source's backbone (<= 1).
        rounds: T, rounds of gate training, removal and fine-tuning (schuBERT methods).
        gate_steps: R, gate-training steps per round (encoder weights frozen).
        finetune_steps: F, steps of pre-training loss on all weights after each removal
            (the baselines fine-tune ``rounds * finetune_steps`` once, the same budget).
        gamma: weight of the sparsity term gamma * sum_dim beta_dim * ||alpha_dim||_1.
        gate_lr: learning rate of the gates.
    """

    source: str | None = None
    method: Method = "schubert-all"
    target: Annotated[float, Field(gt=0.0)] = 0.5
    rounds: Annotated[int, Field(gt=0)] = 3
    gate_steps: Annotated[int, Field(gt=0)] = 100
    finetune_steps: Annotated[int, Field(ge=0)] = 100
    gamma: Annotated[float, Field(ge=0.0)] = 1e-3
    gate_lr: Annotated[float, Field(gt=0.0)] = 1e-2

    def target_params(self, source_params: int) -> int:
        """eta as a parameter count."""
        return round(self.target * source_params) if self.target <= 1 else int(self.target)
