"""A study's teacher: the spec's ``teacher`` section, the teacher's and the students' configs,
and end to end a teacher trained once for the study and reused when the study runs again."""

from __future__ import annotations

import hashlib

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.experiment import to_yaml
from ablate.sweeps.base import StudyBase
from ablate.sweeps.spec import StudySpec, corner_configs, load_study, study_model_config, trial_config
from ablate.sweeps.study_models import PLACEHOLDER_SOURCE
from tests.sweeps.conftest import tiny_base, write_study

# a tiny BERT teacher as wide as the tiny ALBERT students, on their tokenizer (V=1000)
TEACHER_MODEL = {
    "preset": "bert-tiny",
    "vocab_size": 1000,
    "embed_dim": 32,
    "hidden_dim": 32,
    "num_layers": 2,
    "num_heads": 2,
    "ffn_dim": 64,
    "max_position": 64,
}
FAST = {"measure": False}


def _study(tmp_path, corpus, name: str = "distilled", teacher: dict | None = None, **extra):
    """A study file of two tiny students (sharing all / none) distilling from ``teacher``."""
    path = write_study(tmp_path, corpus, name=name, trainer=FAST, **extra)
    raw = yaml.safe_load(path.read_text())
    raw["base"]["data"]["max_length"] = 32
    if teacher is not None:
        raw["teacher"] = teacher
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture()
def tiny_corpus(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here. Another one there.\n\nA second document. With two sentences.\n")
    return corpus


@pytest.mark.parametrize(
    ("teacher", "extra", "needle"),
    [
        ({}, {}, "teacher.source: give exactly one of teacher.source"),
        ({"source": "runs:/abc", "model": TEACHER_MODEL}, {}, "teacher.source: give exactly one of teacher.source"),
        (
            {"model": TEACHER_MODEL, "overrides": {"trainer.colour": 1}},
            {},
            "teacher.overrides.trainer.colour: not a config field",
        ),
        (
            {"model": TEACHER_MODEL, "overrides": {"distill.teacher": "runs:/x"}},
            {},
            "teacher.overrides.distill.teacher: the study's teacher is pre-trained from scratch",
        ),
        ({"model": {**TEACHER_MODEL, "num_heads": 7}}, {}, "teacher.model.num_heads: hidden_dim 32 is not divisible"),
        ({"model": {"preset": "no-such-preset"}}, {}, "teacher.model.preset: unknown preset"),
        ({"model": TEACHER_MODEL, "overrides": {"trainer.max_steps": 0}}, {}, "teacher.trainer.max_steps:"),
        # a teacher with a smaller vocabulary than its students cannot teach them (a smaller student may)
        (
            {"model": {**TEACHER_MODEL, "vocab_size": 500}},
            {},
            "teacher.model.vocab_size: 500 differs from the trials' 1000",
        ),
        (
            {"source": "runs:/abc", "overrides": {"optim.lr": 0.1}},
            {},
            "teacher.overrides: only for a model the study trains (teacher.model)",
        ),
        (
            {"source": "runs:/abc"},
            {"search": {"distill.teacher": {"choices": ["a", "b"]}}},
            "search.distill.teacher: set by the study's teacher section",
        ),
        # the students' distill section is validated against their max_steps (6) before anything runs
        (
            {"model": TEACHER_MODEL},
            {"overrides": {"distill.strategy": "joint", "distill.stage_steps": 10}},
            "distill.stage_steps: 1 transfer stage(s) x 10 steps = 10 leave no PD stage within trainer.max_steps 6",
        ),
        (
            {"source": "runs:/abc"},
            {"overrides": {"distill.strategy": "progressive"}},
            "distill.strategy: 'progressive' freezes layers one at a time and needs model.sharing 'none', not 'all'",
        ),
    ],
)
def test_bad_teachers_fail_before_anything_runs(tmp_path, tiny_corpus, capsys, teacher, extra, needle):
    path = _study(tmp_path, tiny_corpus, teacher=teacher, **extra)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and needle in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # no MLflow or Optuna store was created


def test_missing_teacher_folder_fails_before_anything_runs(tmp_path, tiny_corpus, capsys):
    path = _study(tmp_path, tiny_corpus, teacher={"source": str(tmp_path / "no-teacher")})
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: teacher.source: ") and "no-teacher: neither runs:/RUN_ID nor an existing folder" in err
    )
    assert not (tmp_path / "runs").exists()


def test_teacher_run_must_exist_in_the_store(tmp_path, wiki_validation, capsys):
    path = _study(tmp_path, wiki_validation, teacher={"source": "runs:/0123456789abcdef"})
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: teacher.source: runs:/0123456789abcdef: no such run: no MLflow store at "), err
    assert not (tmp_path / "runs" / "optuna.db").exists()


def test_teacher_config_replaces_the_model_and_applies_only_its_overrides(tmp_path, tiny_corpus):
    base = {**tiny_base(tmp_path, tiny_corpus), "init_from": "student-checkpoint"}
    spec = StudySpec(
        name="s",
        base=base,
        overrides={"optim.lr": 5e-4, "distill.temperature": 2.0},
        search={"model.sharing": {"choices": ["all", "none"]}},
        teacher={
            "model": {**TEACHER_MODEL, "num_layers": 3},
            "overrides": {"trainer.max_steps": 40, "optim.warmup_steps": 4},
        },
    )
    cfg = study_model_config(StudyBase(base), spec)
    assert cfg.name == "s-teacher" and cfg.distill.teacher is None and cfg.init_from is None
    assert (cfg.model.hidden_dim, cfg.model.num_layers, cfg.model.embed_dim, cfg.model.sharing) == (32, 3, 32, "none")
    assert (cfg.trainer.max_steps, cfg.optim.warmup_steps) == (40, 4)  # the teacher's overrides
    assert cfg.optim.lr == 1e-3 and cfg.distill.temperature == 1.0  # not the students' overrides
    assert cfg.data == corner_configs(spec, StudyBase(base))[0].data  # everything else is the base's
    assert base["model"]["preset"] == "albert-tiny"  # the base tree is not modified
    with pytest.raises(ValueError, match="trains no model of its own"):
        study_model_config(StudyBase(base), StudySpec(name="s", teacher={"source": "runs:/abc"}))


def test_trial_config_distils_from_the_study_teacher(tmp_path, tiny_corpus):
    tree = tiny_base(tmp_path, tiny_corpus)
    base = StudyBase(tree)
    spec = StudySpec(
        name="s", base=tree, teacher={"source": "runs:/abc"}, search={"model.sharing": {"choices": ["all", "none"]}}
    )
    cfg = trial_config(base, spec, {"model.sharing": "none", "seed": 1}, study_model="runs:/abc")
    assert (cfg.distill.teacher, cfg.model.sharing, cfg.seed, cfg.name) == ("runs:/abc", "none", 1, "s")
    assert {c.distill.teacher for c in corner_configs(spec, base)} == {PLACEHOLDER_SOURCE}
    # without a study teacher, a trial keeps the base's own distill.teacher (or none)
    plain = StudySpec(name="s", base=tree)
    assert trial_config(base, plain, {"seed": 0}).distill.teacher is None
    own = base.changed({"distill.teacher": "some/folder"})
    assert trial_config(own, plain, {"seed": 0}).distill.teacher == "some/folder"
    assert {c.distill.teacher for c in corner_configs(plain, own)} == {"some/folder"}


def test_a_study_model_to_prune_is_its_own_section(tmp_path, tiny_corpus, capsys):
    tree = {**tiny_base(tmp_path, tiny_corpus), "prune": {"rounds": 1, "gate_steps": 2, "finetune_steps": 2}}
    base = StudyBase(tree)
    spec = StudySpec(
        name="s",
        base=tree,
        prune_source={"model": TEACHER_MODEL, "overrides": {"trainer.max_steps": 40}},
        search={"prune.target": {"choices": [0.5, 0.7]}},
    )
    assert spec.study_model is spec.prune_source and spec.teacher is None
    cfg = trial_config(base, spec, {"prune.target": 0.5, "seed": 0}, study_model="runs:/abc")
    assert (cfg.regime, cfg.prune.source, cfg.prune.target, cfg.distill.teacher) == ("prune", "runs:/abc", 0.5, None)
    assert {c.prune.source for c in corner_configs(spec, base)} == {PLACEHOLDER_SOURCE}
    source = study_model_config(base, spec)  # pre-trained once for the study, under its own name
    assert (source.name, source.regime, source.prune.source, source.trainer.max_steps) == (
        "s-prune_source",
        "pretrain",
        None,
        40,
    )
    with pytest.raises(ValueError, match="one trained model"):
        StudySpec(name="s", teacher={"source": "runs:/a"}, prune_source={"source": "runs:/b"})
    # the old spelling, a teacher given ``into: prune.source``, says where the model to prune went
    path = _study(tmp_path, tiny_corpus, teacher={"model": TEACHER_MODEL, "into": "prune.source"})
    assert main(["sweep", "--check", str(path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {path}: teacher.into: gone; declare the model every trial prunes as prune_source: instead"
    )


def test_a_reference_is_the_source_of_each_trials_own_regime(tmp_path, tiny_corpus, capsys):
    base = StudyBase(tiny_base(tmp_path, tiny_corpus))
    variants = {
        "distilled": {"regime": "distill", "model.sharing": "all"},
        "pruned": {"regime": "prune", "prune.rounds": 1, "prune.gate_steps": 2, "prune.finetune_steps": 2},
        "int8": {"regime": "quant", "quant.method": "dynamic-int8"},
        "pruned+int4": {"regime": "prune", "prune.rounds": 1, "quant.method": "weight-int4"},
    }
    spec = StudySpec(name="s", base=base.tree, reference={"model": TEACHER_MODEL}, variants=variants)
    assert spec.study_model is spec.reference
    assert spec.set_by_study == ("distill.teacher", "prune.source", "quant.source")
    configs = {v: trial_config(base, spec, {"variant": v, "seed": 0}, study_model="runs:/ref") for v in variants}
    assert {v: (c.regime, c.distill.teacher, c.prune.source, c.quant.source) for v, c in configs.items()} == {
        "distilled": ("distill", "runs:/ref", None, None),
        "pruned": ("prune", None, "runs:/ref", None),
        "int8": ("quant", None, None, "runs:/ref"),
        "pruned+int4": ("prune", None, "runs:/ref", None),
    }
    assert configs["pruned+int4"].quant.method == "weight-int4"  # pruned, then quantized
    assert study_model_config(base, spec).name == "s-reference"
    # a trial that names no regime (or one the reference cannot be the source of) is refused before it runs
    path = _study(tmp_path, tiny_corpus, name="ref", reference={"model": TEACHER_MODEL})
    raw = yaml.safe_load(path.read_text())
    raw["variants"] = {"scratch": {"model.sharing": "all"}}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", "--check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: variants.scratch: regime: None: a trial of a study with a reference names")
    raw["variants"] = {"int8": {"regime": "quant", "quant.source": "runs:/other"}}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", "--check", str(path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {path}: variants.int8.quant.source: set by the study's reference section"
    )
    with pytest.raises(ValueError, match="one trained model"):
        StudySpec(name="s", teacher={"source": "runs:/a"}, reference={"source": "runs:/b"})


def test_a_teacher_that_cannot_start_is_refused_before_anything_is_written(tmp_path, wiki_validation, capsys):
    path = _study(
        tmp_path,
        wiki_validation,
        name="no-teacher",
        teacher={"model": TEACHER_MODEL, "overrides": {"init_from": str(tmp_path / "missing")}},
    )
    assert main(["sweep", str(path)]) == 2
    assert "missing" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # checked with the plan: no store, no run


def test_failed_teacher_training_fails_the_study(tmp_path, wiki_validation, capsys):
    path = _study(
        tmp_path, wiki_validation, name="nan-teacher", teacher={"model": TEACHER_MODEL, "overrides": {"optim.lr": 1e9}}
    )
    assert main(["sweep", str(path)]) != 0
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("nan-teacher").experiment_id])
    assert sorted((r.data.tags["ablate.role"], r.info.status) for r in runs) == [
        ("study", "FAILED"),
        ("teacher", "FAILED"),
    ]


def test_teacher_trained_once_and_reused(tmp_path, wiki_validation, capsys):
    teacher = {"model": TEACHER_MODEL, "overrides": {"trainer.max_steps": 10, "trainer.val_every": 5}}
    path = _study(tmp_path, wiki_validation, teacher=teacher)
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")

    assert main(["sweep", str(path), "--n-trials", "1"]) == 0  # the teacher, then one of the two students
    assert "teacher: training bert-tiny once for the study" in capsys.readouterr().err
    assert main(["sweep", str(path)]) == 0  # the study continues: the other student, same teacher
    assert "teacher: reusing run" in capsys.readouterr().err
    assert main(["sweep", str(path)]) == 0  # nothing left to do

    exp = client.get_experiment_by_name("distilled").experiment_id
    runs = {
        role: [r for r in client.search_runs([exp]) if r.data.tags["ablate.role"] == role]
        for role in ("study", "teacher", "trial")
    }
    assert [len(runs[role]) for role in ("study", "teacher", "trial")] == [1, 1, 2]
    (parent,), (teacher_run,) = runs["study"], runs["teacher"]
    teacher_id = teacher_run.info.run_id
    assert teacher_run.info.status == "FINISHED" and teacher_run.info.run_name == "teacher"
    assert teacher_run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    spec, base = load_study(path)
    digest = hashlib.sha256(to_yaml(study_model_config(base, spec)).encode()).hexdigest()
    assert teacher_run.data.tags["ablate.config_digest"] == digest
    assert teacher_run.data.params["model.hidden_dim"] == "32"
    assert "distill.teacher" not in teacher_run.data.params  # a pre-training run logs no distill.*
    assert {a.path for a in client.list_artifacts(teacher_id)} >= {"model", "tokenizer"}
    assert parent.data.tags["ablate.teacher_run"] == teacher_id and parent.info.status == "FINISHED"
    assert parent.data.tags["ablate.study_model_run"] == teacher_id
    assert sorted(r.data.params["model.sharing"] for r in runs["trial"]) == ["all", "none"]
    for trial in runs["trial"]:
        assert trial.info.status == "FINISHED" and trial.data.tags["ablate.state"] == "COMPLETE"
        assert trial.data.params["distill.teacher"] == f"runs:/{teacher_id}"
        assert trial.data.tags["ablate.teacher_run"] == trial.data.tags["ablate.study_model_run"] == teacher_id
        assert trial.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert "val/loss" in trial.data.metrics

    # another study of the same store distils from that run as its given source
    path = _study(tmp_path, wiki_validation, name="from-source", teacher={"source": f"runs:/{teacher_id}"})
    assert main(["sweep", str(path), "--n-trials", "1"]) == 0
    assert f"teacher: runs:/{teacher_id} (teacher.source)" in capsys.readouterr().err
    exp = client.get_experiment_by_name("from-source").experiment_id
    runs = client.search_runs([exp])
    assert sorted(r.data.tags["ablate.role"] for r in runs) == ["study", "trial"]  # no teacher trained here
    assert {r.data.tags["ablate.teacher_run"] for r in runs} == {teacher_id}
    assert [r.data.params["distill.teacher"] for r in runs if r.data.tags["ablate.role"] == "trial"] == [
        f"runs:/{teacher_id}"
    ]
