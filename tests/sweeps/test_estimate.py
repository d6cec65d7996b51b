"""A GPU study (``*_gpu.yaml``) says its estimated wall time before it starts: measured on this CPU for a
tiny study, with ``--check`` too (which writes nothing); a study that trains on a GPU this machine lacks
says why it cannot be estimated; another study says nothing."""

from __future__ import annotations

import re

import pytest

from ablate.cli import main
from ablate.sweeps.estimate import wants_estimate, workload
from ablate.sweeps.spec import load_study
from tests.sweeps.conftest import write_study

LINE = re.compile(
    r"^estimated wall time: ~([\d.]+) min \((\d+) trials x ([\d,]+) steps x ([\d.]+) ms/step "
    r"\+ (\d+) runs x ([\d.]+) s fixed cost(?: \+ (\d+) configurations x ([\d.]+) s compiling)?\)$",
    re.M,
)


def test_check_prints_the_estimate_and_writes_nothing(tmp_path, wiki_validation, capsys):
    path = write_study(tmp_path, wiki_validation, name="tiny_gpu")
    spec, base = load_study(path)
    work = workload(spec, base)
    assert (work.trials, work.steps, work.runs) == (2, 12, 2)  # two trials of 6 steps, one run each
    assert main(["sweep", str(path), "--check"]) in (0, None)
    found = LINE.search(capsys.readouterr().out)
    assert found is not None
    minutes, trials, steps, ms = float(found[1]), int(found[2]), int(found[3].replace(",", "")), float(found[4])
    assert minutes > 0 and ms > 0 and (trials, steps, int(found[5])) == (2, 6, 2)
    assert not (tmp_path / "runs").exists()  # --check wrote no store


def test_a_sweep_prints_it_before_its_first_trial(tmp_path, wiki_validation, capsys):
    one = {"model.sharing": {"choices": ["all"]}}
    path = write_study(tmp_path, wiki_validation, name="one_gpu", search=one, trainer={"max_steps": 3})
    assert main(["sweep", str(path)]) in (0, None)
    captured = capsys.readouterr()
    found = LINE.search(captured.out)
    assert found is not None and float(found[1]) > 0 and int(found[2]) == 1
    assert (tmp_path / "runs").exists()  # and then it ran


def test_a_gpu_study_on_a_machine_without_one_says_why(tmp_path, wiki_validation, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the study would be timed on it")
    path = write_study(tmp_path, wiki_validation, name="plain", trainer={"accelerator": "gpu"})
    spec, base = load_study(path)
    assert wants_estimate(spec, base, path)
    assert main(["sweep", str(path), "--check"]) in (0, None)
    out = capsys.readouterr().out
    assert "estimated wall time: cannot estimate on this machine (2 trials, 12 steps, 2 runs): the study trains" in out
    assert "this machine has none" in out


def test_a_cpu_study_says_nothing(tmp_path, wiki_validation, capsys):
    path = write_study(tmp_path, wiki_validation, name="plain")
    spec, base = load_study(path)
    assert not wants_estimate(spec, base, path)
    assert main(["sweep", str(path), "--check"]) in (0, None)
    assert "estimated wall time" not in capsys.readouterr().out


def test_a_compiled_study_counts_each_configuration_compiling_once(tmp_path, wiki_validation):
    """Seeds repeat a configuration: its graphs come from the compile caches, compiled once."""
    path = write_study(tmp_path, wiki_validation, name="seeded_gpu", trainer={"compile": True}, seeds=[0, 1, 2])
    spec, base = load_study(path)
    work = workload(spec, base)
    assert (work.trials, work.runs, work.configurations) == (6, 6, 2)  # two configurations, three seeds each
    eager = write_study(tmp_path, wiki_validation, name="eager_gpu", seeds=[0, 1, 2])
    assert workload(*load_study(eager)).configurations == 0
