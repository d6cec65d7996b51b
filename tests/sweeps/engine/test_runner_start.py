"""``ablate train`` names its run when it starts (id, store, the command that resumes it), and
``--resume`` without an id lists the store's stopped runs."""

from __future__ import annotations

import pytest
import yaml

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine import checkpoints
from ablate.sweeps.engine.context import RunContext
from ablate.sweeps.engine.interrupt import Interrupted
from ablate.sweeps.engine.runner import train
from tests.sweeps.conftest import InterruptAt, tiny_base


def test_a_run_says_who_it_is_when_it_starts_and_resume_lists_the_stopped_ones(tmp_path, wiki_validation, capsys):
    tree = tiny_base(tmp_path, wiki_validation, measure=False)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    store = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert main(["train", str(path)]) in (0, None)
    out, err = capsys.readouterr()
    run_id = out.split("run ", 1)[1].split(" finished", 1)[0]
    first = next(line for line in err.splitlines() if line.startswith("run "))  # said before any step
    assert (
        first == f"run {run_id} started in {store}; if it stops: ablate train --resume {run_id} --tracking-uri {store}"
    )

    assert main(["train", "--resume", "--tracking-uri", store]) == 2
    assert capsys.readouterr().err.strip() == f"error: --resume: no stopped run with a checkpoint in {store}"

    cfg = build_config(tree)
    plan = checkpoints.run_place(str(tmp_path / "ckpt"), cfg.tracking.root, cfg)
    with pytest.raises(Interrupted) as stop:
        train(cfg, RunContext(checkpoint=plan, callbacks=(InterruptAt(4),)))
    (killed,) = stop.value.runs
    capsys.readouterr()
    assert main(["train", "--resume", "--tracking-uri", store]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"error: --resume: give a run id; stopped runs in {store}: {killed} (experiment, KILLED, phase pre-training)"
    )
    assert run_id not in err and "KILLED" in err  # the finished run is not offered
