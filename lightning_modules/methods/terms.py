"""The registry of loss terms, :data:`TERMS`: every term the one training step
(:class:`~ablate.lightning_modules.methods.train_module.TrainModule`) can sum, each declared once as a
:class:`Term` (its name, weight field, what it needs of the run, how it is computed from :class:`TermInputs`);
:func:`select` keeps the terms a module's run can compute. Adding a term: docs/development.md ("Layout")."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Literal, NamedTuple

import torch

from ablate.lightning_modules.config.distill import PD
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.methods.distill import TeacherLink
from ablate.lightning_modules.methods.losses import (
    attention_loss,
    attention_mse_loss,
    cosine_loss,
    feature_map_loss,
    kd_loss,
)
from ablate.lightning_modules.methods.pruning.gates import Gates
from ablate.lightning_modules.methods.task_model import Batch, TaskModel
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.early_exit import exit_logits, self_distillation_loss
from ablate.lightning_modules.model.encoder import Trace


class TaskOutput(NamedTuple):
    """A task's forward as the terms read it: the logits KD compares, the rows where they are valid
    (None = every row), the task's own loss (MLM, or the labels'), the sentence loss (a pre-training
    model with a sentence task)."""

    logits: torch.Tensor
    valid: torch.Tensor | None
    loss: torch.Tensor
    sentence: torch.Tensor | None = None


class TermInputs(NamedTuple):
    """What a term is computed from, as the step ran it for the stage's terms."""

    batch: Batch
    model: TaskModel  # the student
    student: TaskOutput | None = None  # its task forward (a term that needs PREDICTION)
    teacher: TaskOutput | None = None  # the teacher's, or its prediction over a student's own vocabulary
    link: TeacherLink | None = None
    student_trace: Trace | None = None  # hidden states (and attention scores) on ``layers``
    teacher_trace: Trace | None = None
    layers: tuple[int, ...] = ()  # the student layers whose transfer terms count
    gates: Gates | None = None  # schuBERT's gates and their weights beta
    beta: Mapping[str, float] | None = None


class Need(Enum):
    """What a term needs of its run: what it is, and the config field that provides it.

    An *inert* need switches a term off in a run without it (the section it belongs to is inert
    there; the config refuses setting a teacher's weights without a teacher, ``distill.*``). A run
    without any other need refuses a term weighted above 0 (:func:`select`)."""

    TEACHER = ("a frozen teacher", "distill.teacher", True)
    MLM = ("the masked LM (a pre-training model)", "regime", True)
    SENTENCE = ("a sentence task", "objective.sentence", True)
    LABELS = ("a task's labels (a fine-tuning run)", "finetune.source", True)
    VOCABULARY = ("a student with its own, smaller vocabulary", "model.vocab_size", True)
    EXITS = ("FastBERT's exits", "finetune.exits", True)
    GATES = ("schuBERT's gates (a pruning run)", "prune.source", True)
    PREDICTION = ("the task's forward (its logits and own losses)", "regime", False)
    DISTRIBUTIONS = ("logits that are distributions (classes, masked tokens, span positions)", "finetune.kind", False)
    HIDDEN = ("every layer's hidden states, the student's and the teacher's", "distill.layer_map", False)
    ATTENTION = ("attention scores of heads that map onto each other", "model.num_heads", False)
    EMBEDDING = ("the embedding outputs, the student's and the teacher's", "model.embedding", False)

    def __init__(self, what: str, key: str, inert: bool) -> None:
        self.what, self.key, self.inert = what, key, inert


@dataclass(frozen=True)
class Term:
    """One loss term.

    Attributes:
        name: logged as ``train/<name>_loss`` on log steps.
        weight: the config's dotted field that weighs it (None: 1).
        needs: what it needs of the run.
        stage: the entry of a stage's losses that turns it on (``pd``: the prediction layer; a
            transfer term's or ``exit``'s own name); None: every stage.
        compute: the term, unweighted, from what the step ran.
        gated: in the run only while its weight is above 0 (False: computed and logged whatever
            its weight: the data's own terms).
    """

    name: str
    weight: str | None
    needs: frozenset[Need]
    stage: str | None
    compute: Callable[[TermInputs], torch.Tensor]
    gated: bool = True


def _link(x: TermInputs) -> tuple[TeacherLink, Trace, Trace]:
    assert x.link is not None and x.student_trace is not None and x.teacher_trace is not None
    return x.link, x.student_trace, x.teacher_trace


def fmt(x: TermInputs) -> torch.Tensor:
    """Feature-map transfer: the mean over ``layers`` of the MSE between student layer i's output
    (projected to the teacher's width) and teacher layer ``layer_map[i]``'s."""
    link, s, t = _link(x)
    mask, lm = x.batch["attention_mask"], link.layer_map
    per_layer = [feature_map_loss(link.projected(s.hidden[i], i), t.hidden[lm[i]], mask) for i in x.layers]
    return torch.stack(per_layer).mean()


AT_LOSSES: Mapping[Literal["kl", "mse"], Callable[..., torch.Tensor]] = {
    "kl": attention_loss,  # MobileBERT: KL between per-head attention distributions
    "mse": attention_mse_loss,  # TinyBERT: MSE between the raw scores
}
"""Attention transfer by ``distill.at_loss``."""


def at(x: TermInputs) -> torch.Tensor:
    """Attention transfer over ``layers``, the teacher's heads grouped or shared by the link's head maps."""
    link, s, t = _link(x)
    loss, mask, lm = AT_LOSSES[link.at_mode], x.batch["attention_mask"], link.layer_map
    return torch.stack([loss(s.scores[i], t.scores[lm[i]], link.head_maps[i], mask) for i in x.layers]).mean()


def embed(x: TermInputs) -> torch.Tensor:
    """The MSE between the embedding outputs (the student's projected)."""
    link, s, t = _link(x)
    assert s.embedding is not None and t.embedding is not None
    return feature_map_loss(link.projected(s.embedding, -1), t.embedding, x.batch["attention_mask"])


def cos(x: TermInputs) -> torch.Tensor:
    """DistilBERT's 1 - cos between the last student layer's hidden states and its teacher layer's."""
    link, s, t = _link(x)
    last = len(link.layer_map) - 1
    return cosine_loss(link.projected(s.hidden[last], last), t.hidden[link.layer_map[last]], x.batch["attention_mask"])


def _student(x: TermInputs) -> TaskOutput:
    assert x.student is not None
    return x.student


def task_loss(x: TermInputs) -> torch.Tensor:
    """The task's own loss of the student's forward: MLM, or the labels'."""
    return _student(x).loss


def sentence(x: TermInputs) -> torch.Tensor:
    """The sentence task's loss (SOP or NSP)."""
    loss = _student(x).sentence
    assert loss is not None
    return loss


def dual(x: TermInputs) -> torch.Tensor:
    """Zhao et al.'s dual training: the teacher's MLM over the student's vocabulary on the mixed sequence."""
    assert x.teacher is not None
    return x.teacher.loss


def kd(x: TermInputs) -> torch.Tensor:
    """KL(teacher || student) of the temperature-softened logits at the valid rows, times T^2."""
    s, link = _student(x), x.link
    assert x.teacher is not None and link is not None
    return kd_loss(s.logits, x.teacher.logits.detach(), link.temperature, s.valid)


def exit_term(x: TermInputs) -> torch.Tensor:
    """FastBERT's self-distillation: the exits learn the final classifier's distribution."""
    assert isinstance(x.model, Classifier)
    *exits, final = exit_logits(x.model, x.batch)
    return self_distillation_loss(exits, final.detach())


def sparsity(x: TermInputs) -> torch.Tensor:
    """schuBERT's sum over the gated dimensions of beta_dim * ||alpha_dim||_1."""
    gates, beta = x.gates, x.beta
    assert gates is not None and beta is not None
    penalty = sum(beta[d] * gates.l1(d) for d in gates.dims)
    assert isinstance(penalty, torch.Tensor), "the gates gate at least one dimension (a VARIANTS entry)"
    return penalty


TERMS: tuple[Term, ...] = (
    Term("fmt", "distill.fmt_weight", frozenset({Need.TEACHER, Need.HIDDEN}), "fmt", fmt),
    Term("at", "distill.at_weight", frozenset({Need.TEACHER, Need.ATTENTION}), "at", at),
    Term("embed", "distill.embed_weight", frozenset({Need.TEACHER, Need.EMBEDDING}), "embed", embed),
    Term("cos", "distill.cos_weight", frozenset({Need.TEACHER, Need.HIDDEN}), "cos", cos),
    Term("mlm", "distill.mlm_weight", frozenset({Need.MLM, Need.PREDICTION}), PD, task_loss, gated=False),
    Term(
        "sentence", "objective.sentence_weight", frozenset({Need.SENTENCE, Need.PREDICTION}), PD, sentence, gated=False
    ),
    Term("label", "distill.label_weight", frozenset({Need.LABELS, Need.PREDICTION}), PD, task_loss, gated=False),
    Term(
        "dual", "distill.dual_weight", frozenset({Need.TEACHER, Need.VOCABULARY, Need.MLM, Need.PREDICTION}), PD, dual
    ),
    Term("kd", "distill.kd_weight", frozenset({Need.TEACHER, Need.PREDICTION, Need.DISTRIBUTIONS}), PD, kd),
    Term("exit", None, frozenset({Need.EXITS}), "exit", exit_term, gated=False),
    Term("sparsity", "prune.gamma", frozenset({Need.GATES}), None, sparsity, gated=False),
)
"""Every loss term, in the order the step sums them."""
REGISTRY: Mapping[str, Term] = {term.name: term for term in TERMS}
"""The terms by name."""
EXIT = REGISTRY["exit"]
TRACED = frozenset({Need.HIDDEN, Need.ATTENTION, Need.EMBEDDING})
"""The needs a trace of student and teacher records."""


class Provided(NamedTuple):
    """What a run provides its terms, and why it lacks what it lacks (for the refusal's message)."""

    have: frozenset[Need]
    why_not: Mapping[Need, str] = {}


class Selected(NamedTuple):
    """A run's terms (those that count, in :data:`TERMS`' order) and the weights of every term it
    can compute, by name (those weighted 0 included)."""

    terms: tuple[Term, ...]
    weights: dict[str, float]


def weight_of(term: Term, cfg: ExperimentConfig) -> float:
    """``term``'s weight in ``cfg`` (1 without a weight field; an unset one, None, is 0)."""
    if term.weight is None:
        return 1.0
    section, _, name = term.weight.partition(".")
    value = getattr(getattr(cfg, section), name)
    return 0.0 if value is None else float(value)


def missing(term: Term, provided: Provided) -> list[Need]:
    """What ``term`` needs and the run lacks, in :class:`Need`'s order."""
    return [need for need in Need if need in term.needs and need not in provided.have]


def refusal(term: Term, lacking: Iterable[Need], provided: Provided) -> ConfigError:
    """The error that refuses ``term`` for the first need it lacks, naming its weight field (or,
    for a term without one, the field that provides the need)."""
    need = next(iter(lacking))
    why = provided.why_not.get(need)
    because = f", but {why}" if why else f" ({need.key})"
    advice = ": set it to 0" if term.weight is not None else ""
    return ConfigError(f"{term.weight or need.key}: the {term.name} term needs {need.what}{because}{advice}")


def choose(term: Term, cfg: ExperimentConfig, provided: Provided) -> tuple[float, bool] | None:
    """``term`` in a run of ``cfg`` that ``provided`` what it provides: None when the term is not
    part of the run (it lacks an inert need), else its weight and whether it counts (weighted above
    0, or not gated). ConfigError (naming the weight field) when it counts but lacks another need."""
    lacking = missing(term, provided)
    if any(need.inert for need in lacking):
        return None
    weight = weight_of(term, cfg)
    counts = weight > 0 or not term.gated
    if lacking and counts:
        raise refusal(term, lacking, provided)
    return weight, counts and not lacking


def select(cfg: ExperimentConfig, provided: Provided) -> Selected:
    """The terms a run of ``cfg`` computes, given what it ``provided`` (:func:`choose` for each)."""
    terms: list[Term] = []
    weights: dict[str, float] = {}
    for term in TERMS:
        chosen = choose(term, cfg, provided)
        if chosen is not None:
            weights[term.name] = chosen[0]
            if chosen[1]:
                terms.append(term)
    return Selected(tuple(terms), weights)


def require(term: Term, selected: Selected, provided: Provided) -> None:
    """Refuse (ConfigError) a phase that needs ``term`` in a run without it (FastBERT's exits)."""
    if term not in selected.terms:
        raise refusal(term, missing(term, provided) or list(term.needs), provided)


def stage_terms(terms: tuple[Term, ...], losses: tuple[str, ...]) -> tuple[Term, ...]:
    """The terms a stage whose losses are ``losses`` turns on."""
    return tuple(term for term in terms if term.stage is None or term.stage in losses)
