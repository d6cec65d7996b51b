"""``PretrainModule``: the pre-training task (MLM + SOP/NSP) of any encoder the config describes,
trained by the one step of :class:`~ablate.lightning_modules.methods.train_module.TrainModule`: alone, or
distilled from a teacher (``distill.teacher``: MobileBERT, DistilBERT, TinyBERT's general
distillation; Zhao et al.'s student with its own vocabulary) when given a
:class:`~ablate.lightning_modules.methods.distill.TeacherLink`."""

from __future__ import annotations

from dataclasses import replace

import torch
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity

from ablate.lightning_modules.config import metric_names as names
from ablate.lightning_modules.config.distill import PD, Stage, schedule, with_vocabularies
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.methods.distill import TeacherLink, copy_embeddings, copy_layers, init_layer_map
from ablate.lightning_modules.methods.task_model import Batch, TaskModel
from ablate.lightning_modules.methods.terms import Need, Provided, TaskOutput
from ablate.lightning_modules.methods.train_module import OptimSetup, TrainModule
from ablate.lightning_modules.model.encoder import Trace
from ablate.lightning_modules.model.heads import IGNORE, PretrainingModel, PretrainOutput, build_pretraining_model
from ablate.lightning_modules.model.vocab_bridge import VocabMap, own_vocabulary


class PretrainModule(TrainModule):
    """Pre-training: the architecture and loss combination come from the config (the terms: MLM,
    the sentence loss with a sentence task, and with a teacher KD, the transfer terms and ``dual``;
    :mod:`~ablate.lightning_modules.methods.terms`).

    Args:
        cfg: the resolved experiment config.
        model: an already built model to train (built from ``cfg`` when None).
        link: the frozen teacher a distillation learns from (None: plain pre-training).
    """

    model: PretrainingModel

    def __init__(
        self, cfg: ExperimentConfig, model: PretrainingModel | None = None, link: TeacherLink | None = None
    ) -> None:
        model = model if model is not None else build_pretraining_model(cfg.model, cfg.objective)
        steps = cfg.trainer.max_steps
        stages = (
            schedule(cfg.distill, cfg.model.num_layers, steps)
            if link is not None
            else [Stage("train", 0, steps, (PD,))]
        )
        super().__init__(cfg, model, link, stages, OptimSetup.pretraining(cfg, steps))
        if link is not None:
            assert isinstance(link.teacher, PretrainingModel), "pre-training distils from a pre-trained model"
            link.teacher.mask_prob = model.mask_prob  # the teacher predicts at the student's slots (KD pairs them)
        if cfg.trainer.compile:  # the layer block, once per shape (tests/lightning_modules/methods/test_compile.py)
            self.model.encoder.compile_layers(cfg.trainer.compile_mode)
        V = cfg.model.vocab_size
        self.val_loss = MeanMetric()
        self.val_mlm_loss = MeanMetric()
        self.val_mlm_acc = MulticlassAccuracy(num_classes=V, average="micro", ignore_index=IGNORE)
        self.val_mlm_ppl = Perplexity(ignore_index=IGNORE)
        self.val_sentence_acc = MulticlassAccuracy(num_classes=2, average="micro", ignore_index=-100)
        self.copied: list[str] = []  # what distill_module copies from the teacher (init_embeddings, init_layers)

    def forward(self, batch: Batch) -> PretrainOutput:
        out: PretrainOutput = self.model(batch)
        return out

    def provides(self) -> Provided:
        """The masked LM (and a sentence task where the model has its head), beside a teacher's."""
        base = super().provides()
        task = {Need.MLM, Need.DISTRIBUTIONS} | ({Need.SENTENCE} if self.model.sentence_head is not None else set())
        return base._replace(have=base.have | task)

    def task_output(self, model: TaskModel, batch: Batch, trace: Trace | None) -> TaskOutput:
        """MLM (+ sentence) losses; the MLM logits at the prediction slots for KD."""
        out = model(batch, trace)
        assert isinstance(out, PretrainOutput), "a pre-training model (or teacher) gives a PretrainOutput"
        return TaskOutput(out.mlm_logits, out.mlm_valid, out.mlm_loss, out.sentence_loss)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self.new_step()
        # eager: compiled layers would compile (and capture CUDA graphs) again for evaluation, seconds
        # per run for a few validation batches that run in milliseconds eager
        with torch.compiler.set_stance("force_eager"):
            out = self.model(batch)
        self.val_loss.update(out.loss.detach(), weight=batch["input_ids"].shape[0])
        self.val_mlm_loss.update(out.mlm_loss.detach(), weight=out.mlm_valid.sum().float())
        self.val_mlm_acc.update(out.mlm_logits, out.mlm_targets)  # padding slots (-100) are ignored
        self.val_mlm_ppl.update(out.mlm_logits.float()[None], out.mlm_targets[None])  # (1, K, V)
        if out.sentence_logits is not None:
            self.val_sentence_acc.update(out.sentence_logits, batch["sentence_label"])

    def on_validation_epoch_end(self) -> None:
        metrics = {
            names.VAL_LOSS: self.val_loss,
            names.VAL_MLM_LOSS: self.val_mlm_loss,
            names.VAL_MLM_ACC: self.val_mlm_acc,
            names.VAL_MLM_PPL: self.val_mlm_ppl,
        }
        if self.model.sentence_head is not None:
            metrics[names.VAL_SENTENCE_ACC] = self.val_sentence_acc
        for name, metric in metrics.items():
            if metric.update_count:
                self.log(name, metric.compute(), prog_bar=name in (names.VAL_LOSS, names.VAL_MLM_ACC), sync_dist=True)
            metric.reset()


def distill_module(
    cfg: ExperimentConfig,
    teacher: PretrainingModel,
    teacher_cfg: ModelConfig,
    model: PretrainingModel | None = None,
    vocab: VocabMap | None = None,
) -> PretrainModule:
    """Pre-training distilled from ``teacher`` as ``cfg.distill`` says: the student starts from the
    teacher's embeddings and layers where asked (``init_embeddings``, ``init_layers``). A student
    whose ``model.vocab_size`` is smaller than the teacher's has its own vocabulary and learns by
    Zhao et al.'s dual training through ``vocab`` (its ids mapped to the teacher's). The module's
    ``cfg`` has ``distill.mix_prob`` and ``distill.dual_weight`` resolved (what the run logs).

    ConfigError (naming the field) when the teacher cannot teach this student: a larger vocabulary,
    a smaller one without its map or with the word embedding copied, ``mix_prob`` or ``dual_weight``
    set for the teacher's vocabulary, fewer positions than ``data.max_length``, a layer or head map
    that does not fit, shapes that cannot be copied."""
    student_cfg = cfg.model
    own = own_vocabulary(student_cfg, teacher_cfg)
    try:
        d = with_vocabularies(cfg.distill, own)
    except ValueError as exc:
        raise ConfigError(f"distill.{exc}") from None
    cfg = replace(cfg, distill=d)
    if own and d.init_embeddings != "none":
        raise ConfigError(
            f"distill.init_embeddings: {d.init_embeddings!r} copies the teacher's word embedding, but the "
            f"student's vocabulary ({student_cfg.vocab_size} tokens) is not the teacher's ({teacher_cfg.vocab_size})"
        )
    if own and vocab is None:
        raise ConfigError(
            f"distill.teacher: the student has its own vocabulary (model.vocab_size {student_cfg.vocab_size}, the "
            f"teacher's {teacher_cfg.vocab_size}), mapped to the teacher's by token text: the teacher must come with "
            f"its tokenizer (a runs:/ teacher, or a folder with its tokenizer.json)"
        )
    if teacher_cfg.position == "learned" and teacher_cfg.max_position < cfg.data.max_length:
        raise ConfigError(
            f"distill.teacher: the teacher has {teacher_cfg.max_position} positions (its model.max_position), "
            f"fewer than data.max_length {cfg.data.max_length}"
        )
    model = model if model is not None else build_pretraining_model(cfg.model, cfg.objective)
    link = TeacherLink(d, teacher, teacher_cfg, student_cfg, vocab=vocab if own else None)
    module = PretrainModule(cfg, model, link)
    chosen = init_layer_map(d.init_layers, student_cfg.num_layers, teacher_cfg.num_layers, link.layer_map)
    module.copied = [
        *copy_embeddings(model.encoder.embeddings, teacher.encoder.embeddings, d.init_embeddings),
        *copy_layers(model.encoder, teacher.encoder, chosen),
    ]
    return module
