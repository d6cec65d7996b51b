"""``PruneModule``: schuBERT's gate phase on a trained encoder: its weights frozen, gates alpha (initialised to 1)
multiplied into them (:mod:`ablate.lightning_modules.methods.pruning.gates`) and trained with the pre-training
loss plus the registry's ``sparsity`` term, ``prune.gamma`` x sum_dim beta_dim ||alpha_dim||_1
(:func:`ablate.lightning_modules.methods.pruning.budget.beta`); docs/guides/pruning.md."""

from __future__ import annotations

import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT

from ablate.lightning_modules.config.distill import Stage
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.methods.pretrain import PretrainModule
from ablate.lightning_modules.methods.pruning.budget import beta
from ablate.lightning_modules.methods.pruning.gates import Gates, attach, detach
from ablate.lightning_modules.methods.task_model import Batch
from ablate.lightning_modules.methods.terms import Need, Provided, Term, TermInputs
from ablate.lightning_modules.model.heads import PretrainingModel


class PruneModule(PretrainModule):
    """Gate training on a frozen encoder.

    Args:
        cfg: the run's config; ``cfg.model`` is the current (possibly already pruned) shape.
        model: the trained model to gate (its weights stay frozen and unchanged).
        dims: the dimensions that get gates (``VARIANTS[prune.method]``).
    """

    loss_name = "gate loss"

    def __init__(self, cfg: ExperimentConfig, model: PretrainingModel, dims: tuple[str, ...]) -> None:
        super().__init__(cfg, model)
        model.requires_grad_(False)
        self.gates = Gates(cfg.model, dims)
        self.beta = beta(cfg.model)
        attach(model, self.gates)

    def provides(self) -> Provided:
        """The gates, beside what pre-training provides."""
        base = super().provides()
        return base._replace(have=base.have | {Need.GATES})

    def term_inputs(self, batch: Batch, stage: Stage, on: tuple[Term, ...]) -> TermInputs:
        """The gates and their weights beta beside what pre-training's terms read."""
        return super().term_inputs(batch, stage, on)._replace(gates=self.gates, beta=self.beta)

    def release(self) -> PretrainingModel:
        """Take the gates out of the model again (its weights as they were)."""
        model: PretrainingModel = self.model
        detach(model)
        return model

    def trainable_modules(self) -> torch.nn.Module:
        return self.gates

    def on_train_batch_end(self, outputs: STEP_OUTPUT, batch: object, batch_idx: int) -> None:
        with torch.no_grad():  # gates stay in [0, inf): a negative gate is as good as its magnitude
            for p in self.gates.parameters():
                p.clamp_(min=0.0)

    def optimizer_and_schedule(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR | None]:
        """Adam over the gates at ``prune.gate_lr``, constant."""
        return torch.optim.Adam(self.gates.parameters(), lr=self.cfg.prune.gate_lr), None
