"""Which compression techniques a run applies, read from its config: the columns of the field's standard
overview table (pruning, low-rank factorization, knowledge distillation, parameter sharing, quantization), each
in pre-training, in fine-tuning, or both. The rules: docs/guides/finetuning.md ("Chained studies")."""

from __future__ import annotations

from collections.abc import Iterable

from ablate.lightning_modules.config.experiment import ExperimentConfig

TECHNIQUES = ("pruning", "factorization", "distillation", "sharing", "quantization")
"""The overview's techniques, in its column order."""
PARAM = "technique."
"""Prefix of the trial params that record them (``technique.pruning``, ...)."""
PRE, FINE, BOTH, NONE = "pre-training", "fine-tuning", "both", "-"


def applied(cfg: ExperimentConfig) -> frozenset[str]:
    """The techniques one run's config applies itself (see the module docstring)."""
    out: set[str] = set()
    if cfg.distill.teacher is not None:
        out.add("distillation")
    if cfg.quant.enabled:
        out.add("quantization")
    if cfg.regime == "finetune":
        if cfg.finetune.exits:  # FastBERT's exits learn from the final classifier
            out.add("distillation")
        return frozenset(out)
    m = cfg.model
    bottleneck = m.intra_dim is not None and m.intra_dim < m.hidden_dim
    if m.embed_dim < m.hidden_dim or m.embedding == "trigram" or bottleneck:
        out.add("factorization")
    if m.sharing != "none":
        out.add("sharing")
    if cfg.regime == "prune":
        out.add("pruning")
    return frozenset(out)


def stages_of(pretrain: ExperimentConfig, finetunes: Iterable[ExperimentConfig]) -> dict[str, str]:
    """For a chained trial, each technique's stage: ``pre-training``, ``fine-tuning``, ``both`` or
    ``-``, keyed ``technique.<name>`` (the trial's params)."""
    pre = applied(pretrain)
    fine = frozenset().union(*(applied(c) for c in finetunes))
    table = {(True, False): PRE, (False, True): FINE, (True, True): BOTH, (False, False): NONE}
    return {f"{PARAM}{name}": table[name in pre, name in fine] for name in TECHNIQUES}
