"""Screenshot the real MLflow UI comparing a study's trial runs (for the README).

Not part of ablate: a documentation helper. Needs a Chromium (``apt-get install
chromium``) and ``pip install playwright``; it drives the system browser, so nothing
is downloaded. Start the UI first, e.g.::

    .venv/bin/mlflow server --backend-store-uri sqlite:///ablate-runs/mlflow.db --port 5055
    .venv/bin/python docs/screenshot_mlflow.py albert-table3 --url http://127.0.0.1:5055 \\
        --metric sst2/best_accuracy --width 2000 --out docs/mlflow-compare.png
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from pathlib import Path

from mlflow import MlflowClient
from playwright.sync_api import sync_playwright


def compare_url(url: str, study: str) -> str:
    """The UI's Compare page for the study's trial runs (what selecting them and pressing Compare opens)."""
    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name(study)
    if exp is None:
        raise SystemExit(f"error: {study}: no such experiment at {url}")
    runs = client.search_runs([exp.experiment_id], "tags.`ablate.role` = 'trial'", order_by=["attributes.run_name"])
    ids = urllib.parse.quote(json.dumps([r.info.run_id for r in runs]))
    exps = urllib.parse.quote(json.dumps([exp.experiment_id]))
    return f"{url}/#/compare-runs?runs={ids}&experiments={exps}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study")
    p.add_argument("--url", default="http://127.0.0.1:5055")
    p.add_argument("--metric", help="the metric to plot on the parallel-coordinates chart")
    p.add_argument("--out", type=Path, default=Path("docs/mlflow-compare.png"))
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--width", type=int, default=1500, help="viewport width (about 180 px per run)")
    args = p.parse_args()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": args.width, "height": 2400})
        page.goto(compare_url(args.url, args.study))
        page.get_by_text("Run details").wait_for(timeout=60_000)
        page.wait_for_timeout(2_000)
        close = page.get_by_role("button", name="Close")
        if close.count():  # the assistant side panel
            close.first.click()
        if args.metric:
            _pick_metric(page, args.metric)
        for toggle in page.get_by_text("Show diff only").all():  # only what differs: the ablation
            toggle.click()
        page.wait_for_timeout(1_000)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.get_by_text("Comparing").first.scroll_into_view_if_needed()  # the toggles scrolled the page
        page.wait_for_timeout(500)
        boxes = [b for b in (e.bounding_box() for e in page.get_by_text("Artifacts").all()) if b]
        bottom = max(b["y"] for b in boxes)
        page.screenshot(path=str(args.out), clip={"x": 0, "y": 0, "width": args.width, "height": bottom - 10})
        browser.close()
    print(f"wrote {args.out}")


def _pick_metric(page, metric: str) -> None:
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
