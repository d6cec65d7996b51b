"""The registry of loss terms: each term's weight field, its needs checked (a term whose needs the run
lacks is off, or refused naming its field), and the terms each method's module reads from it."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from ablate.lightning_modules.config import metric_names
from ablate.lightning_modules.config.distill import PD, TRANSFER
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import ExperimentConfig, flatten
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.methods.finetune import FinetuneModule, task_distill_module
from ablate.lightning_modules.methods.pretrain import PretrainModule, distill_module
from ablate.lightning_modules.methods.prune import PruneModule
from ablate.lightning_modules.methods.pruning.keep import VARIANTS
from ablate.lightning_modules.methods.terms import (
    REGISTRY,
    TERMS,
    Need,
    Provided,
    choose,
    select,
    stage_terms,
    weight_of,
)
from ablate.lightning_modules.model.classifier import build_classifier
from ablate.lightning_modules.model.heads import build_pretraining_model

MODEL = {"preset": "bert-tiny", "vocab_size": 200, "max_position": 32, "num_layers": 2}
DATA = {"max_length": 32}
EVERYTHING = Provided(frozenset(Need))


def _distill_cfg(**distill: object) -> ExperimentConfig:
    """A distillation whose every term is weighted above 0."""
    over = {"distill.teacher": "runs:/t", "distill.embed_weight": 1.0, "distill.cos_weight": 1.0}
    over |= {"distill.dual_weight": 1.0, **{f"distill.{k}": v for k, v in distill.items()}}
    return build_config({"model": MODEL, "objective": {"sentence": "sop"}, "data": DATA}, over)


def _ft_cfg(**over: object) -> ExperimentConfig:
    ft = {"source": "runs:/s", "task": "t", "train": "a.tsv", "validation": "b.tsv", "max_steps": 4}
    return build_config(
        {"model": MODEL, "objective": {"sentence": "sop"}, "data": DATA},
        {f"finetune.{k}": v for k, v in ft.items()} | over,
    )


def test_each_term_is_declared_once_with_a_config_weight_field_and_a_registered_metric_name():
    fields = set(flatten(ExperimentConfig()))  # the dotted names: MLflow params, Optuna params, report columns
    assert len(REGISTRY) == len(TERMS)
    for term in TERMS:
        assert term.weight is None or term.weight in fields, term.name
        assert term.needs, term.name
        metric_names.check_name(f"train/{term.name}_loss")  # what the step logs per term
    # the transfer terms are the schedule's (config.distill.TRANSFER), each on its own stage entry
    transfer = [t for t in TERMS if t.stage in TRANSFER]
    assert [t.name for t in transfer] == list(TRANSFER)
    assert all(t.stage == t.name and t.weight == f"distill.{t.name}_weight" for t in transfer)
    assert all(Need.TEACHER in t.needs for t in transfer)
    assert {t.name for t in TERMS if t.stage == PD} == {"mlm", "sentence", "label", "dual", "kd"}


def test_the_weights_are_the_configs_fields():
    cfg = _distill_cfg(kd_weight=0.25, fmt_weight=0.5, mlm_weight=2.0)
    weights = {t.name: weight_of(t, cfg) for t in TERMS}
    assert weights["kd"] == 0.25 and weights["fmt"] == 0.5 and weights["mlm"] == 2.0
    assert weights["exit"] == 1.0 and weights["sparsity"] == cfg.prune.gamma
    assert weight_of(REGISTRY["dual"], build_config({"model": MODEL})) == 0.0  # unset (None) is 0


@pytest.mark.parametrize("name", [t.name for t in TERMS])
def test_each_need_of_each_term_is_checked(name: str):
    """Without any one of its needs a term is off (an inert need: its section does not apply) or,
    weighted above 0, refused with a ConfigError naming its weight field."""
    term, cfg = REGISTRY[name], _distill_cfg()
    assert choose(term, cfg, EVERYTHING) == (weight_of(term, cfg), True)
    for need in term.needs:
        lacking = Provided(EVERYTHING.have - {need}, {need: "the run says why"})
        if need.inert:
            assert choose(term, cfg, lacking) is None, need
            continue
        message = f"{term.weight or need.key}: the {name} term needs {need.what}, but the run says why"
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
            choose(term, cfg, lacking)
        if not term.gated:  # the data's own terms count whatever their weight
            continue
        assert term.weight is not None
        section, field = term.weight.split(".")
        off = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{field: 0.0})})
        assert choose(term, off, lacking) == (0.0, False)  # weighted 0: not refused, not counted


def test_select_keeps_the_registrys_order_and_every_computable_weight():
    cfg = _distill_cfg(kd_weight=0.0)
    have = EVERYTHING.have - {Need.VOCABULARY, Need.EXITS, Need.GATES, Need.LABELS}
    chosen = select(cfg, Provided(have))
    assert [t.name for t in chosen.terms] == ["fmt", "at", "embed", "cos", "mlm", "sentence"]
    assert chosen.weights["kd"] == 0.0 and "label" not in chosen.weights and "dual" not in chosen.weights
    on = stage_terms(chosen.terms, ("fmt", "at"))
    assert [t.name for t in on] == ["fmt", "at"]


def test_a_kd_term_without_a_teacher_is_refused_naming_its_field():
    with pytest.raises(ConfigError, match=r"distill\.kd_weight"):
        build_config({"model": MODEL}, {"distill.kd_weight": 0.5})
    # its default weight without a teacher: the term is not part of the run
    module = PretrainModule(build_config({"model": MODEL, "objective": {"sentence": "sop"}, "data": DATA}))
    assert [t.name for t in module.terms] == ["mlm", "sentence"]
    assert "kd" not in module.weights


def test_each_method_reads_its_terms_from_the_registry():
    teacher_cfg = build_config({"model": MODEL, "objective": {"sentence": "sop"}, "data": DATA})
    torch.manual_seed(0)
    teacher = build_pretraining_model(teacher_cfg.model, teacher_cfg.objective)
    distilled = distill_module(_distill_cfg(dual_weight=None), teacher, teacher_cfg.model)
    assert [t.name for t in distilled.terms] == ["fmt", "at", "embed", "cos", "mlm", "sentence", "kd"]
    assert "dual" not in distilled.weights  # the teacher's vocabulary: dual training does not apply
    cfg = build_config(
        {"model": MODEL, "objective": {"sentence": "none"}}, {"prune.source": "runs:/s", "prune.gamma": 0.02}
    )
    pruned = PruneModule(cfg, build_pretraining_model(cfg.model, cfg.objective), VARIANTS["schubert-h"])
    assert [t.name for t in pruned.terms] == ["mlm", "sparsity"] and pruned.weights["sparsity"] == 0.02
    fastbert = FinetuneModule(_ft_cfg(**{"finetune.exits": True, "finetune.exit_steps": 2}), teacher)
    assert [t.name for t in fastbert.terms] == ["label", "exit"]
    assert [t.name for t in stage_terms(fastbert.terms, fastbert.stages[0].losses)] == ["label"]
    fastbert.self_distillation()
    assert list(fastbert.losses(_batch(), fastbert.stages[0])) == ["exit"]


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (4, 10), generator=g)
    mask = torch.ones_like(ids).bool()
    return {
        "input_ids": ids,
        "token_type_ids": torch.zeros_like(ids),
        "attention_mask": mask,
        "labels": torch.arange(4) % 2,
    }


def test_fastberts_phase_without_exits_is_refused_naming_the_field():
    cfg = _ft_cfg()
    module = FinetuneModule(cfg, build_pretraining_model(cfg.model, cfg.objective))
    assert "exit" not in module.weights
    with pytest.raises(ConfigError, match=r"^finetune\.exits: the exit term needs FastBERT's exits"):
        module.self_distillation()


def test_kd_on_a_regression_is_refused_naming_its_weight_and_runs_at_weight_0():
    over = {"finetune.kind": "regression", "finetune.num_labels": 1, "finetune.metric": "pearson"}
    cfg = _ft_cfg(**over, **{"distill.teacher": "runs:/t"})
    pretrained = build_pretraining_model(cfg.model, cfg.objective)
    teacher = build_classifier(pretrained, 1, 0.0, 0.02)
    with pytest.raises(ConfigError, match=r"^distill\.kd_weight: the kd term needs .*regression.*: set it to 0"):
        task_distill_module(cfg, pretrained, teacher, cfg.model)
    cfg = _ft_cfg(**over, **{"distill.teacher": "runs:/t", "distill.kd_weight": 0.0})
    module = task_distill_module(cfg, pretrained, teacher, cfg.model)
    assert [t.name for t in module.terms] == ["fmt", "at", "label"]


def test_attention_transfer_between_heads_that_do_not_pair_is_refused_and_off_at_weight_0():
    teacher_cfg = build_config({"model": {**MODEL, "num_heads": 4}, "objective": {"sentence": "sop"}})
    teacher = build_pretraining_model(teacher_cfg.model, teacher_cfg.objective)
    student = {**MODEL, "num_heads": 3, "hidden_dim": 48, "embed_dim": 48}
    raw = {"model": student, "objective": {"sentence": "sop"}, "data": DATA}
    with pytest.raises(ConfigError, match=r"^distill\.at_weight: the at term needs .*3 heads, the teacher 4"):
        distill_module(build_config(raw, {"distill.teacher": "runs:/t"}), teacher, teacher_cfg.model)
    module = distill_module(
        build_config(raw, {"distill.teacher": "runs:/t", "distill.at_weight": 0.0}), teacher, teacher_cfg.model
    )
    assert [t.name for t in module.terms] == ["fmt", "mlm", "sentence", "kd"]
