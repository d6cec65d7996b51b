"""The README's quickstart table is the report's own output (tools/readme_table.py writes it from ``make
quickstart``'s ``report.md``): the quickstart study run at its smallest through documented overrides, its
report built by ``ablate report``, and the README's block compared: every column, the row keys, every counted
cell; the measured cells (training, latency) only in their format. The tool's own edges, without a run."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests import forked

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "sweeps" / "studies" / "quickstart.yaml"
#: The smallest quickstart: key=value overrides of ``ablate sweep`` (docs/studies.md); the grid stays whole.
SMALLEST = ("trainer.max_steps=2", "trainer.val_every=2", "trainer.val_batches=1", "optim.warmup_steps=1")
SMALLEST += ("trainer.measure=false", "trainer.progress=false")
PLACEHOLDER = "/path/to/ablate"  # where the README's printed lines put the checkout


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "tools" / "readme_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()


def _ablate(cwd: Path, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    done = forked.run(args, cwd=cwd, env=env, timeout=900)
    assert done.returncode == 0, f"ablate {' '.join(args)} ended {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _table(lines: list[str]) -> list[list[str]]:
    """The Markdown table's rows (header first, the alignment row left out), cells stripped."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
    assert len(rows) > 2, lines
    return [rows[0], *rows[2:]]


def _shape(cell: str) -> str:
    """A measured cell's format: bold and marks left out, each number as its count of decimals (``7.576``:
    ``N.ddd``)."""
    plain = re.sub(r"\*\*|[†‡≈]", "", cell).strip()
    return re.sub(r"\d+(?:\.(\d+))?", lambda m: "N" + ("." + "d" * len(m.group(1)) if m.group(1) else ""), plain)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The quickstart study at its smallest, swept and reported in a folder of its own: the report's folder
    and ``ablate report``'s output."""
    tmp = tmp_path_factory.mktemp("quickstart")
    swept = _ablate(tmp, "sweep", str(STUDY), *SMALLEST)
    found = re.search(r"--study (\S+)", swept)
    assert found is not None, swept
    name = found.group(1)
    return tmp / "ablate-runs" / "reports" / name, _ablate(tmp, "report", str(STUDY), "--study", name)


def test_the_readme_table_has_the_reports_columns_rows_and_counted_cells(small: tuple[Path, str]) -> None:
    report_dir, _ = small
    metrics = TOOL.spec_metrics(STUDY)
    ours = TOOL.between(TOOL.block(report_dir, metrics))  # what the tool writes from this report
    readme = TOOL.between((ROOT / "README.md").read_text(encoding="utf-8"))
    theirs, made = _table(ours), _table(readme)
    assert made[0] == theirs[0]  # every column, in order, by the report's names
    keys = len(theirs[0]) - len(metrics) - 1  # row keys and details (timed by), then metrics, then runs
    assert [r[:keys] for r in made[1:]] == [r[:keys] for r in theirs[1:]]
    assert [r[-1] for r in made[1:]] == [r[-1] for r in theirs[1:]]  # runs per row
    for j, (name, label) in enumerate(metrics, start=keys):
        if TOOL.counted(name):
            assert [r[j] for r in made[1:]] == [r[j] for r in theirs[1:]], label
        else:  # trained or timed: the format only
            assert [_shape(r[j]) for r in made[1:]] == [_shape(r[j]) for r in theirs[1:]], label
    assert readme[-1] == ours[-1] == TOOL.measured_line(metrics)
    notes = [line for line in readme[1:-1] if line and not line.startswith("|")]
    assert notes[0].startswith("Latency re-measured by ablate report on ")  # the report timed its models


def test_the_readme_shows_what_ablate_report_prints(small: tuple[Path, str]) -> None:
    report_dir, printed = small
    line = next(line for line in printed.splitlines() if line.startswith("report written to "))
    shown = line.replace(str(report_dir.parent.parent.parent.resolve()), PLACEHOLDER).replace(
        f"reports/{report_dir.name}/", "reports/quickstart/"
    )
    assert "remeasured.csv" in shown
    assert shown in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_block_is_replaced_between_its_markers_and_nothing_else(tmp_path: Path) -> None:
    report = "# Title\n\n| a | n |\n|:---|---:|\n| x | 1 |\n\nA note.\n\nStudy: `s`; states included: FINISHED.\n"
    assert TOOL.report_lines(report) == ["| a | n |", "|:---|---:|", "| x | 1 |", "", "A note."]
    readme = f"before\n{TOOL.BEGIN}\nold\n{TOOL.END}\nafter\n"
    new = f"{TOOL.BEGIN}\nnew\n{TOOL.END}"
    assert TOOL.replaced(readme, new) == f"before\n{new}\nafter\n"
    assert TOOL.between(TOOL.replaced(readme, new)) == ["new"]
    with pytest.raises(ValueError, match="no block between"):
        TOOL.replaced("no markers", new)
    with pytest.raises(ValueError, match="not a report.md"):
        TOOL.report_lines("| a |\n")


def test_the_tool_refuses_a_missing_report_in_one_line(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"{TOOL.BEGIN}\n{TOOL.END}\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "readme_table.py"), str(tmp_path / "none"), "--readme", str(readme)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1
    assert readme.read_text(encoding="utf-8") == f"{TOOL.BEGIN}\n{TOOL.END}\n"  # untouched
