"""optuna-dashboard (the ``dashboard`` extra) reads a study as ablate writes it.

The shipped quickstart study is opened and queued by ablate's own code (``workers.storage``
with heartbeats, ``open_study`` with the queued grid sampler, ``fill_queue``) in a real SQLite
storage; its trials are taken from that queue by a stand-in objective (no training, so the
test stays cheap) that records what a real trial records: the suggested params, a validation
curve, the MLflow run id, and a failure's reason. Then the ``optuna-dashboard`` command is
started on that storage on loopback and the study is read back over its HTTP API.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed (pip install -e '.[dashboard]')")

import optuna  # noqa: E402

from ablate.sweeps import workers  # noqa: E402
from ablate.sweeps.spec import load_study  # noqa: E402
from ablate.sweeps.study import FAIL_REASON, open_study  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "sweeps" / "studies" / "quickstart.yaml"
FAILING = {"model.embed_dim": 32, "model.sharing": "all", "model.num_ffn": 2, "seed": 0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200, url
        return json.load(response)


def _value(params: dict) -> float:
    """A stand-in for a trial's final val/loss."""
    return 7.0 + params["model.embed_dim"] / 1000 + 0.1 * (params["model.sharing"] == "all") + params["model.num_ffn"]


def _ablate_study(url: str) -> optuna.Study:
    """The quickstart study in ``url``, every grid point taken once by the stand-in objective."""
    spec, _ = load_study(QUICKSTART)
    storage = workers.storage(url, spec.heartbeat, lambda study, trial: None)
    study, created = open_study(spec, storage, max_steps=300, url=url)
    assert created and workers.fill_queue(study, spec, created) == 8

    def objective(trial: optuna.Trial) -> float:
        params = {name: space.suggest(trial, name) for name, space in spec.space.items()}
        workers.claim(trial.study, trial, params)
        trial.set_user_attr("mlflow_run_id", f"run-{trial.number}")
        value = _value(params)
        trial.report(value + 0.5, step=100)  # the validation curve, one report per validation
        trial.report(value, step=200)
        if params == FAILING:
            trial.set_user_attr(FAIL_REASON, "FloatingPointError: val/loss is nan")
            raise FloatingPointError("val/loss is nan")
        return value

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.optimize(objective, n_trials=8, catch=(FloatingPointError,))
    return study


@pytest.fixture()
def dashboard(tmp_path):
    """Start ``optuna-dashboard URL --host 127.0.0.1 --port N``; yield a function that starts it on a URL."""
    procs: list[subprocess.Popen] = []

    def start(url: str) -> str:
        exe = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent)) or shutil.which(
            "optuna-dashboard"
        )
        assert exe, "the optuna-dashboard command is not installed beside this Python"
        port = _free_port()
        log = (tmp_path / "dashboard.log").open("w")
        cmd = [exe, url, "--host", "127.0.0.1", "--port", str(port), "--server", "wsgiref"]
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            if procs[-1].poll() is not None:
                pytest.fail(
                    f"optuna-dashboard exited {procs[-1].returncode}: {(tmp_path / 'dashboard.log').read_text()}"
                )
            try:
                _get(f"{base}/api/studies")
                return base
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"optuna-dashboard did not answer in 60 s: {(tmp_path / 'dashboard.log').read_text()}")
                time.sleep(0.2)

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_dashboard_reads_an_ablate_study(tmp_path, dashboard):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = _ablate_study(url)
    base = dashboard(url)

    summaries = _get(f"{base}/api/studies")["study_summaries"]
    assert [s["study_name"] for s in summaries] == ["quickstart"]
    summary = summaries[0]
    assert summary["directions"] == ["minimize"]
    assert {"key": workers.QUEUE, "value": "ready"} in summary["user_attrs"]

    detail = _get(f"{base}/api/studies/{summary['study_id']}")
    assert detail["name"] == "quickstart"
    trials = sorted(detail["trials"], key=lambda t: t["number"])
    assert len(trials) == 8
    assert Counter(t["state"] for t in trials) == {"Complete": 7, "Fail": 1}
    # the Optuna parameter names are ablate's dotted config names (plus the seed), every grid point once
    grid = {tuple(sorted((k, str(v)) for k, v in p.items())) for p in workers.grid_points(load_study(QUICKSTART)[0])}
    seen = {tuple(sorted((p["name"], p["param_external_value"]) for p in t["params"])) for t in trials}
    assert seen == grid and len(grid) == 8
    assert {s["name"] for s in detail["union_search_space"]} == {
        "model.embed_dim",
        "model.sharing",
        "model.num_ffn",
        "seed",
    }
    for t in trials:
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        assert attrs["mlflow_run_id"] == f"run-{t['number']}"
        params = {p["name"]: p["param_external_value"] for p in t["params"]}
        ints = {k: int(params[k]) for k in ("model.embed_dim", "model.num_ffn")}
        value = _value({**params, **ints})
        assert [(i["step"], i["value"]) for i in t["intermediate_values"]] == [
            (100, pytest.approx(value + 0.5)),
            (200, pytest.approx(value)),
        ]
        if t["state"] == "Fail":
            assert params == {k: str(v) for k, v in FAILING.items()}
            assert attrs[FAIL_REASON] == "FloatingPointError: val/loss is nan"
            assert not t.get("values")  # a failed trial has no value
        else:
            assert t["values"] == [pytest.approx(value)]
    assert [t["number"] for t in detail["best_trials"]] == [study.best_trial.number]
    assert study.best_trial.params == {"model.embed_dim": 32, "model.sharing": "none", "model.num_ffn": 1, "seed": 0}

    with urllib.request.urlopen(f"{base}/dashboard", timeout=10) as page:  # the browser UI itself
        assert page.status == 200 and "text/html" in page.headers["Content-Type"]
