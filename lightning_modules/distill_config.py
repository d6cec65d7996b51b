"""The ``distill`` section of the config: MobileBERT-style knowledge distillation.

A run distils when ``distill.teacher`` names a teacher; otherwise the section is inert.
The losses (each with its own weight, 0 = off) and strategies are described in
:mod:`lightning_modules.distill`.
"""

from __future__ import annotations

from typing import Annotated, Literal, NamedTuple

from pydantic import Field
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.errors import STRICT

_Weight = Annotated[float, Field(ge=0.0)]

Strategy = Literal["auxiliary", "joint", "progressive"]
TRANSFER = ("fmt", "at", "embed")  # the layer-wise transfer losses; "pd" is the pre-training distillation


@dataclass(frozen=True, config=STRICT)
class DistillConfig:
    """Source, losses and strategy of a distillation run.

    Attributes:
        teacher: the frozen teacher: ``runs:/RUN_ID`` (an ablate run in this run's MLflow
            store), an ``ablate export`` folder or a transformers checkpoint folder. None:
            no distillation (plain pre-training).
        strategy: ``auxiliary`` (AKT: every loss at once, one stage), ``joint`` (JKT:
            feature-map and attention transfer on all layers for ``stage_steps``, then PD)
            or ``progressive`` (PKT: layer l alone for ``stage_steps`` with the layers below
            frozen, for each layer, then PD).
        fmt_weight: feature-map transfer, MSE between block outputs.
        at_weight: attention transfer, KL between per-head attention distributions.
        embed_weight: embedding transfer, MSE between embedding outputs.
        mlm_weight: the MLM loss inside PD.
        kd_weight: the KD loss inside PD (KL between temperature-softened MLM distributions
            at the masked positions). The sentence loss keeps ``objective.sentence_weight``.
        temperature: KD temperature.
        layer_map: for each student layer, the teacher layer it learns from; None = spread
            evenly, the last student layer on the last teacher layer.
        init_embeddings: copy the teacher's embedding into the student before training:
            ``word`` (the V x E word embedding), ``all`` (every part the student has and
            whose shape matches; parts the student drops, such as positions or the
            embedding norm, stay dropped) or ``none``.
        stage_steps: steps of each transfer stage of ``joint`` and ``progressive``.
    """

    teacher: str | None = None
    strategy: Strategy = "auxiliary"
    fmt_weight: _Weight = 1.0
    at_weight: _Weight = 1.0
    embed_weight: _Weight = 0.0
    mlm_weight: _Weight = 1.0
    kd_weight: _Weight = 1.0
    temperature: Annotated[float, Field(gt=0.0)] = 1.0
    layer_map: tuple[Annotated[int, Field(ge=0)], ...] | None = None
    init_embeddings: Literal["none", "word", "all"] = "none"
    stage_steps: Annotated[int, Field(gt=0)] = 100

    @property
    def transfer_weights(self) -> dict[str, float]:
        """The layer-wise transfer losses that are on, by name."""
        weights = {"fmt": self.fmt_weight, "at": self.at_weight, "embed": self.embed_weight}
        return {k: w for k, w in weights.items() if w > 0}


class Stage(NamedTuple):
    """One stage of a strategy: steps [start, end), the losses on, and what trains.

    ``layers`` are the student layers whose transfer losses count (None = all);
    ``trainable`` the student layers whose weights train (None = the whole student);
    ``embeddings`` whether the student's embeddings train (and the embedding loss counts).
    """

    name: str
    start: int
    end: int
    losses: tuple[str, ...]
    layers: tuple[int, ...] | None = None
    trainable: tuple[int, ...] | None = None
    embeddings: bool = True


def schedule(cfg: DistillConfig, num_layers: int, max_steps: int) -> list[Stage]:
    """The stages of ``cfg.strategy`` for a student of ``num_layers`` layers.

    Raises ValueError (``field: message``) when the stages leave no PD steps or have no loss.
    """
    transfer = tuple(cfg.transfer_weights)
    if cfg.strategy == "auxiliary":
        return [Stage("auxiliary", 0, max_steps, (*transfer, "pd"))]
    if not transfer:
        raise ValueError(
            f"strategy: {cfg.strategy!r} has transfer stages but fmt_weight, at_weight and embed_weight are all 0"
        )
    s = cfg.stage_steps
    if cfg.strategy == "joint":
        stages = [Stage("transfer", 0, s, transfer, trainable=None)]
    else:
        layer_losses = tuple(k for k in transfer if k != "embed")
        embed = ("embed",) if "embed" in transfer else ()
        stages = [
            Stage(
                f"layer {l}",
                l * s,
                (l + 1) * s,
                (*layer_losses, *(embed if l == 0 else ())),
                layers=(l,),
                trainable=(l,),
                embeddings=l == 0,
            )
            for l in range(num_layers)
        ]
    empty = next((st for st in stages if not st.losses), None)
    if empty is not None:
        raise ValueError(f"strategy: stage {empty.name!r} of {cfg.strategy!r} has no loss: set fmt_weight or at_weight")
    pd_start = stages[-1].end
    if pd_start >= max_steps:
        raise ValueError(
            f"stage_steps: {len(stages)} transfer stage(s) x {s} steps = {pd_start} leave no PD "
            f"stage within trainer.max_steps {max_steps}"
        )
    return [*stages, Stage("pd", pd_start, max_steps, ("pd",))]
