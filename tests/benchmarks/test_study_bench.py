"""``ablate bench study STUDY.yaml``: a tiny two-trial study of one model shape, run through the real
command in this process, prints a row per run whose parts add up to the run's wall time, an efficiency
in (0, 1] and the last line's fixed cost of a repeat run; the user's store is left alone. No timed
assertion: speed is the benchmark's job."""

from __future__ import annotations

import re

import pytest

from ablate.benchmarks.study_bench import PARTS
from ablate.cli import main
from tests.sweeps.conftest import write_study

pytestmark = pytest.mark.usefixtures("one_thread")

LAST = re.compile(r"fixed cost of a repeat run: (\d+\.\d) s; study efficiency: (\d\.\d\d)")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_a_two_trial_study_splits_each_runs_wall_time(tmp_path, wiki_validation, capsys):
    study = write_study(
        tmp_path,
        wiki_validation,
        search={"optim.lr": {"choices": [1e-3, 2e-3]}},  # two trials, one model shape
        trainer={"max_steps": 8, "val_every": 4, "val_batches": 1, "measure": False},
    )
    assert main(["bench", "study", str(study), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| run |"))
    assert _cells(lines[header]) == ["run", *PARTS, "wall", "steps", "ms/step (steady)"]
    rows = [_cells(line) for line in lines[header + 2 :] if line.startswith("| lr=")]
    assert sorted(r[0] for r in rows) == ["lr=0.001 seed=0", "lr=0.002 seed=0"]
    for r in rows:
        parts, wall = [float(c) for c in r[1 : 1 + len(PARTS)]], float(r[1 + len(PARTS)])
        assert all(p >= 0 for p in parts) and wall > 0
        assert sum(parts) == pytest.approx(wall, abs=0.02 * len(PARTS))  # each cell rounded to 0.01 s
        assert float(r[PARTS.index("training") + 1]) > 0 and float(r[PARTS.index("validation") + 1]) > 0
        assert int(r[2 + len(PARTS)]) == 8  # every step of the run stamped
    match = LAST.fullmatch(lines[-1])
    assert match is not None, lines[-1]
    fixed, efficiency = float(match[1]), float(match[2])
    assert 0 < efficiency <= 1
    # the second run is the repeat of the first's shape: its fixed cost is its wall less steps and validation
    second = rows[1]
    steps, validation = (float(second[1 + PARTS.index(p)]) for p in ("training", "validation"))
    repeat = float(second[1 + len(PARTS)]) - steps - validation
    assert fixed == pytest.approx(repeat, abs=0.1)
    assert not (tmp_path / "runs").exists()  # nothing in the study's own store
