"""``DistillModule``: a trainable student distilled from a frozen teacher, as MobileBERT does.

Losses (each weighted by ``distill.*_weight``, 0 = off):

- FMT, feature-map transfer: MSE between student block i's output and teacher block
  ``layer_map[i]``'s, through a learned linear projection when the widths differ;
- AT, attention transfer: KL between teacher and student per-head attention distributions
  (teacher heads grouped or shared by :func:`~lightning_modules.losses.head_map`);
- embedding transfer: MSE between the embedding outputs;
- PD, pre-training distillation: MLM + sentence loss on the data + KD, the KL between the
  temperature-softened teacher and student MLM distributions at the masked positions.

A strategy is a list of :class:`~lightning_modules.distill_config.Stage` (auxiliary: one
stage with everything; joint: transfer on all layers, then PD; progressive: one layer at a
time with the layers below frozen, then PD). The teacher, the student and the losses stay
apart: the teacher is an injected frozen model, the student a ``PretrainingModel``, the
losses pure functions in :mod:`lightning_modules.losses`.
"""

from __future__ import annotations

import torch
from lightning.pytorch.loggers import MLFlowLogger
from torch import nn

from ablate.lightning_modules.components.embeddings import Embeddings
from ablate.lightning_modules.config import ExperimentConfig, ModelConfig
from ablate.lightning_modules.distill_config import Stage, schedule
from ablate.lightning_modules.encoder import Trace
from ablate.lightning_modules.errors import ConfigError
from ablate.lightning_modules.heads import PretrainingModel
from ablate.lightning_modules.losses import attention_loss, feature_map_loss, head_map, kd_loss, layer_map
from ablate.lightning_modules.pretrain import PretrainModule


def copy_embeddings(student: Embeddings, teacher: Embeddings, mode: str) -> list[str]:
    """Copy the teacher's embedding weights into the student's; return the names copied.

    ``word``: the word embedding only (its V x E shape must match). ``all``: every tensor the
    student has whose name and shape match the teacher's; parts the student dropped
    (positions, token types, the norm) stay dropped.
    """
    if mode == "none":
        return []
    mine, theirs = student.state_dict(), teacher.state_dict()
    if mine["word.weight"].shape != theirs["word.weight"].shape:
        raise ConfigError(
            f"distill.init_embeddings: the student's word embedding is {tuple(mine['word.weight'].shape)}"
            f" but the teacher's is {tuple(theirs['word.weight'].shape)} (set model.embed_dim)"
        )
    names = ["word.weight"] if mode == "word" else [n for n in mine if n in theirs and theirs[n].shape == mine[n].shape]
    with torch.no_grad():
        for name in names:
            mine[name].copy_(theirs[name])
    return names


class DistillModule(PretrainModule):
    """Distillation regime: the student trains, the teacher only answers.

    Args:
        cfg: the student's resolved config (``distill`` says how to distil).
        teacher: the teacher model; frozen here (eval mode, no gradients).
        teacher_cfg: the teacher's architecture.
        model: an already built student (built from ``cfg`` when None).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        teacher: PretrainingModel,
        teacher_cfg: ModelConfig,
        model: PretrainingModel | None = None,
    ) -> None:
        super().__init__(cfg, model)
        d, student_cfg = cfg.distill, cfg.model
        if teacher_cfg.vocab_size != student_cfg.vocab_size:
            raise ConfigError(
                f"distill.teacher: the teacher's vocabulary has {teacher_cfg.vocab_size} tokens, the "
                f"student's model.vocab_size is {student_cfg.vocab_size}"
            )
        if teacher_cfg.position == "learned" and teacher_cfg.max_position < cfg.data.max_length:
            raise ConfigError(
                f"distill.teacher: the teacher has {teacher_cfg.max_position} positions (its model.max_position), "
                f"fewer than data.max_length {cfg.data.max_length}"
            )
        self.teacher = teacher.eval().requires_grad_(False)
        self.teacher.mask_prob = self.model.mask_prob  # the teacher predicts at the student's slots (KD pairs them)
        self.stages = schedule(d, student_cfg.num_layers, cfg.trainer.max_steps)
        self.layer_map = (
            list(d.layer_map) if d.layer_map is not None else layer_map(student_cfg.num_layers, teacher_cfg.num_layers)
        )
        if max(self.layer_map) >= teacher_cfg.num_layers:
            raise ConfigError(
                f"distill.layer_map: teacher layer {max(self.layer_map)} does not exist (the teacher "
                f"has {teacher_cfg.num_layers} layers)"
            )
        s_specs, t_specs = student_cfg.layer_specs(), teacher_cfg.layer_specs()
        try:
            self.head_maps = [
                head_map(s_specs[i].num_heads, t_specs[j].num_heads) for i, j in enumerate(self.layer_map)
            ]
        except ValueError as exc:
            if d.at_weight > 0:
                raise ConfigError(f"distill.at_weight: {exc}") from None
            self.head_maps = []
        Hs, Ht = student_cfg.hidden_dim, teacher_cfg.hidden_dim
        # FMT/embedding projections student H -> teacher H: one per layer, then one for the embedding
        self.project = nn.ModuleList(nn.Linear(Hs, Ht) for _ in range(student_cfg.num_layers + 1)) if Hs != Ht else None
        self.copied = copy_embeddings(self.model.encoder.embeddings, teacher.encoder.embeddings, d.init_embeddings)
        self._stage: Stage | None = None

    # -- the teacher stays frozen ------------------------------------------------------
    def train(self, mode: bool = True) -> DistillModule:
        super().train(mode)
        self.teacher.eval()  # Lightning puts the whole module in train mode; the teacher's dropout stays off
        return self

    def trainable_modules(self) -> nn.Module:
        return nn.ModuleList([self.model, *([self.project] if self.project is not None else [])])

    # -- stages --------------------------------------------------------------------------
    def describe_step(self, step: int) -> str:
        """What the NaN guard adds to its message: the stage at ``step``."""
        return f"stage {self.stage_at(step).name}"

    def stage_at(self, step: int) -> Stage:
        """The stage that covers optimizer step ``step``."""
        return next((s for s in self.stages if s.start <= step < s.end), self.stages[-1])

    def _enter(self, stage: Stage) -> None:
        """Freeze everything of the student that ``stage`` does not train."""
        student = self.model
        student.requires_grad_(stage.trainable is None)
        if stage.trainable is not None:
            for i in stage.trainable:
                for module in student.encoder.layer_modules(i):
                    module.requires_grad_(True)
        student.encoder.embeddings.requires_grad_(stage.embeddings)
        self._stage = stage
        if isinstance(self.logger, MLFlowLogger):  # the boundary, at its exact step
            self.logger.log_metrics({"distill/stage": float(self.stages.index(stage))}, step=self.global_step)

    def on_fit_start(self) -> None:
        if isinstance(self.logger, MLFlowLogger):  # the stage boundaries, readable in the run's tags
            text = "; ".join(f"{s.name} [{s.start}, {s.end}): {'+'.join(s.losses)}" for s in self.stages)
            self.logger.experiment.set_tag(self.logger.run_id, "ablate.stages", text)

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        stage = self.stage_at(self.global_step)
        if stage is not self._stage:
            self._enter(stage)

    # -- losses ----------------------------------------------------------------------------
    def _project(self, x: torch.Tensor, index: int) -> torch.Tensor:
        return x if self.project is None else self.project[index](x)

    def distill_losses(self, batch: dict[str, torch.Tensor], stage: Stage) -> dict[str, torch.Tensor]:
        """Every loss ``stage`` turns on, unweighted, by name (``fmt``, ``at``, ``embed``, ``mlm``,
        ``sentence``, ``kd``)."""
        layers = stage.layers if stage.layers is not None else tuple(range(len(self.layer_map)))
        pd, want_at = "pd" in stage.losses, "at" in stage.losses
        s_trace = Trace(attention=frozenset(layers) if want_at else frozenset(), until=None if pd else max(layers))
        t_trace = Trace(
            attention=frozenset(self.layer_map[i] for i in layers) if want_at else frozenset(),
            until=None if pd else self.layer_map[max(layers)],
        )
        mask = batch["attention_mask"]  # (B, T)
        inputs = (batch["input_ids"], batch.get("token_type_ids"), mask)
        with torch.no_grad():
            teacher_out = self.teacher(batch, t_trace) if pd else self.teacher.encoder(*inputs, trace=t_trace)
        out = self.model(batch, s_trace) if pd else self.model.encoder(*inputs, trace=s_trace)
        losses: dict[str, torch.Tensor] = {}
        if "fmt" in stage.losses:
            losses["fmt"] = torch.stack(
                [
                    feature_map_loss(self._project(s_trace.hidden[i], i), t_trace.hidden[self.layer_map[i]], mask)
                    for i in layers
                ]
            ).mean()
        if want_at:
            losses["at"] = torch.stack(
                [
                    attention_loss(s_trace.scores[i], t_trace.scores[self.layer_map[i]], self.head_maps[i], mask)
                    for i in layers
                ]
            ).mean()
        if "embed" in stage.losses:
            losses["embed"] = feature_map_loss(self._project(s_trace.embedding, -1), t_trace.embedding, mask)
        if pd:
            losses["mlm"] = out.mlm_loss
            losses["kd"] = kd_loss(out.mlm_logits, teacher_out.mlm_logits, self.cfg.distill.temperature, out.mlm_valid)
            if out.sentence_loss is not None:
                losses["sentence"] = out.sentence_loss
        return losses

    def weighted(self, losses: dict[str, torch.Tensor]) -> torch.Tensor:
        """The total loss: each loss times its ``distill.*_weight`` (sentence: ``objective.sentence_weight``)."""
        d = self.cfg.distill
        weights = {
            "fmt": d.fmt_weight,
            "at": d.at_weight,
            "embed": d.embed_weight,
            "mlm": d.mlm_weight,
            "kd": d.kd_weight,
            "sentence": self.cfg.objective.sentence_weight,
        }
        return sum(weights[k] * v for k, v in losses.items())

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        stage = self._stage or self.stage_at(self.global_step)
        losses = self.distill_losses(batch, stage)
        loss = self.weighted(losses)
        bs = batch["input_ids"].shape[0]
        self.log("train/loss", loss, batch_size=bs)
        self.log("train/tokens", batch["attention_mask"].sum().float(), reduce_fx="sum", batch_size=bs)
        if self.logger is not None and self.global_step % self.cfg.trainer.log_every == 0:
            # straight to the logger: a loss that is off in this stage must not repeat its last value
            self.logger.log_metrics({f"train/{k}_loss": v.item() for k, v in losses.items()}, step=self.global_step)
        return loss
