"""Steering from the command line: ``ablate sweep STUDY key=value`` (a study of its own, the override in
every trial; refused for a searched field), files of the wrong kind named as such, and "did you mean" for
unknown keys in overrides, studies and report specs. Refusals: one ``error:`` line, exit 2, nothing written."""

from __future__ import annotations

import pytest
import yaml
from mlflow import MlflowClient

from ablate.cli import main
from ablate.sweeps.overrides import TAG, study_name
from tests.sweeps.conftest import tiny_base, write_study

pytestmark = pytest.mark.usefixtures("one_thread")


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``argv``; assert exit 2 and one ``error:`` line; return it."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


def test_an_overridden_sweep_is_a_study_of_its_own_and_runs_with_the_override(tmp_path, wiki_validation, capsys):
    path = write_study(
        tmp_path, wiki_validation, search={"model.sharing": {"choices": ["all"]}}, trainer={"measure": False}
    )
    argv = ["sweep", str(path), "trainer.max_steps=3"]
    assert main(argv) == 0
    name = study_name("tiny", {"trainer.max_steps": 3})
    out = capsys.readouterr().out
    assert f"study {name}: tiny with trainer.max_steps=3, a study of its own" in out
    assert f"its report: ablate report {path} --study {name}" in out
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert client.get_experiment_by_name("tiny") is None  # the unchanged study's name is left alone
    exp = client.get_experiment_by_name(name)
    trials = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'trial'")
    assert [t.data.params["trainer.max_steps"] for t in trials] == ["3"]  # the study's base says 6
    assert [t.data.params["model.sharing"] for t in trials] == ["all"]
    history = client.get_metric_history(trials[0].info.run_id, "val/loss")
    assert len(history) == 1  # validated every 3 steps: it ran 3, not the base's 6 (two validations)
    (parent,) = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'study'")
    assert parent.data.tags[TAG] == "trainer.max_steps=3"
    assert main(argv) == 0  # the same overrides: the same study, resumed, nothing left to run
    assert f"study {name}: {{'COMPLETE': 1}}" in capsys.readouterr().out
    assert len(client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'trial'")) == 1


def test_overrides_show_in_print_config_and_name_new(tmp_path, wiki_validation, capsys):
    path = write_study(tmp_path, wiki_validation)
    assert main(["sweep", str(path), "optim.lr=0.01", "name=quick", "--print-config"]) == 0
    captured = capsys.readouterr()
    printed = yaml.safe_load(captured.out)  # stdout: the YAML alone
    assert printed["optim"]["lr"] == 0.01 and printed["name"] == "quick"
    assert "study quick: tiny with optim.lr=0.01 name=quick" in captured.err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("model.sharing=none", "error: model.sharing: searched by the study (search.model.sharing)"),
        ("model.num_layers=3", "error: model.num_layers: searched by the study (variants tall, short)"),
        ("seed=4", "error: seed: searched by the study (seeds)"),
        ("trainer.max_step=3", "error: trainer.max_step: unknown key (did you mean trainer.max_steps?)"),
        ("model.max_steps=3", "did you mean finetune.max_steps or trainer.max_steps?"),
        ("tracking.run_name=x", "error: tracking.run_name: set by the sweep"),
        ("name=a/b", "error: name: 'a/b': not a study name"),
        ("trainer.max_steps", "expected key=value"),
        ("model.hidden_dim=33", "hidden_dim 33 is not divisible by num_heads 2"),
    ],
)
def test_bad_overrides_are_refused_before_anything_is_written(tmp_path, capsys, override, needle):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here. Another one there.\n\nA second document. With two sentences.\n")
    variants = {"tall": {"model.num_layers": 2}, "short": {"model.num_layers": 1}}
    path = write_study(tmp_path, corpus, variants=variants)
    assert needle in _refused(capsys, ["sweep", str(path), override])
    assert not (tmp_path / "runs").exists()


def test_a_file_of_the_wrong_kind_is_named_as_such(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    study = write_study(tmp_path, corpus)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_base(tmp_path, corpus)))
    report = tmp_path / "report.yaml"
    report.write_text(yaml.safe_dump({"study": "tiny", "title": "t", "rows": ["model.sharing"], "metrics": []}))
    err = _refused(capsys, ["train", str(study)])
    assert f"error: {study} is a study (it has base:, search:" in err and f"run it with ablate sweep {study}" in err
    err = _refused(capsys, ["params", str(study)])
    assert "is a study" in err
    err = _refused(capsys, ["sweep", str(config)])
    assert f"error: {config} is a run config (it has " in err and f"train it with ablate train {config}" in err
    assert "is a report spec (it has metrics:, rows:, study:)" in _refused(capsys, ["train", str(report)])
    assert f"build it with ablate report {report}" in _refused(capsys, ["sweep", str(report)])
    err = _refused(capsys, ["report", str(config)])
    assert "is a run config" in err and "ablate report experiment NAME" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_unknown_keys_say_what_was_meant(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    assert "model.embd_dim: unknown key (did you mean model.embed_dim?)" in _refused(
        capsys, ["train", "albert-tiny", "model.embd_dim=16", "--print-config"]
    )
    assert "modle: unknown key (did you mean model?)" in _refused(capsys, ["params", "albert-tiny", "modle.x=1"])
    path = write_study(tmp_path, corpus, pruner={"type": "none", "n_warmup_step": 2})
    assert "pruner.n_warmup_step: unknown key (did you mean pruner.n_warmup_steps?)" in _refused(
        capsys, ["sweep", str(path)]
    )
    path = write_study(tmp_path, corpus, search={"model.embd_dim": {"choices": [16]}})
    assert "search.model.embd_dim: not a config field (did you mean model.embed_dim?)" in _refused(
        capsys, ["sweep", str(path)]
    )
    study = yaml.safe_load(path.read_text())
    study["search"] = {"model.sharing": {"choices": ["all"]}}
    study["report"]["titel"] = study["report"].pop("title")
    path.write_text(yaml.safe_dump(study))
    assert "titel: unknown key (did you mean title?)" in _refused(capsys, ["sweep", str(path)])
    report = tmp_path / "report.yaml"
    report.write_text(yaml.safe_dump({"study": "tiny", "title": "t", "row": ["model.sharing"], "metrics": []}))
    assert "row: unknown key (did you mean rows?)" in _refused(capsys, ["report", str(report)])
    assert not (tmp_path / "runs").exists()
