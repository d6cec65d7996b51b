"""schuBERT's pruning, a step at a time between the fits of the run's phases (:mod:`~ablate.sweeps.engine.prune`):
:class:`Pruning` trains gates, zeroes the smallest, shrinks the model for real (a new :class:`Pruned`) and re-trains
it, round by round, or cuts a baseline (``uniform``, ``fewer-layers``) to the target at once; docs/guides/pruning.md."""

from __future__ import annotations

import dataclasses

import pandas as pd
from rich.console import Console

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.methods.pretrain import PretrainModule
from ablate.lightning_modules.methods.prune import PruneModule
from ablate.lightning_modules.methods.pruning.budget import (
    backbone_params,
    choose,
    fewer_layers,
    magnitude_keep,
    uniform,
)
from ablate.lightning_modules.methods.pruning.keep import VARIANTS
from ablate.lightning_modules.methods.pruning.surgery import first_layers, shrink
from ablate.lightning_modules.model.heads import PretrainingModel

_CONSOLE = Console(stderr=True, highlight=False, soft_wrap=True)


def _with_model(cfg: ExperimentConfig, model_cfg: ModelConfig) -> ExperimentConfig:
    return dataclasses.replace(cfg, model=model_cfg)


def dims_table(cfg: ModelConfig) -> pd.DataFrame:
    """The per-layer dimensions (the paper's table of optimized architectures)."""
    rows = [
        {"layer": i + 1, "heads a": s.num_heads, "qk k": s.qk_dim, "value v": s.v_dim, "ffn f": s.ffn_dim}
        for i, s in enumerate(cfg.layer_specs())
    ]
    frame = pd.DataFrame(rows)
    frame.attrs["hidden h"] = cfg.hidden_dim
    return frame


def dims_markdown(table: pd.DataFrame) -> str:
    """:func:`dims_table` as a Markdown table, under the hidden size."""
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---:|" * len(table.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return f"hidden h = {table.attrs['hidden h']}\n\n" + "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Pruned:
    """A model as pruning has left it so far: the weights and their shape (the source's at first)."""

    model: PretrainingModel
    shape: ModelConfig


@dataclasses.dataclass(frozen=True)
class Pruning:
    """schuBERT's pruning of one model, a step at a time: the engine trains each phase's module (a round's
    gates, the re-training after it) and calls the step that follows its fit, which returns the new
    :class:`Pruned` (the one before is left unchanged: the pruned model is a new module).

    Attributes:
        cfg: the run's config (``prune.*``, and the trainer and optimiser of each phase).
        start: the source's backbone parameters; ``target``: ``prune.target``'s count.
    """

    cfg: ExperimentConfig
    start: int
    target: int

    @classmethod
    def of(cls, cfg: ExperimentConfig, source: ModelConfig) -> Pruning:
        """Pruning a model of shape ``source`` as ``cfg.prune`` says."""
        start = backbone_params(source)
        return cls(cfg, start, cfg.prune.target_params(start))

    @property
    def gated(self) -> bool:
        """Whether the method learns gates (schuBERT) rather than cutting once (the baselines)."""
        return self.cfg.prune.method in VARIANTS

    def gates(self, now: Pruned) -> PruneModule:
        """A round's module: gates on the frozen model ``now``."""
        return PruneModule(_with_model(self.cfg, now.shape), now.model, VARIANTS[self.cfg.prune.method])

    def cut(self, now: Pruned, gate: PruneModule, round_: int) -> Pruned:
        """After round ``round_``'s gates trained: zero the smallest until the round's share is gone and
        remove them for real."""
        p = self.cfg.prune
        plan = round(self.start - (round_ + 1) * (self.start - self.target) / p.rounds)
        keep = choose(
            now.shape,
            {d: [g.detach() for g in v] for d, v in gate.gates.vectors().items()},
            backbone_params(now.shape) - plan,
        )
        gate.gates.zero_except(keep)  # the smallest gates to exactly zero
        shape, model = shrink(gate.release(), now.shape, keep, gate.gates)  # folds the others in
        left = backbone_params(shape)
        short = "" if left <= plan else f"; {p.method} cannot remove more (one unit of each gated dimension stays)"
        _CONSOLE.print(
            f"prune round {round_ + 1}/{p.rounds}: {left / 1e6:.3f}M backbone parameters "
            f"(plan {plan / 1e6:.3f}M, target {self.target / 1e6:.3f}M){short}",
            markup=False,
        )
        return Pruned(model, shape)

    def cut_once(self, now: Pruned) -> Pruned:
        """A baseline's cut to the target at once (``uniform``, ``fewer-layers``)."""
        p = self.cfg.prune
        shapes = {"uniform": uniform, "fewer-layers": fewer_layers}
        new = shapes[p.method](now.shape, self.target)
        model = (
            first_layers(now.model, new, self.cfg.objective)
            if p.method == "fewer-layers"
            else shrink(now.model, now.shape, magnitude_keep(now.model, now.shape, new))[1]
        )
        left = backbone_params(new)
        _CONSOLE.print(
            f"prune {p.method}: {left / 1e6:.3f}M backbone parameters (target {self.target / 1e6:.3f}M)", markup=False
        )
        return Pruned(model, new)

    def retraining(self, now: Pruned) -> PretrainModule:
        """The module that fine-tunes every weight of the model ``now`` with the pre-training loss."""
        return PretrainModule(_with_model(self.cfg, now.shape), now.model)
