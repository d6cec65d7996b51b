"""A run's phase list, as each regime's config makes it and ``ablate train --print-plan`` prints it."""

from __future__ import annotations

import os

import yaml

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine import runner


def _plan(tree: dict) -> str:
    return runner.plan(build_config(tree)).describe()


def _tree(**sections: dict) -> dict:
    return {"model": {"preset": "bert-tiny"}, "trainer": {"max_steps": 40}, **sections}


def test_each_regime_makes_its_phases_and_finishers():
    pretrain = _plan(_tree(trainer={"max_steps": 40, "intrinsic": True}, quant={"method": "dynamic-int8"}))
    assert "1. pre-training: 40 steps, new module; AdamW lr" in pretrain
    assert pretrain.index("- probes") < pretrain.index("- quantize and score") < pretrain.index("- weights")
    prune = _plan(_tree(prune={"source": "runs:/S", "rounds": 2, "gate_steps": 5, "finetune_steps": 6}))
    assert "1. gates 1/2: 5 steps" in prune and "4. re-training 2/2: 6 steps" in prune
    assert "Adam over the gates" in prune and prune.rstrip().endswith("as model/ artifacts")  # the weights, last
    baseline = _plan(_tree(prune={"source": "runs:/S", "method": "uniform", "rounds": 2, "finetune_steps": 6}))
    assert "1. re-training: 12 steps, new module (uniform: cut at once)" in baseline and "2." not in baseline
    quant = _plan(_tree(quant={"source": "runs:/S", "method": "weight-int4", "qat_steps": 5}))
    assert "1. QAT: 5 steps" in quant and "- quantize and score" in quant
    arm = _plan(_tree(quant={"source": "runs:/S", "method": "none"}))
    assert "phases: none" in arm and "- float evaluation" in arm
    finetune = {"source": "runs:/S", "task": "sst2", "train": "t.tsv", "validation": "v.tsv", "max_steps": 30}
    fastbert = _plan(
        _tree(finetune={**finetune, "exits": True, "exit_steps": 8}, quant={"method": "weight-int4", "qat_steps": 4})
    )
    assert "1. fine-tuning: 30 steps" in fastbert and "2. exits: 8 steps, same module, new stages" in fastbert
    assert "3. QAT: 4 steps, same module, new stages" in fastbert
    assert fastbert.index("- exit curve") < fastbert.index("- quantize and score") < fastbert.index("- summary")


def test_print_plan_prints_the_phases_and_runs_nothing(tmp_path, capsys):
    os.chdir(tmp_path)
    assert main(["train", "bert-tiny", "trainer.max_steps=40", "--print-plan"]) in (0, None)
    out = capsys.readouterr().out
    assert "regime pretrain" in out and "1. pre-training: 40 steps" in out and "- weights" in out
    assert list(tmp_path.iterdir()) == []  # no store, no folder


def test_the_runner_executes_the_plan_it_prints(tmp_path, wiki_validation, monkeypatch):
    """``runner.train`` builds ``runner.plan(cfg)`` once (the regime's phases and finishers, then the
    runner's weights finisher) and executes that object: what ``--print-plan`` describes."""
    from tests.sweeps.conftest import tiny_base

    cfg = build_config({**tiny_base(tmp_path, wiki_validation), "trainer": {"max_steps": 2, "measure": False}})
    executed = []
    real = runner.execute

    def spy(plan, ready, run, ctx):
        executed.append(plan)
        return real(plan, ready, run, ctx)

    monkeypatch.setattr(runner, "execute", spy)
    runner.train(cfg)
    (plan,) = executed
    assert plan.describe() == runner.plan(cfg).describe()
    assert [f.name for f in plan.finishers][-1] == "weights"
    # the weights finisher is the runner's, not the regime's
    assert all(
        f.name != "weights" for f in runner.REGIMES["pretrain"].plan(cfg).finishers
    )  # the runner's, not the regime's


def test_print_plan_runs_the_checks_the_run_makes_first(tmp_path, capsys):
    """A plan that prints is a run that starts: a column the task's file lacks is refused by both."""
    from tests.conftest import SHARED_DATA

    rte = SHARED_DATA / "glue" / "rte"
    finetune = {"source": str(tmp_path), "task": "rte", "train": str(rte / "train.tsv")}
    tree = {**finetune, "validation": str(rte / "validation.tsv"), "text_fields": ["question", "sentence2"]}
    path = tmp_path / "ft.yaml"
    path.write_text(yaml.safe_dump({"regime": "finetune", "finetune": tree}), encoding="utf-8")
    os.chdir(tmp_path)
    for command in (["train", "print-plan", str(path)], ["train", str(path)]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: finetune.text_fields: 'question' is not a column of {rte / 'train.tsv'} "
                       "(columns: sentence1, sentence2, label)"]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ft.yaml"]  # nothing written
