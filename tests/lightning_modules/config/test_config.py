from __future__ import annotations

import dataclasses

import pytest

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.experiment import field_names, flatten, run_params, to_yaml
from ablate.lightning_modules.config.load import build_config, load_config, parse_override, replace


@pytest.mark.parametrize(
    ("raw", "overrides", "key"),
    [
        ({"model": {"foo": 1}}, {}, "model.foo"),
        ({"bogus": 1}, {}, "bogus"),
        ({}, {"model.hidden_dim": 100}, "model.hidden_dim"),  # the field set, not the default beside it
        ({}, {"model.sharing": "sometimes"}, "model.sharing"),
        ({}, {"model.embed_dim": 0}, "model.embed_dim"),
        ({}, {"model.embed_dim": -4}, "model.embed_dim"),
        ({}, {"model.embed_dim": "big"}, "model.embed_dim"),
        ({}, {"objective.sentence": "xyz"}, "objective.sentence"),
        ({}, {"objective.mask_prob": 1.5}, "objective.mask_prob"),
        ({}, {"model.dropout": 1.0}, "model.dropout"),
        ({"model": {"preset": "no-such-model"}}, {}, "model.preset"),
        ({"model": 3}, {}, "model"),
        ({}, {"trainer.max_steps": 0}, "trainer.max_steps"),
        ({}, {"trainer.accumulate_grad_batches": 0}, "trainer.accumulate_grad_batches"),
        ({}, {"trainer.num_nodes": 0}, "trainer.num_nodes"),
        ({}, {"trainer.deterministic": "maybe"}, "trainer.deterministic"),
        ({}, {"trainer.profiler": "fancy"}, "trainer.profiler"),
        ({}, {"tracking.experiment": 3}, "tracking.experiment"),
    ],
)
def test_bad_values_name_the_key(raw, overrides, key):
    with pytest.raises(ConfigError) as err:
        build_config(raw, overrides)
    assert str(err.value).startswith(f"{key}:"), str(err.value)


def test_preset_with_overrides_and_replace():
    cfg = build_config({"model": {"preset": "albert-base", "embed_dim": 64}}, {"model.sharing": "none"})
    assert (cfg.model.embed_dim, cfg.model.hidden_dim, cfg.model.sharing) == (64, 768, "none")
    assert replace(cfg, {"model.num_ffn": 2}).model.num_ffn == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.embed_dim = 3  # type: ignore[misc]


def test_flatten_uses_dotted_field_names():
    flat = flatten(build_config({}))
    assert {"model.embed_dim", "model.sharing", "model.num_ffn", "objective.sentence", "seed"} <= set(flat)
    assert set(flat) == field_names()


def test_load_config_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {embed_dim: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: invalid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="missing.yaml: no such file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("model.embed_dim")
    good = tmp_path / "good.yaml"
    good.write_text("model: {preset: albert-tiny}\nseed: 3\n")
    cfg = load_config(good, ["model.embed_dim=32", "objective.sentence=nsp"])
    assert (cfg.seed, cfg.model.embed_dim, cfg.objective.sentence) == (3, 32, "nsp")


def test_num_workers_auto_fits_the_machine_and_a_number_is_kept():
    import os

    cores = len(os.sched_getaffinity(0))
    auto = build_config({}).data
    assert auto.num_workers == "auto"
    assert auto.workers() == max(1, cores - 1)  # a core is left to the training process
    assert auto.workers(devices=cores) == 1  # shared between the devices' loaders, at least one each
    assert build_config({"data": {"num_workers": 3}}).data.workers() == 3
    assert build_config({"data": {"num_workers": 0}}).data.workers() == 0
    with pytest.raises(ConfigError, match="data.num_workers"):
        build_config({"data": {"num_workers": "many"}})


_FT = {"task": "sst2", "train": "train.tsv", "validation": "dev.tsv"}


@pytest.mark.parametrize(
    ("raw", "regime"),
    [
        ({}, "pretrain"),
        ({"distill": {"teacher": "runs:/t"}}, "distill"),
        ({"prune": {"source": "runs:/s"}}, "prune"),
        ({"finetune": {"source": "runs:/s", **_FT}}, "finetune"),
        ({"regime": "distill", "distill": {"teacher": "runs:/t"}}, "distill"),
    ],
)
def test_a_run_says_its_regime(raw, regime):
    cfg = build_config(raw)
    assert cfg.regime == regime and flatten(cfg)["regime"] == regime  # a param like any other field


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"prune": {"source": "runs:/t"}, "finetune": {"source": "runs:/s", **_FT}},
            "finetune.source: a run has one regime (pretrain, distill, prune, finetune, quant); "
            "prune.source is set too",
        ),
        (  # task distillation takes the distill section, but not what only pre-training does
            {"distill": {"teacher": "runs:/t", "mlm_weight": 2.0}, "finetune": {"source": "runs:/s", **_FT}},
            "distill.mlm_weight: a fine-tuning run has no MLM",
        ),
        ({"distill": {"teacher": "runs:/t", "label_weight": 0.0}}, "distill.label_weight: only for task distillation"),
        (
            {"distill": {"teacher": "runs:/t", "init_layers": "every_other"}, "finetune": {"source": "runs:/s", **_FT}},
            "distill.init_layers: a fine-tuning run starts from its finetune.source",
        ),
        ({"finetune": {"source": "runs:/s", "exits": True, **_FT}}, "finetune.exit_steps: FastBERT's exits"),
        ({"finetune": {"source": "runs:/s", "exit_steps": 5, **_FT}}, "finetune.exit_steps: FastBERT's exits"),
        (
            {"finetune": {"source": "runs:/s", "exit_at": 0.5, **_FT}},
            "finetune.exit_at: a speed to use the model at needs",
        ),
        ({"finetune": {"source": "runs:/s", "exit_speeds": [0.5, 1.5], **_FT}}, "finetune.exit_speeds[1]: Input"),
        ({"regime": "prune"}, "prune.source: required by regime 'prune'"),
        ({"regime": "pretrain", "distill": {"teacher": "runs:/t"}}, "distill.teacher: set, but regime is 'pretrain'"),
        ({"regime": "finetune", "prune": {"source": "runs:/s"}}, "finetune.source: required by regime 'finetune'"),
        ({"regime": "train"}, "regime: Input should be"),
        # a field of another regime's section would be inert: the config carries only its own regime's
        ({"distill": {"fmt_weight": 0.5}}, "distill.fmt_weight: only for a distill run (distill.teacher); this run is"),
        ({"distill": {"teacher": "runs:/t"}, "prune": {"rounds": 2}}, "prune.rounds: only for a prune run"),
        ({"finetune": {"source": "runs:/s", **_FT}, "distill": {"temperature": 2.0}}, "distill.temperature: only for"),
        # Zhao et al.: dual training is pre-training's; a shared projection needs a term that projects
        (
            {"distill": {"teacher": "runs:/t", "dual_weight": 2.0}, "finetune": {"source": "runs:/s", **_FT}},
            "distill.dual_weight: dual training (a student with its own vocabulary) is for pre-training",
        ),
        (
            {"distill": {"teacher": "runs:/t", "projection": "shared", "fmt_weight": 0.0}},
            "distill.projection: 'shared' projects the student's hidden states for fmt_weight",
        ),
        ({"distill": {"teacher": "runs:/t", "mix_prob": 1.5}}, "distill.mix_prob: Input should be less than"),
    ],
)
def test_conflicting_regimes_are_one_error(raw, message):
    with pytest.raises(ConfigError) as err:
        build_config(raw)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_finetuning_run_with_a_teacher_is_task_distillation():
    raw = {"distill": {"teacher": "runs:/t", "kd_weight": 2.0, "label_weight": 0.5}, "finetune": {"source": "runs:/s"}}
    cfg = build_config({**raw, "finetune": {**raw["finetune"], **_FT}})
    assert cfg.regime == "finetune" and cfg.distill.teacher == "runs:/t"
    params = run_params(cfg)
    assert params["distill.kd_weight"] == 2.0 and params["finetune.source"] == "runs:/s"
    assert "distill.teacher" not in run_params(build_config({"finetune": {"source": "runs:/s", **_FT}}))


def test_a_run_logs_only_the_fields_its_regime_uses():
    pretrain = run_params(build_config({}))
    assert "model.embed_dim" in pretrain
    assert not any(k.startswith(("distill.", "prune.", "finetune.")) for k in pretrain)
    distill = run_params(build_config({"distill": {"teacher": "runs:/t"}}))
    assert distill["distill.teacher"] == "runs:/t" and not any(k.startswith(("prune.", "finetune.")) for k in distill)
    # Zhao et al.'s fields: the projection as set; mix_prob and dual_weight resolved against the teacher
    # (distill_module: the module's cfg, which the run logs), None until then
    assert (distill["distill.projection"], distill["distill.mix_prob"], distill["distill.dual_weight"]) == (
        "per_layer",
        None,
        None,
    )
    assert set(pretrain) < set(flatten(build_config({}))) <= field_names()


def test_lightning_knobs_default_off_and_round_trip_through_yaml(tmp_path):
    t = build_config({}).trainer
    assert (t.accumulate_grad_batches, t.num_nodes, t.deterministic, t.profiler) == (1, 1, False, None)
    assert build_config({}).tracking.experiment is None  # MLFLOW_EXPERIMENT_NAME or "ablate", at run time
    overrides = [
        "trainer.accumulate_grad_batches=4",
        "trainer.num_nodes=2",
        "trainer.deterministic=true",
        "trainer.profiler=simple",
        "tracking.experiment=mine",
    ]
    cfg = load_config(None, overrides)
    (tmp_path / "cfg.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    assert load_config(tmp_path / "cfg.yaml") == cfg
    assert load_config(None, ["trainer.profiler=null"]).trainer.profiler is None


# -- bad input that used to pass, or to fail only inside the training loop ---------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"data": {"max_length": 256}, "model": {"max_position": 128}}, "data.max_length: 256 tokens, but"),
        ({"model": {"token_types": 1}}, "model.token_types: 1 row, but objective.sentence 'sop'"),
        (
            {"model": {"token_types": 1}, "objective": {"sentence": "none"}, "trainer": {"intrinsic": True}},
            "model.token_types: 1 row, but trainer.intrinsic",
        ),
        ({"seed": -1}, "seed: must be between 0 and 4294967295"),
        ({"seed": 2**32}, "seed: must be between 0 and 4294967295"),
        ({"trainer": {"accelerator": "GPU0"}}, "trainer.accelerator: 'GPU0' is not one of auto, cpu"),
    ],
)
def test_settings_of_two_sections_that_cannot_go_together(raw, message):
    with pytest.raises(ConfigError) as err:
        build_config(raw)
    assert str(err.value).startswith(message) and "\n" not in str(err.value), err.value


@pytest.mark.parametrize(
    "raw",
    [
        {"data": {"max_length": 512}, "model": {"max_position": 512}},
        {"data": {"max_length": 1024}, "model": {"position": "none", "max_position": 128}},
        {"model": {"max_position": 64}},  # the default length describes a model, not a run of it
        {"model": {"token_types": 1}, "objective": {"sentence": "none"}},
        {"model": {"token_types": 0}},
        {"seed": 2**32 - 1, "trainer": {"accelerator": "cuda"}},
        {"prune": {"source": "runs:/x"}, "data": {"max_length": 256}, "model": {"max_position": 128}},
    ],
)
def test_settings_that_go_together_still_build(raw):
    build_config(raw)


def test_yaml_reads_what_it_looks_like(tmp_path):
    from ablate.lightning_modules.config.load import read_yaml
    from ablate.lightning_modules.config.yamlio import load_yaml

    values = load_yaml("[1e-3, 5E4, -2.5e+3, .5e-2, 1.0e-3, 1_000, e5, 1e, yes, no, on, off, true, False, 'no']")
    assert values == [
        0.001,
        50000.0,
        -2500.0,
        0.005,
        0.001,
        1000,
        "e5",
        "1e",
        "yes",
        "no",
        "on",
        "off",
        True,
        False,
        "no",
    ]
    assert [type(v) for v in values[:5]] == [float] * 5
    assert load_yaml("b: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}")["c"] == {"x": 3, "y": 2}  # a merge may override
    assert parse_override("optim.lr=1e-3") == ("optim.lr", 0.001)
    assert load_config(None, ["optim.lr=1e-3", "trainer.progress=off", "trainer.measure=yes"]).trainer.progress is False
    path = tmp_path / "cfg.yaml"
    path.write_text("optim: {lr: 2e-4}\ntrainer: {progress: no}\nname: off\n")
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.trainer.progress, cfg.name) == (2e-4, False, "off")
    path.write_text("optim:\n  lr: 1.0e-3\n  eps: 1.0e-8\n  lr: 2.0e-3\n")
    with pytest.raises(ConfigError, match=r"cfg.yaml: invalid YAML at line 4: duplicate key 'lr' \(first at line 2\)"):
        read_yaml(path)
    path.write_text("model:\n\tpreset: albert-tiny\n")
    with pytest.raises(ConfigError, match="indent with spaces, not tabs"):
        read_yaml(path)


def test_every_written_config_reads_back_the_same(tmp_path):
    """to_yaml (PyYAML's dump) and the stricter reader agree, strings that look like other things included."""
    cfg = load_config(None, ["name='no'", "tracking.run_name='1e-3'", "optim.lr=3e-5", "optim.eps=1.0e-8"])
    assert (cfg.name, cfg.tracking.run_name) == ("no", "1e-3")
    (tmp_path / "cfg.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    assert load_config(tmp_path / "cfg.yaml") == cfg


def test_a_key_given_twice_on_the_command_line_is_refused(capsys):
    """``key=value`` twice would silently keep the last value: one error line, in train and sweep."""
    from pathlib import Path

    from ablate.cli import main
    from ablate.lightning_modules.config.load import parse_overrides

    assert parse_overrides(["optim.lr=1e-3", "model.sharing=all"]) == {"optim.lr": 0.001, "model.sharing": "all"}
    with pytest.raises(ConfigError, match=r"^override optim.lr: given twice \(0.001, then 0.002\); give it once$"):
        parse_overrides(["optim.lr=1e-3", "optim.lr=2e-3"])
    study = Path(__file__).resolve().parents[3] / "sweeps" / "studies" / "quickstart.yaml"
    for command, said in (
        (
            ["train", "print-plan", "bert-tiny", "model.num_layers=2", "model.num_layers=3"],
            "model.num_layers: (2, then 3",
        ),
        (["sweep", "check", str(study), "trainer.max_steps=5", "trainer.max_steps=6"], "trainer.max_steps: (5, then 6"),
    ):
        assert main(command) == 2
        key, values = said.split(": ")
        assert capsys.readouterr().err.strip().splitlines() == [
            f"error: override {key}: given twice {values}); give it once"
        ]
