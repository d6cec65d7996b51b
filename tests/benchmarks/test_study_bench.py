"""``ablate bench study STUDY.yaml``: a tiny two-trial study of one model shape, run through the real
command in this process, prints a row per run whose parts add up to the run's wall time, an efficiency
in (0, 1] and the last line's fixed cost of a repeat run; a chained trial's stages (``trial | task``
rows) are clocked as every run is; the user's store is left alone. No timed assertion: speed is the
benchmark's job."""

from __future__ import annotations

import re

import pytest

from ablate.benchmarks.study_bench import AFTER, CLOSING, END_OF_FIT, PARTS, cell
from ablate.cli import main
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import write_study

pytestmark = pytest.mark.usefixtures("one_thread")

LAST = re.compile(r"fixed cost of a repeat run: (\d+\.\d) s; study efficiency: (\d\.\d\d)")
HEAD = ["run", *PARTS, "wall", "steps", "ms/step (steady)"]
SST2 = SHARED_DATA / "sst2"


def _cells(line: str) -> list[str]:
    """A markdown row's cells, ``\\|`` inside a cell read as ``|``."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def _table(lines: list[str], head: str) -> tuple[list[str], list[list[str]]]:
    """The header and body rows (the sum row and what follows left out) of the table whose header starts ``head``."""
    at = next(i for i, line in enumerate(lines) if line.startswith(head))
    body = []
    for line in lines[at + 2 :]:
        if not line.startswith("|") or line.startswith("| **all runs**"):
            break
        body.append(_cells(line))
    return _cells(lines[at]), body


def _parts_add_up(row: list[str]) -> None:
    parts, wall = [float(c) for c in row[1 : 1 + len(PARTS)]], float(row[1 + len(PARTS)])
    assert all(p >= 0 for p in parts) and wall > 0
    assert sum(parts) == pytest.approx(wall, abs=0.02 * len(PARTS))  # each cell rounded to 0.01 s


def test_a_two_trial_study_splits_each_runs_wall_time(tmp_path, wiki_validation, capsys):
    study = write_study(
        tmp_path,
        wiki_validation,
        search={"optim.lr": {"choices": [1e-3, 2e-3]}},  # two trials, one model shape
        trainer={"max_steps": 8, "val_every": 4, "val_batches": 1, "measure": False},
    )
    assert main(["bench", "study", str(study), "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    head, rows = _table(lines, "| run | data")
    assert head == HEAD
    assert sorted(r[0] for r in rows) == ["lr=0.001 seed=0", "lr=0.002 seed=0"]
    for r in rows:
        _parts_add_up(r)
        assert float(r[PARTS.index("training") + 1]) > 0 and float(r[PARTS.index("validation") + 1]) > 0
        assert int(r[2 + len(PARTS)]) == 8  # every step of the run stamped
    match = LAST.fullmatch(lines[-1])
    assert match is not None, lines[-1]
    fixed, efficiency = float(match[1]), float(match[2])
    assert 0 < efficiency <= 1
    # the second run is the repeat of the first's kind: its fixed cost is its wall less steps and validation
    second = rows[1]
    steps, validation = (float(second[1 + PARTS.index(p)]) for p in ("training", "validation"))
    repeat = float(second[1 + len(PARTS)]) - steps - validation
    assert fixed == pytest.approx(repeat, abs=0.1)
    assert not (tmp_path / "runs").exists()  # nothing in the study's own store


def test_a_chained_trials_stages_are_clocked_and_named_in_their_parts(tmp_path, wiki_validation, capsys):
    if not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    lines = (SST2 / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:201]) + "\n", encoding="utf-8")
    task = {"task": "sst2", "train": str(tmp_path / "train.tsv"), "validation": str(SST2 / "validation.tsv")}
    study = write_study(
        tmp_path,
        wiki_validation,
        name="chain",
        search={"objective.sentence": {"choices": ["nsp"]}},  # one trial: pre-training, then SST-2
        trainer={"max_steps": 4, "val_every": 4, "val_batches": 1, "measure": False},
        tasks=[{**task, "max_length": 32, "batch_size": 16, "lr": 1e-3, "max_steps": 4, "val_every": 4}],
        optimize={"metric": "downstream/avg", "direction": "maximize"},
    )
    assert main(["bench", "study", str(study), "--device", "cpu"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert cell("sentence=nsp seed=0 | sst2") in "\n".join(out)  # escaped: the row keeps its columns
    head, rows = _table(out, "| run | data")
    assert head == HEAD and all(len(r) == len(HEAD) for r in rows)
    assert [r[0] for r in rows] == ["sentence=nsp seed=0 | pretrain", "sentence=nsp seed=0 | sst2"]
    for r in rows:  # the fine-tuning stage's steps are the bench's as much as the pre-training's
        _parts_add_up(r)
        assert int(r[2 + len(PARTS)]) == 4 and float(r[1 + PARTS.index("training")]) > 0
        assert float(r[1 + PARTS.index("first step")]) > 0 and float(r[1 + PARTS.index("validation")]) > 0
    after_head, after = _table(out, "| run | end of fit")
    assert after_head[1] == END_OF_FIT and after_head[-2:] == [CLOSING, AFTER] and "weights" in after_head
    assert "summary" in after_head  # a fine-tuning run's own finisher, named
    for r, main_row in zip(after, rows, strict=True):  # the part after the steps, by part, adds up to it
        assert r[0] == main_row[0] and len(r) == len(after_head)
        assert float(r[-1]) == float(main_row[1 + PARTS.index(AFTER)])
        assert sum(float(c) for c in r[1:-1]) == pytest.approx(float(r[-1]), abs=0.01 * len(r))
        assert float(r[after_head.index("weights")]) > 0
    assert LAST.fullmatch(out[-1]) is not None, out[-1]


def test_a_study_stopped_by_a_signal_still_reports_what_ended() -> None:
    """A time limit's SIGTERM ends the study: the table of the runs that ended comes first, then the
    interruption (its exit status and line, from the command)."""
    import signal

    from ablate.benchmarks.study_bench import StudyTime, report
    from ablate.sweeps.engine.interrupt import Interrupted

    stopped = StudyTime("s", [], 12.5, "as written", (0.0, 0.0), Interrupted(signal.SIGTERM))
    lines = report(stopped)
    assert lines[0].startswith("### study s (as written): 0 runs, wall time by part (s); ")
    assert lines[0].endswith("; interrupted by SIGTERM after 12.5 s: the runs that ended")
    assert lines[-1] == "no run ended"
    whole = report(StudyTime("s", [], 12.5, "as written", (0.0, 0.0)))
    assert "interrupted" not in whole[0]
