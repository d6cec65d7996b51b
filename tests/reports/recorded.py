"""Real MLflow runs, recorded once from the shipped studies and replayed into a fresh store.

``fixtures/recorded_runs.json.gz`` holds, for every study a shipped report spec reads,
the study's parent run and its trial runs exactly as ``ablate sweep`` logged them:
run name, status, ``ablate.*`` tags, every param and every metric's last value. The
tests replay them into a new SQLite MLflow store and build each shipped report from it.

Re-record after a study is run again (from the repository root)::

    .venv/bin/python -m tests.reports.recorded --tracking-uri sqlite:///ablate-runs/mlflow.db
    # or only the studies run again, kept beside the others' recording:
    .venv/bin/python -m tests.reports.recorded --tracking-uri sqlite:///ablate-runs/mlflow.db --study five-families
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag, ViewType

from ablate.reports import catalog
from ablate.reports.spec import ReportSpec

FIXTURE = Path(__file__).with_name("fixtures") / "recorded_runs.json.gz"
_KEEP_TAGS = ("ablate.",)


def _record(client: MlflowClient, run_id: str) -> dict[str, Any]:
    run = client.get_run(run_id)
    return {
        "source_run_id": run.info.run_id,
        "name": run.info.run_name,
        "status": run.info.status,
        "tags": {k: v for k, v in run.data.tags.items() if k.startswith(_KEEP_TAGS)},
        "params": dict(run.data.params),
        "metrics": dict(run.data.metrics),
    }


def export(tracking_uri: str, studies: list[str]) -> dict[str, Any]:
    """Each study's parent run and trial runs, as plain data."""
    client = MlflowClient(tracking_uri=tracking_uri)
    out: dict[str, Any] = {"recorded_at": time.strftime("%Y-%m-%d"), "studies": {}}
    for study in studies:
        exp = client.get_experiment_by_name(study)
        if exp is None:
            raise SystemExit(f"error: {study}: no such experiment in {tracking_uri}")
        runs = client.search_runs(
            [exp.experiment_id],
            f"tags.`ablate.study` = '{study}'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=1000,
        )
        parents = [r for r in runs if r.data.tags.get("ablate.role") == "study"]
        trials = [r for r in runs if r.data.tags.get("ablate.role") == "trial"]
        out["studies"][study] = {
            "parent": _record(client, parents[0].info.run_id) if parents else None,
            "trials": [_record(client, r.info.run_id) for r in sorted(trials, key=lambda r: r.info.start_time)],
        }
    return out


def replay(tracking_uri: str, artifact_root: Path, path: Path = FIXTURE) -> dict[str, list[str]]:
    """Log the recorded runs into a store; return each study's new trial run ids."""
    data = json.loads(gzip.decompress(path.read_bytes()))
    client = MlflowClient(tracking_uri=tracking_uri)
    ids: dict[str, list[str]] = {}
    for study, recorded in data["studies"].items():
        exp_id = client.create_experiment(study, artifact_location=(artifact_root / study).as_uri())
        parent = recorded["parent"]
        parent_id = _log(client, exp_id, parent, {}) if parent else None
        nested = {"mlflow.parentRunId": parent_id} if parent_id else {}
        ids[study] = [_log(client, exp_id, t, nested) for t in recorded["trials"]]
    return ids


def _log(client: MlflowClient, exp_id: str, rec: dict[str, Any], extra_tags: dict[str, str]) -> str:
    run = client.create_run(exp_id, run_name=rec["name"], tags={**rec["tags"], **extra_tags})
    rid = run.info.run_id
    params = [Param(k, v) for k, v in rec["params"].items()]
    metrics = [Metric(k, v, 0, 0) for k, v in rec["metrics"].items()]
    for i in range(0, max(len(params), len(metrics)), 100):  # MLflow's batch limit is 100 params
        client.log_batch(
            rid,
            metrics=metrics[i : i + 100],
            params=params[i : i + 100],
            tags=[RunTag("ablate.recorded_from", rec["source_run_id"])] if i == 0 else [],
        )
    client.set_terminated(rid, rec["status"])
    return rid


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracking-uri", required=True)
    p.add_argument("--out", type=Path, default=FIXTURE)
    p.add_argument("--study", action="append", help="re-record only this study (repeatable); the rest are kept")
    args = p.parse_args()
    studies = args.study or sorted({ReportSpec.from_yaml(catalog.shipped(n)).study for n in catalog.names()})
    data = export(args.tracking_uri, studies)
    if args.study and args.out.is_file():  # merged into the recording of the other studies
        kept = json.loads(gzip.decompress(args.out.read_bytes()))
        data = {**kept, "studies": {**kept["studies"], **data["studies"]}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(gzip.compress(json.dumps(data, sort_keys=True).encode(), mtime=0))
    counts = {s: len(v["trials"]) for s, v in data["studies"].items()}
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): {counts}")


if __name__ == "__main__":
    main()
