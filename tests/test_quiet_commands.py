"""Every kind of ``ablate`` command, run as a user runs it (a process of its own, at the smallest size, one store
shared by all), prints no library warning or note but those :data:`ALLOWED` lists; ``--verbose`` shows
the notes :mod:`ablate.quiet` hides (docs/development.md, "Quiet by default"). The training commands start new
interpreters (what the libraries print as they are imported); the others are forked (tests/forked.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from tests import forked
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import tiny_base

SST2 = SHARED_DATA / "sst2"
pytestmark = pytest.mark.timeout(1200)  # the module's commands, each a process: about 3 min on 2 idle cores

#: What a library's warning or note looks like in a command's output: a warning (``UserWarning: ...``,
#: ``WARNING:root:...``, ``warn(``), a logged line (MLflow's ``2026/01/01 12:00:00 INFO ...``), a
#: progress bar (``| 3/8 [00:01<00:02, 2.5it/s]``), a source location (``.../site-packages/x.py:12:``)
#: and the notes hidden so far (``weights_only``, Lightning's, torchao's kernel libraries).
SUSPECT = re.compile(
    r"warn|deprecat|Downloading artifacts|weights_only|it/s\]|\d+%\||site-packages|\.py:\d+|^\d{4}/\d\d/\d\d \d"
    r"|^(INFO|DEBUG|NOTICE):|Failed to load|available: |Tip: |LOCAL_RANK|torchao|Please consider",
    re.IGNORECASE,
)
#: Lines that look like one but are ablate's own, each with its reason.
ALLOWED: tuple[re.Pattern[str], ...] = ()

#: A note :mod:`ablate.quiet` hides that every training prints (Lightning's accelerator lines).
HIDDEN_NOTE = "GPU available: "


def _ablate(cwd: Path, *args: str, fresh: bool = False) -> str:
    """Run ``ablate ARGS`` in ``cwd``; its stdout and stderr together (exit status 0 asserted). ``fresh``: in a
    new interpreter (``python -m ablate``), which prints what torch, Lightning and MLflow print as they are
    imported; otherwise in a process forked from one that imported them already (tests/forked.py), which
    prints everything else a command prints (every other module is imported by the command)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    if fresh:
        done = subprocess.run(
            [sys.executable, "-m", "ablate", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=600,
            check=False,
        )
    else:
        done = forked.run(args, cwd=cwd, env=env, timeout=600, joined=True)
    assert done.returncode == 0, f"ablate {' '.join(args)} ended {done.returncode}:\n{done.stdout}"
    return done.stdout


def _write(path: Path, tree: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return path


def _run_id(output: str) -> str:
    """The run id a command's first line names (``run RUN_ID started in ...``)."""
    found = re.search(r"\brun ([0-9a-f]{32})\b", output)
    assert found is not None, output
    return found.group(1)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory, wiki_validation: Path) -> dict[str, str]:
    """Each command kind's output, run in turn on one store (the pre-training run is the fine-tuning's,
    the quantization study's and the resume's source; the fine-tuned run is exported)."""
    if not (SST2 / "validation.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tmp = tmp_path_factory.mktemp("quiet")
    uri = f"sqlite:///{tmp / 'store' / 'mlflow.db'}"  # not beside the runs' root: checkpoints go to MLflow
    (tmp / "store").mkdir()
    base = tiny_base(tmp, wiki_validation)
    base["trainer"].update(max_steps=2, val_every=2, val_batches=1, log_every=1, measure=False)
    base["optim"]["warmup_steps"] = 1
    run = _write(tmp / "run.yaml", base)
    out: dict[str, str] = {"params": _ablate(tmp, "params", "albert-tiny", "model.sharing=none")}
    out["train"] = _ablate(tmp, "train", str(run), "--tracking-uri", uri, fresh=True)
    source = _run_id(out["train"])
    rows = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()[:129]  # header + 128 rows
    (tmp / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    tuned = dict(base)
    tuned["finetune"] = {"source": f"runs:/{source}", "task": "sst2", "train": str(tmp / "train.tsv")}
    tuned["finetune"].update(validation=str(SST2 / "validation.tsv"), max_length=32, batch_size=16)
    tuned["finetune"].update(max_steps=4, val_every=4, validation_examples=32, lr=0.02)  # one class, by a margin
    out["fine-tune"] = _ablate(tmp, "train", str(_write(tmp / "tune.yaml", tuned)), "--tracking-uri", uri)
    MlflowClient(uri).set_terminated(source, "FAILED")  # a run whose training ended before it failed resumes
    out["resume"] = _ablate(tmp, "train", "--resume", source, "--tracking-uri", uri)
    study = _quant_study(base, source)
    out["sweep"] = _ablate(tmp, "sweep", str(_write(tmp / "study.yaml", study)), "--tracking-uri", uri)
    out["report"] = _ablate(tmp, "report", str(tmp / "study.yaml"), "--tracking-uri", uri)
    tuned_id = _run_id(out["fine-tune"])
    onnx = ("--format", "onnx", "--quantize", "dynamic-int8", "--tracking-uri", uri)
    out["export"] = _ablate(tmp, "export", tuned_id, str(tmp / "onnx"), *onnx)
    out["bench"] = _ablate(tmp, "bench", "train", "--case", "micro", "--steps", "2", "--device", "cpu")
    out["verbose"] = _ablate(tmp, "train", str(run), "--tracking-uri", uri, "--verbose", fresh=True)
    return out


def _quant_study(base: dict[str, object], source: str) -> dict[str, object]:
    """A study of one quantization trial of the pre-trained run (the ``quant`` regime, no training)."""
    quant_base = {**base, "quant": {"source": f"runs:/{source}"}}
    report = {"title": "quiet", "rows": ["quant.method"], "metrics": [{"name": "val/loss"}]}
    return {
        "name": "quiet",
        "base": quant_base,
        "search": {"quant.method": {"choices": ["dynamic-int8"]}},
        "seeds": [0],
        "sampler": "grid",
        "pruner": {"type": "none"},
        "optimize": {"metric": "val/loss", "direction": "minimize"},
        "report": report,
    }


def suspects(output: str) -> list[str]:
    """The lines of ``output`` that look like a library's warning or note and :data:`ALLOWED` does not list."""
    lines = (line.strip() for chunk in output.splitlines() for line in chunk.split("\r"))
    return [line for line in lines if SUSPECT.search(line) and not any(a.search(line) for a in ALLOWED)]


@pytest.mark.parametrize("kind", ["params", "train", "fine-tune", "resume", "sweep", "report", "export", "bench"])
def test_a_command_prints_no_library_note(outputs: dict[str, str], kind: str) -> None:
    assert outputs[kind].strip(), f"{kind}: printed nothing"
    assert suspects(outputs[kind]) == [], f"{kind}:\n{outputs[kind]}"


def test_verbose_shows_the_notes_that_are_hidden_otherwise(outputs: dict[str, str]) -> None:
    assert HIDDEN_NOTE not in outputs["train"]
    assert HIDDEN_NOTE in outputs["verbose"]


def test_the_pattern_catches_what_a_library_prints() -> None:
    """:data:`SUSPECT` knows the lines this test exists for (each once printed by some command)."""
    printed = [
        "/x/site-packages/lightning/fabric/utilities/cloud_io.py:73: `weights_only` was not set, defaulting to True",
        "Downloading artifacts: 100%|██████████| 1/1 [00:00<00:00, 1100.00it/s]",
        "WARNING:root:Please consider to run pre-processing before quantization.",
        "  warnings.warn(",
        "2026/11/28 04:00:09 INFO mlflow.store.db.utils: Creating initial MLflow database tables...",
    ]
    assert [line for line in printed if not SUSPECT.search(line)] == []
    assert suspects("run 0123 finished: val/loss 7.1\nreport written to /x/ (report.md)") == []
