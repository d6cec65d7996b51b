"""Check everything, then write: mistakes a new user makes, each refused by the command's plan.

Every case runs the real CLI (``ablate.cli.main``) in a fresh working folder that holds its
inputs (and, for some, a real MLflow store with a finished run). Each must end with exit
status 2 and one ``error:`` line naming the key or file, no traceback, and leave the working
folder byte for byte as it was: no ``ablate-runs/``, no store, no cache, no report, no run.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
import yaml

from ablate.cli import main
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import tiny_base

WIKI = SHARED_DATA / "wiki-en" / "validation-00-of-01.jsonl.gz"
SST2 = SHARED_DATA / "sst2"
Make = Callable[[Path], list[str]]


def _tree(tmp: Path, **sections: object) -> dict:
    tree = tiny_base(tmp, WIKI)
    for section, values in sections.items():
        tree[section] = {**tree.get(section, {}), **values} if isinstance(values, dict) else values
    return tree


def _write(tmp: Path, tree: object, name: str = "cfg.yaml") -> str:
    path = tmp / name
    path.write_text(tree if isinstance(tree, str) else yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return str(path)


def _train(*flags: str, **sections: object) -> Make:
    return lambda tmp: ["train", _write(tmp, _tree(tmp, **sections)), *(f.replace("TMP", str(tmp)) for f in flags)]


def _study(*flags: str, **changes: object) -> Make:
    def make(tmp: Path) -> list[str]:
        study = {"name": "bad", "base": _tree(tmp), "search": {"model.sharing": {"choices": ["all", "none"]}}}
        study.update(changes)
        return ["sweep", _write(tmp, study, "study.yaml"), *(f.replace("TMP", str(tmp)) for f in flags)]

    return make


def _finished_run(tmp: Path) -> str:
    """A real MLflow store under ``runs/`` holding one FINISHED run of experiment ``done``; its id."""
    uri = f"sqlite:///{tmp / 'runs' / 'mlflow.db'}"
    (tmp / "runs").mkdir()
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("done", artifact_location=str(tmp / "runs" / "artifacts"))
    run = client.create_run(exp, run_name="finished")
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def _with_store(make: Callable[[Path, str], list[str]]) -> Make:
    return lambda tmp: make(tmp, _finished_run(tmp))


def _file(tmp: Path, name: str = "a-file") -> Path:
    path = tmp / name
    path.write_text("x\n")
    return path


def _report_with_no_runs(tmp: Path, run_id: str) -> list[str]:
    spec = {"title": "t", "study": "done", "rows": ["model.sharing"], "metrics": [{"name": "val/loss"}]}
    spec["study"] = "no-such-study"
    return ["report", _write(tmp, spec, "report.yaml"), "--tracking-uri", f"sqlite:///{tmp / 'runs' / 'mlflow.db'}"]


CASES: dict[str, tuple[Make, str]] = {
    # every trial a study can produce, not only the first
    "a later choice invalid": (
        _study(search={"model.num_heads": {"choices": [2, 3]}}),
        "search.model.num_heads",
    ),
    "a later seed invalid": (_study(seeds=[0, -1]), "seeds"),
    "a later variant invalid": (
        _study(variants={"ok": {}, "bad": {"model.hidden_dim": 33}}),
        "variants.bad",
    ),
    "a range end invalid": (
        _study(sampler="random", n_trials=2, search={"data.max_length": {"low": 32, "high": 100}}),
        "search.data.max_length=100",
    ),
    "a search the regime ignores": (
        _study(search={"distill.temperature": {"choices": [1.0, 2.0]}}),
        "search.distill.temperature",
    ),
    # the study's own settings
    "optimized metric no run logs": (_study(optimize={"metric": "val/acuracy"}), "optimize.metric"),
    "optimized metric of a task the study lacks": (_study(optimize={"metric": "sst2/accuracy"}), "optimize.metric"),
    "optimize direction unknown": (_study(optimize={"direction": "up"}), "optimize.direction"),
    "optimize by its old name": (
        _study(objective={"metric": "val/loss", "direction": "minimize"}),
        "study.yaml: objective: renamed optimize (the metric and direction Optuna optimizes; "
        "base.objective is the pre-training objective)",
    ),
    "tasks by their old name, checked": (
        _study("--check", finetune=[{"task": "sst2", "train": "nyu-mll/glue:sst2"}]),
        "study.yaml: finetune: renamed tasks (the fine-tuning tasks of each trial; "
        "base.finetune is one run's fine-tuning section)",
    ),
    "tasks by their old name, reported": (
        lambda tmp: ["report", _study(finetune=[{"task": "sst2", "train": "nyu-mll/glue:sst2"}])(tmp)[1]],
        "study.yaml: finetune: renamed tasks",
    ),
    "pruner unknown": (_study(pruner={"type": "asha"}), "pruner.type"),
    "threshold pruner without a bound": (_study(pruner={"type": "threshold"}), "pruner.upper"),
    # output and input paths
    "report --out is a file": (
        _with_store(lambda tmp, rid: [*_report_with_no_runs(tmp, rid), "--out", str(_file(tmp))]),
        "--out",
    ),
    "export into a file": (
        _with_store(
            lambda tmp, rid: [
                "export",
                rid,
                str(_file(tmp)),
                "--tracking-uri",
                f"sqlite:///{tmp / 'runs' / 'mlflow.db'}",
            ]
        ),
        "a-file: is a file",
    ),
    "export under a file": (
        _with_store(
            lambda tmp, rid: [
                "export",
                rid,
                str(_file(tmp) / "out"),
                "--tracking-uri",
                f"sqlite:///{tmp / 'runs' / 'mlflow.db'}",
            ]
        ),
        "a-file/out: cannot be made: TMP/a-file is a file",
    ),
    "tracking root is a file": (
        lambda tmp: _train(tracking={"root": str(_file(tmp, "runs"))})(tmp),
        "tracking.root",
    ),
    "checkpoints folder is a file": (
        lambda tmp: [*_train()(tmp), "--checkpoints", str(_file(tmp, "ckpts"))],
        "--checkpoints",
    ),
    "sqlite storage under a file": (
        lambda tmp: _study("--storage", f"sqlite:///{_file(tmp)}/optuna.db")(tmp),
        "--storage",
    ),
    "corpus an empty folder": (
        lambda tmp: (tmp / "corpus").mkdir() or _train(data={"corpus": str(tmp / "corpus")})(tmp),
        "data.corpus",
    ),
    "task data a folder": (
        lambda tmp: (
            (tmp / "train.tsv").mkdir() or _study(tasks=[{"task": "sst2", "train": str(tmp / "train.tsv")}])(tmp)
        ),
        "tasks[0].train: TMP/train.tsv: is a folder, not a file",
    ),
    "bench --out not writable": (lambda tmp: ["bench", "--out", "/proc/ablate-bench.md"], "--out"),
    # stores, studies and runs that cannot continue as asked
    "resume a run that does not exist": (
        lambda tmp: ["train", "--resume", "0123456789abcdef0123456789abcdef"],
        "--resume",
    ),
    "resume a finished run": (
        _with_store(
            lambda tmp, rid: ["train", "--resume", rid, "--tracking-uri", f"sqlite:///{tmp / 'runs/mlflow.db'}"]
        ),
        "the run is FINISHED",
    ),
    "export a run with no store": (lambda tmp: ["export", "0123456789abcdef", str(tmp / "out")], "ablate-runs"),
    "export a run without weights": (
        _with_store(
            lambda tmp, rid: ["export", rid, str(tmp / "out"), "--tracking-uri", f"sqlite:///{tmp / 'runs/mlflow.db'}"]
        ),
        "model/",
    ),
    "report on a study with no runs": (_with_store(_report_with_no_runs), "no-such-study"),
    "report on a store that does not exist": (
        lambda tmp: [
            "report",
            _write(tmp, {"title": "t", "study": "x", "rows": ["model.sharing"], "metrics": [{"name": "val/loss"}]}),
            "--tracking-uri",
            f"sqlite:///{tmp / 'nowhere' / 'mlflow.db'}",
        ],
        "nowhere/mlflow.db",
    ),
    # hostile or impossible values
    "learning rate NaN": (_train(optim={"lr": float("nan")}), "optim.lr"),
    "learning rate infinite": (_train(optim={"lr": float("inf")}), "optim.lr"),
    "search range NaN": (
        _study(sampler="random", n_trials=2, search={"optim.lr": {"low": float("nan"), "high": 0.1}}),
        "search.optim.lr",
    ),
    "a three-token vocabulary": (_train(model={"vocab_size": 3}), "model.vocab_size"),
    "sequences of two tokens": (_train(data={"max_length": 2}), "data.max_length"),
    "a model larger than this machine": (
        _train(model={"hidden_dim": 65536, "ffn_dim": 262144, "num_heads": 64, "embed_dim": 65536}),
        "model",
    ),
    "a run name past MLflow's limit": (_train(tracking={"run_name": "r" * 600}), "tracking.run_name"),
    "an experiment name past MLflow's limit": (_train(tracking={"experiment": "e" * 600}), "tracking.experiment"),
    "a study name past Optuna's limit": (_study(name="s" * 600), "name"),
    "a variant name past MLflow's limit": (_study(variants={"v" * 6000: {}}), "variants"),
    "absurd nesting": (lambda tmp: ["train", _write(tmp, "model: " + "[" * 20000 + "]" * 20000 + "\n")], "cfg.yaml"),
    "max_steps past any integer": (_train(trainer={"max_steps": 10**30}), "trainer.max_steps"),
    "a seed that is not whole": (_train(seed=1.5), "seed"),
    # resources this machine lacks
    "a GPU that is not there": (_train(trainer={"accelerator": "gpu"}), "trainer.accelerator"),
    "more CPU devices than cores": (_train(trainer={"accelerator": "cpu", "devices": 512}), "trainer.devices"),
    "two nodes outside a cluster": (_train(trainer={"num_nodes": 2}), "trainer.num_nodes"),
    "ddp_spawn": (_train(trainer={"strategy": "ddp_spawn", "devices": 2, "accelerator": "cpu"}), "trainer.strategy"),
    "fp16 on the CPU": (_train(trainer={"precision": "16-mixed", "accelerator": "cpu"}), "trainer.precision"),
}


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder``: its path and (for a file) the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize("case", list(CASES))
def test_refused_by_the_plan_with_nothing_written(case, tmp_path, capsys, monkeypatch):
    if not WIKI.is_file():
        pytest.skip(f"shared test data not found at {WIKI}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    make, needle = CASES[case]
    argv = make(tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()
    start = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert needle.replace("TMP", str(tmp_path)) in err, err
    assert snapshot(tmp_path) == before, "the refused command wrote into the working folder"
    assert elapsed < 60, f"took {elapsed:.0f} s to say so"
