"""The ``distill`` section of the config: learning from a frozen teacher (inert unless
``distill.teacher`` names one), in pre-training (regime ``distill``) and in fine-tuning (task
distillation). Its losses are loss terms of the one training step
(``ablate.lightning_modules.methods.terms``); its strategies are schedules of stages
(docs/guides/distillation.md)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal, NamedTuple

from pydantic import Field
from pydantic.dataclasses import dataclass

from ablate.lightning_modules.config.errors import STRICT, FieldError

_Weight = Annotated[float, Field(ge=0.0)]

Strategy = Literal["auxiliary", "joint", "progressive"]
Placement = Literal["layers", "embedding", "last"]
TRANSFER: dict[str, Placement] = {"fmt": "layers", "at": "layers", "embed": "embedding", "cos": "last"}
"""The intermediate (layer-wise) terms, each weighted by ``distill.<name>_weight``, and where the
progressive strategy counts it: on each layer's stage, with the embeddings (the first layer's stage),
or on the last layer's stage. How each is computed: ``ablate.lightning_modules.methods.terms``."""
PD = "pd"
"""The prediction layer's entry in a stage's losses: the data's own terms (MLM + sentence, or the
task's labels), KD on the logits and the dual term."""


@dataclass(frozen=True, config=STRICT)
class DistillConfig:
    """Source, losses and strategy of a distillation run.

    Attributes:
        teacher: the frozen teacher: ``runs:/RUN_ID`` (an ablate run in this run's MLflow
            store), an ``ablate export`` folder or a transformers checkpoint folder. None:
            no distillation. In a fine-tuning run: a fine-tuned classifier (a fine-tuning
            run's ``runs:/RUN_ID`` or an exported classifier) with the task's labels.
        strategy: ``auxiliary`` (AKT: every loss at once, one stage), ``joint`` (JKT:
            feature-map and attention transfer on all layers for ``stage_steps``, then PD)
            or ``progressive`` (PKT: layer l alone for ``stage_steps`` with the layers below
            frozen, for each layer, then PD).
        fmt_weight: feature-map transfer, MSE between block outputs.
        at_weight: attention transfer (``at_loss`` says how).
        at_loss: ``kl`` (MobileBERT: KL between per-head attention distributions) or ``mse``
            (TinyBERT: mean squared error between the raw attention scores).
        embed_weight: embedding transfer, MSE between embedding outputs.
        cos_weight: DistilBERT's cosine loss: 1 - cos between the last student layer's hidden
            states and those of its teacher layer (through the projection where widths differ).
        mlm_weight: the MLM loss inside PD (pre-training).
        label_weight: the cross-entropy on the task's labels inside the prediction stage
            (fine-tuning: the hard-label weight beside ``kd_weight``).
        kd_weight: the KD loss inside PD (KL between the temperature-softened teacher and
            student distributions: the MLM's at the masked positions in pre-training, the task's
            logits in fine-tuning). The sentence loss keeps ``objective.sentence_weight``.
        temperature: KD temperature.
        layer_map: for each student layer, the teacher layer it learns from; None = spread
            evenly, the last student layer on the last teacher layer.
        init_layers: start the student's layers from teacher layers (DistilBERT): ``none``,
            ``every_other`` (student layer i from teacher layer 2i: 0, 2, 4, ...) or
            ``layer_map`` (from ``layer_map``'s layers). Every tensor of a layer must have the
            teacher layer's shape; the first that does not is named in the error.
        init_embeddings: copy the teacher's embedding into the student before training:
            ``word`` (the V x E word embedding), ``all`` (every part the student has and
            whose shape matches; parts the student drops, such as positions or the
            embedding norm, stay dropped) or ``none``.
        stage_steps: steps of each transfer stage of ``joint`` and ``progressive``.
        projection: how the student's hidden states (every layer's, the embedding output's)
            reach the teacher's width when H differs: ``per_layer`` (one learned H_s -> H_t
            Linear per layer and one for the embedding; TinyBERT's W_h) or ``shared`` (one
            Linear for all of them, Zhao et al.'s shared projection).
        mix_prob: a student with its own, smaller vocabulary (Zhao et al.'s dual training): the
            probability that a position the teacher could read in its own vocabulary is given
            to it in the student's instead. None: 0.5 for such a student; it must stay None
            when the vocabularies are the same.
        dual_weight: that student's ``dual`` term: the teacher's MLM over the student
            vocabulary on the mixed sequence (gradients reach the student's word embedding
            through the frozen teacher). None: 1.0 for such a student; None otherwise.
    """

    teacher: str | None = None
    strategy: Strategy = "auxiliary"
    fmt_weight: _Weight = 1.0
    at_weight: _Weight = 1.0
    at_loss: Literal["kl", "mse"] = "kl"
    embed_weight: _Weight = 0.0
    cos_weight: _Weight = 0.0
    mlm_weight: _Weight = 1.0
    label_weight: _Weight = 1.0
    kd_weight: _Weight = 1.0
    temperature: Annotated[float, Field(gt=0.0)] = 1.0
    layer_map: tuple[Annotated[int, Field(ge=0)], ...] | None = None
    init_layers: Literal["none", "every_other", "layer_map"] = "none"
    init_embeddings: Literal["none", "word", "all"] = "none"
    stage_steps: Annotated[int, Field(gt=0)] = 100
    projection: Literal["per_layer", "shared"] = "per_layer"
    mix_prob: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    dual_weight: _Weight | None = None

    @property
    def transfer_weights(self) -> dict[str, float]:
        """The layer-wise transfer losses that are on, by name."""
        weights: dict[str, float] = {k: getattr(self, f"{k}_weight") for k in TRANSFER}
        return {k: w for k, w in weights.items() if w > 0}


MIX_PROB, DUAL_WEIGHT = 0.5, 1.0  # a student with its own vocabulary: Zhao et al. mix words at random


def with_vocabularies(d: DistillConfig, own_vocabulary: bool) -> DistillConfig:
    """``d`` with ``mix_prob`` and ``dual_weight`` resolved once the teacher is known: their
    defaults for a student with its own vocabulary (``own_vocabulary``), None otherwise.

    Raises FieldError (the field and the message) when one is set for a student sharing the teacher's vocabulary.
    """
    if own_vocabulary:
        mix = MIX_PROB if d.mix_prob is None else d.mix_prob
        dual = DUAL_WEIGHT if d.dual_weight is None else d.dual_weight
        return dataclasses.replace(d, mix_prob=mix, dual_weight=dual)
    field = "mix_prob" if d.mix_prob is not None else "dual_weight" if d.dual_weight is not None else None
    if field is not None:
        raise FieldError(
            f"{field}",
            "only for a student with its own, smaller vocabulary (dual training); this student's "
            "model.vocab_size is the teacher's",
        )
    return d


class Stage(NamedTuple):
    """One stage of a strategy: steps [start, end), the losses on, and what trains.

    ``layers`` are the student layers whose transfer losses count (None = all);
    ``trainable`` the student layers whose weights train (None = the whole student);
    ``embeddings`` whether the student's embeddings train (and the embedding loss counts);
    ``extra`` names further parts of the model that train (``exits``: FastBERT's stage, in
    which nothing else does).
    """

    name: str
    start: int
    end: int
    losses: tuple[str, ...]
    layers: tuple[int, ...] | None = None
    trainable: tuple[int, ...] | None = None
    embeddings: bool = True
    extra: tuple[str, ...] = ()


def schedule(
    cfg: DistillConfig, num_layers: int, max_steps: int, steps_field: str = "trainer.max_steps"
) -> list[Stage]:
    """The stages of ``cfg.strategy`` for a student of ``num_layers`` layers trained ``max_steps``
    steps (``steps_field`` names them in errors: ``finetune.max_steps`` for task distillation).

    Raises FieldError (the field and the message) when the stages leave no PD steps or have no loss.
    """
    transfer = tuple(cfg.transfer_weights)
    if cfg.strategy == "auxiliary":
        return [Stage("auxiliary", 0, max_steps, (*transfer, PD))]
    if not transfer:
        raise FieldError(
            "strategy", f"{cfg.strategy!r} has transfer stages but fmt_weight, at_weight and embed_weight are all 0"
        )
    s = cfg.stage_steps
    if cfg.strategy == "joint":
        stages = [Stage("transfer", 0, s, transfer, trainable=None)]
    else:
        placed = {p: tuple(k for k in transfer if TRANSFER[k] == p) for p in ("layers", "embedding", "last")}
        stages = [
            Stage(
                f"layer {l}",
                l * s,
                (l + 1) * s,
                (*placed["layers"], *(placed["embedding"] if l == 0 else ())),
                layers=(l,),
                trainable=(l,),
                embeddings=l == 0,
            )
            for l in range(num_layers)
        ]
        if placed["last"]:  # on the last layer: counted with it
            last = stages[-1]
            stages[-1] = last._replace(losses=(*last.losses, *placed["last"]))
    empty = next((st for st in stages if not st.losses), None)
    if empty is not None:
        raise FieldError(
            "strategy", f"stage {empty.name!r} of {cfg.strategy!r} has no loss: set fmt_weight or at_weight"
        )
    pd_start = stages[-1].end
    if pd_start >= max_steps:
        raise FieldError(
            "stage_steps",
            f"{len(stages)} transfer stage(s) x {s} steps = {pd_start} leave no PD "
            f"stage within {steps_field} {max_steps}",
        )
    return [*stages, Stage("pd", pd_start, max_steps, (PD,))]
