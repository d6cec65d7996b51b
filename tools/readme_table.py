"""The README's quickstart table, written from the report itself: ``report.md``'s table and footnotes as
``make quickstart`` left them, between the README's markers, with the machine and date (``python
tools/readme_table.py [REPORT_DIR]``). tests/test_readme_table.py checks the README against a small run."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
STUDY = "sweeps/studies/quickstart.yaml"
BEGIN = "<!-- quickstart-table: begin (tools/readme_table.py writes this block from report.md; do not edit) -->"
END = "<!-- quickstart-table: end -->"
COUNTED = ("params.", "flops_per_token", "model_bytes")
"""Metrics counted from the config (a name or a prefix): the same in every run of the study."""
LATENCY = "latency_ms"


def counted(metric: str) -> bool:
    """Whether ``metric`` is counted from the config, not measured (training or timing)."""
    return metric.startswith(COUNTED)


def report_lines(report_md: str) -> list[str]:
    """``report.md``'s table and the footnotes under it: the lines between its title and its ``Study:`` line."""
    lines = report_md.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ValueError("not a report.md: it starts with its title, '# ...'")
    end = next((i for i, line in enumerate(lines) if line.startswith("Study: `")), None)
    if end is None:
        raise ValueError("not a report.md: no 'Study: `...`' line under its table")
    return "\n".join(lines[1:end]).strip().splitlines()


def measured_line(metrics: list[tuple[str, str]]) -> str:
    """The line that says which columns (``(name, label)`` each) are measured, not counted."""
    latency = [label for name, label in metrics if name.startswith(LATENCY)]
    trained = [label for name, label in metrics if not name.startswith(LATENCY) and not counted(name)]
    parts = [f"{', '.join(latency)}: timed by `ablate report`, machine-dependent"] if latency else []
    parts += [f"{', '.join(trained)}: the trained models' (the same on this machine from run to run)"] * bool(trained)
    return f"Measured columns ({'; '.join(parts)}); every other cell is counted from the config."


def made_on(report_dir: Path) -> str:
    """Where and when the report timed its models (``remeasured.csv``), else that it did not."""
    path = report_dir / "remeasured.csv"
    if not path.is_file():
        return "machine and date unknown (no remeasured.csv)"
    with path.open(encoding="utf-8") as f:
        row = next(csv.DictReader(f))
    return f"{row['machine']}, {row['when']}"


def block(report_dir: Path, metrics: list[tuple[str, str]]) -> str:
    """The README's block: what made it, the table and its footnotes, which columns are measured."""
    made = f"`make quickstart` on {made_on(report_dir)}; the table and its footnotes as `report.md` has them:"
    lines = report_lines((report_dir / "report.md").read_text(encoding="utf-8"))
    return "\n".join([BEGIN, made, "", *lines, "", measured_line(metrics), END])


def replaced(readme: str, new_block: str) -> str:
    """``readme`` with the text from :data:`BEGIN` to :data:`END` (both kept) replaced by ``new_block``."""
    start, stop = readme.find(BEGIN), readme.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"README has no block between {BEGIN!r} and {END!r}")
    return readme[:start] + new_block + readme[stop + len(END) :]


def between(readme: str) -> list[str]:
    """The lines of the README's block, markers left out."""
    start, stop = readme.find(BEGIN), readme.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"README has no block between {BEGIN!r} and {END!r}")
    return readme[start + len(BEGIN) : stop].strip().splitlines()


def spec_metrics(study: Path) -> list[tuple[str, str]]:
    """The study's report columns, ``(metric name, header)`` each."""
    from ablate.reports.target import resolve_target

    return [(m.name, m.display) for m in resolve_target(str(study)).report.metrics]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="write README.md's quickstart table from make quickstart's report")
    p.add_argument("report_dir", nargs="?", default="ablate-runs/reports/quickstart", help="the report's folder")
    p.add_argument("--readme", default=str(README), help="the README to rewrite (default: this checkout's)")
    args = p.parse_args(argv)
    report_dir, readme = Path(args.report_dir), Path(args.readme)
    if not (report_dir / "report.md").is_file():
        print(f"error: {report_dir / 'report.md'}: not found (run make quickstart first)", file=sys.stderr)
        return 2
    try:
        text = replaced(readme.read_text(encoding="utf-8"), block(report_dir, spec_metrics(ROOT / STUDY)))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    readme.write_text(text, encoding="utf-8")
    print(f"wrote {readme}'s quickstart table from {report_dir / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
