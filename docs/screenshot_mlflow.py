"""Screenshot the real MLflow UI showing a study's trial runs (for the documentation).

Not part of ablate: a documentation helper. Needs a Chromium (``apt-get install
chromium``) and ``pip install playwright``; it drives the system browser, so nothing
is downloaded. Start the UI first, e.g.::

    .venv/bin/mlflow server --backend-store-uri sqlite:///ablate-runs/mlflow.db --port 5055
    # the runs page ablate's closing line links to, with the report's columns
    .venv/bin/python docs/screenshot_mlflow.py quickstart --url http://127.0.0.1:5055 \\
        --columns model.sharing model.embed_dim model.num_ffn val/loss latency_ms_b32 --out docs/mlflow-runs.png
    # or the Compare page of the trials, with a metric on the parallel-coordinates chart
    .venv/bin/python docs/screenshot_mlflow.py albert-table3 --url http://127.0.0.1:5055 --compare \\
        --metric sst2/best_accuracy --width 2000 --out docs/mlflow-compare.png

It opens the pages as a new user's browser does (nothing remembered), so what it shows is what
the link printed by ``ablate sweep`` and ``ablate report`` shows.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from playwright.sync_api import Page, sync_playwright

from ablate.mlflow_ui import runs_url

TREE = ".du-bois-light-tree-treenode"  # a row of the Columns dropdown


def _experiment(url: str, study: str) -> Any:  # noqa: ANN401 - an mlflow Experiment
    exp = MlflowClient(tracking_uri=url).get_experiment_by_name(study)
    if exp is None:
        raise SystemExit(f"error: {study}: no such experiment at {url}")
    return exp


def compare_url(url: str, study: str) -> str:
    """The UI's Compare page for the study's trial runs (what selecting them and pressing Compare opens)."""
    exp = _experiment(url, study)
    client = MlflowClient(tracking_uri=url)
    runs = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'trial'", order_by=["attributes.run_name"])
    ids = urllib.parse.quote(json.dumps([r.info.run_id for r in runs]))
    exps = urllib.parse.quote(json.dumps([exp.experiment_id]))
    return f"{url}/#/compare-runs?runs={ids}&experiments={exps}&workflowType=machine_learning"


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("study")
    p.add_argument("--url", default="http://127.0.0.1:5055")
    p.add_argument("--compare", action="store_true", help="the Compare page instead of the runs page")
    p.add_argument("--columns", nargs="*", default=[], help="runs page: params and metrics to show as columns")
    p.add_argument("--metric", help="Compare page: the metric to plot on the parallel-coordinates chart")
    p.add_argument("--out", type=Path, default=Path("docs/mlflow-runs.png"))
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--width", type=int, default=1500, help="viewport width (Compare: about 180 px per run)")
    args = p.parse_args()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": 900 if not args.compare else 2400})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.compare:
            _compare(page, args)
        else:
            _runs(page, args)
        browser.close()
    print(f"wrote {args.out}")


def _close_assistant(page: Page) -> None:
    close = page.get_by_role("button", name="Close")
    if close.count():  # the assistant side panel, open on a first visit
        close.first.click()


def _runs(page: Page, args: argparse.Namespace) -> None:
    """The runs page as ablate links to it (:func:`ablate.mlflow_ui.runs_url`), with ``--columns``
    shown and the attribute columns nobody reads here (dataset, source, models) hidden."""
    page.goto(runs_url(args.url, _experiment(args.url, args.study).experiment_id, args.study))
    page.get_by_text("matching run").first.wait_for(timeout=60_000)
    page.wait_for_timeout(2_000)
    _close_assistant(page)
    page.get_by_role("button", name="Columns").first.click()
    search = page.get_by_placeholder("Search columns")
    for name in ["Dataset", "Source", "Models", *args.columns]:  # each click toggles: off, then on
        search.fill(name)
        page.wait_for_timeout(400)
        row = page.locator(TREE).filter(has=page.get_by_text(name, exact=True))
        row.locator(".du-bois-light-tree-checkbox").first.click()
    page.keyboard.press("Escape")
    page.wait_for_timeout(1_500)
    bottom = page.get_by_text("matching run").first.bounding_box()
    height = bottom["y"] + bottom["height"] + 12 if bottom else 900
    page.screenshot(path=str(args.out), clip={"x": 0, "y": 0, "width": args.width, "height": height})


def _compare(page: Page, args: argparse.Namespace) -> None:
    """The Compare page: the chosen metric on the chart, Show diff only on Parameters and Metrics."""
    page.goto(compare_url(args.url, args.study))
    page.get_by_text("Run details").wait_for(timeout=60_000)
    page.wait_for_timeout(2_000)
    _close_assistant(page)
    if args.metric:
        _pick_metric(page, args.metric)
    for toggle in page.get_by_text("Show diff only").all():  # only what differs: the ablation
        toggle.click()
    page.wait_for_timeout(1_000)
    page.get_by_text("Comparing").first.scroll_into_view_if_needed()  # the toggles scrolled the page
    page.wait_for_timeout(500)
    boxes = [b for b in (e.bounding_box() for e in page.get_by_text("Artifacts").all()) if b]
    bottom = max(b["y"] for b in boxes)
    page.screenshot(path=str(args.out), clip={"x": 0, "y": 0, "width": args.width, "height": bottom - 10})


def _pick_metric(page: Page, metric: str) -> None:
    """Show ``metric`` on the parallel-coordinates chart instead of the default ``train/loss``."""
    select = page.locator(".du-bois-light-select-selector", has_text="train/loss").first
    select.click()
    page.keyboard.type(metric)
    page.keyboard.press("Enter")
    select.locator(".du-bois-light-select-selection-item", has_text="train/loss").locator(
        ".du-bois-light-select-selection-item-remove"
    ).click()
    page.keyboard.press("Escape")  # close the dropdown


if __name__ == "__main__":
    main()
