"""A student with its own, smaller vocabulary, taught through it: Zhao et al.'s (2019) dual training.
:class:`VocabMap` pairs each student token with the teacher's of the same string; :class:`VocabBridge`
has the frozen teacher read a sequence mixing both vocabularies and predict over the student's, all on
the device (docs/guides/distillation.md, "A student with its own vocabulary")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.model.encoder import Trace
from ablate.lightning_modules.model.heads import IGNORE, MLMHead, PretrainingModel, masked_positions, mean_over_valid


def own_vocabulary(student: ModelConfig, teacher: ModelConfig) -> bool:
    """Whether the student has its own vocabulary (smaller than the teacher's); ConfigError
    (``model.vocab_size``) for a larger one: the student's tokens could not all be taught."""
    if student.vocab_size > teacher.vocab_size:
        raise ConfigError(
            f"model.vocab_size: the student's vocabulary ({student.vocab_size}) is larger than the teacher's "
            f"({teacher.vocab_size}); a student with its own vocabulary must have a smaller one, and "
            f"model.vocab_size={teacher.vocab_size} shares the teacher's"
        )
    return student.vocab_size < teacher.vocab_size


@dataclass(frozen=True, eq=False)
class VocabMap:
    """Student token id -> teacher token id, built once from the two tokenizers.

    Attributes:
        teacher_ids: (V_s,) long, the teacher id of each student id; -1 without a counterpart
            (and for rows of the student's embedding beyond its tokenizer's tokens).
        continues: (V_s,) bool, True for a ``##`` continuation piece of the student's tokenizer.
        coverage: the share of the student tokenizer's tokens that have a teacher counterpart.
    """

    teacher_ids: torch.Tensor
    continues: torch.Tensor
    coverage: float

    @classmethod
    def of(cls, teacher_ids: list[int], continues: list[bool], vocab_size: int) -> VocabMap:
        """From :func:`~ablate.datamodules.tokenizer.vocabulary_map` and
        :func:`~ablate.datamodules.tokenizer.continuation_mask` of the student's tokenizer, padded to
        the student's ``model.vocab_size`` rows."""
        if len(teacher_ids) > vocab_size:
            raise ConfigError(
                f"model.vocab_size: the student's tokenizer has {len(teacher_ids)} tokens, more than {vocab_size}"
            )
        assert len(continues) == len(teacher_ids), "both are of the student's tokenizer"
        pad = vocab_size - len(teacher_ids)
        ids = torch.tensor([*teacher_ids, *([-1] * pad)], dtype=torch.long)
        cont = torch.tensor([*continues, *([False] * pad)], dtype=torch.bool)
        coverage = sum(i >= 0 for i in teacher_ids) / max(1, len(teacher_ids))
        return cls(ids, cont, coverage)


class DualOutput(NamedTuple):
    """The teacher's prediction over the student vocabulary: logits (K, V_s) at the K prediction
    slots, the slots that hold a masked position (K,) bool, and the ``dual`` loss ()."""

    logits: torch.Tensor
    valid: torch.Tensor
    loss: torch.Tensor


class VocabBridge(nn.Module):
    """What lets a frozen teacher read and predict a student's vocabulary (Zhao et al.'s dual training).

    Args:
        vocab: the id map of the two vocabularies.
        teacher: the teacher (its word table and MLM head are read, never trained).
        student_embed_dim: E_s, the width of the student's word table.
        mix_prob: the probability that a position with a teacher counterpart is given in the
            student's vocabulary (0: every such position in the teacher's; 1: none).

    Trained: ``linear`` (E_s -> E_t, the bridge) and ``bias`` (V_s,), the output bias over the
    student vocabulary, started from the teacher's bias of each counterpart (0 without one).
    A teacher with MobileBERT's head decodes at H_t > E_t: the extra V x (H_t - E_t) decoder
    columns of each student token are its counterpart's (zero without one), fixed.
    """

    teacher_ids: torch.Tensor  # (V_s,) long buffers, not saved (rebuilt from the tokenizers)
    continues: torch.Tensor
    extra: torch.Tensor | None

    def __init__(self, vocab: VocabMap, teacher: PretrainingModel, student_embed_dim: int, mix_prob: float) -> None:
        super().__init__()
        head = teacher.mlm_head
        known = vocab.teacher_ids >= 0  # (V_s,)
        index = vocab.teacher_ids.clamp_min(0)
        self.mix_prob = mix_prob
        self.coverage = vocab.coverage
        self.linear = nn.Linear(student_embed_dim, teacher.encoder.embeddings.word.embedding_dim)
        nn.init.zeros_(self.linear.bias)
        self.bias = nn.Parameter(torch.where(known, head.bias.detach()[index], 0.0))
        extra = None if head.extra is None else head.extra.detach()[index] * known[:, None]  # (V_s, H_t - E_t)
        self.register_buffer("teacher_ids", vocab.teacher_ids.clone(), persistent=False)
        self.register_buffer("continues", vocab.continues.clone(), persistent=False)
        self.register_buffer("extra", extra, persistent=False)

    def mappable(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) -> (B, T) bool: positions the teacher could read in its own vocabulary: the
        token has a counterpart and is a whole word (a word of several student pieces stays in
        the student's vocabulary, as the teacher may split it otherwise)."""
        cont = self.continues[ids]  # (B, T)
        followed = torch.cat([cont[:, 1:], torch.zeros_like(cont[:, :1])], dim=1)  # the next piece continues
        return (self.teacher_ids[ids] >= 0) & ~(cont | followed)

    def teacher_side(self, ids: torch.Tensor, mix: bool = True) -> torch.Tensor:
        """ids (B, T) -> (B, T) bool: the positions given to the teacher in its own vocabulary, each
        mappable one with probability ``1 - mix_prob`` (a draw of the global RNG, on the device);
        every mappable one unless ``mix``."""
        if not mix:
            return self.mappable(ids)
        draw = torch.rand(ids.shape, device=ids.device) >= self.mix_prob
        return self.mappable(ids) & draw

    def words(
        self, ids: torch.Tensor, table: torch.Tensor, teacher_word: torch.Tensor, mix: bool = True
    ) -> torch.Tensor:
        """The mixed sequence's word vectors (B, T, E_t): the teacher's row of the counterpart on
        :meth:`teacher_side`, the bridged student row (``table``: (V_s, E_t)) elsewhere."""
        theirs = F.embedding(self.teacher_ids[ids].clamp_min(0), teacher_word)  # (B, T, E_t)
        mine = F.embedding(ids, table)  # (B, T, E_t)
        return torch.where(self.teacher_side(ids, mix)[..., None], theirs, mine)

    def logits(self, head: MLMHead, hidden: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """The teacher's MLM over the student vocabulary: hidden (K, H_t) -> (K, V_s), its head's
        transform, then the bridged student table (V_s, E_t) as output embedding."""
        decoder = table if self.extra is None else torch.cat([table, self.extra], dim=1)  # (V_s, D_t)
        return F.linear(head.transformed(hidden), decoder, self.bias)

    def teach(
        self,
        teacher: PretrainingModel,
        student_word: torch.Tensor,
        batch: dict[str, torch.Tensor],
        trace: Trace | None,
        predict: bool,
        dual: bool,
    ) -> DualOutput | None:
        """The teacher on the mixed sequence of ``batch`` (the student's ids, (B, T)), recording
        ``trace`` (detached: the transfer terms read it as targets); with ``predict``, its MLM over
        the student vocabulary at the student's prediction slots and the ``dual`` loss.

        ``student_word``: the student's word table (V_s, E_s). ``dual``: the dual loss trains; run
        under ``torch.no_grad`` otherwise. Without it nothing trains the bridge, and the teacher
        reads every mappable position in its own vocabulary (the bridge only where it must: the
        transfer stages of ``joint`` and ``progressive``, or ``dual_weight`` 0)."""
        ids = batch["input_ids"]
        table = self.linear(student_word)  # (V_s, E_t)
        words = self.words(ids, table, teacher.encoder.embeddings.word.weight, mix=dual)  # (B, T, E_t)
        inputs = ids, batch.get("token_type_ids"), batch.get("attention_mask")
        if not predict:
            teacher.encoder(*inputs, trace=trace, words=words)
            if trace is not None:
                trace.detach()
            return None
        labels = batch["mlm_labels"]  # (B, T) student ids, -100 where not selected
        positions = masked_positions(labels, teacher.mask_prob)  # (K,)
        targets = labels.flatten()[positions]  # (K,)
        if trace is None:  # only the prediction slots go through the last layer's FFN
            masked = teacher.encoder(*inputs, rows=positions, words=words)  # (K, H_t)
        else:
            masked = teacher.encoder(*inputs, trace, words=words).flatten(0, 1)[positions]  # (K, H_t)
            trace.detach()
        logits = self.logits(teacher.mlm_head, masked, table)  # (K, V_s)
        per_slot = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="none")  # (K,)
        valid = targets != IGNORE
        return DualOutput(logits, valid, mean_over_valid(per_slot, valid))
