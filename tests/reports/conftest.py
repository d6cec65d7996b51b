"""Fixtures: a real MLflow SQLite store holding one study, and a report spec for it."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from ablate.reports.spec import ReportSpec
from tests.reports.report_fixtures import STUDY, TRIALS, Store, log_trial


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment(STUDY, artifact_location=(root / "art").as_uri())
    parent = client.create_run(exp_id, run_name=STUDY, tags={"ablate.role": "study", "ablate.study": STUDY})
    s = Store(uri, root, exp_id, parent.info.run_id)
    s.trial_ids = [log_trial(client, exp_id, s.parent_id, i, t) for i, t in enumerate(TRIALS)]
    # a run of another study in the same experiment must be ignored
    other = client.create_run(exp_id, tags={"ablate.role": "trial", "ablate.study": "other"})
    client.set_terminated(other.info.run_id, "FINISHED")
    client.set_terminated(s.parent_id, "FINISHED")
    return s


@pytest.fixture()
def spec() -> ReportSpec:
    return ReportSpec.from_mapping(
        {
            "title": "Embedding size & sharing",
            "rows": ["model.sharing", "model.embed_dim", "model.num_ffn"],
            "row_labels": {"model.embed_dim": "E", "model.num_ffn": "F"},
            "metrics": [
                {"name": "params.backbone", "label": "Params", "format": "millions", "better": "lower"},
                {"name": "val/mlm_acc", "label": "MLM acc", "format": "percent", "better": "higher"},
                {"name": "val/sentence_acc", "label": "SOP acc", "format": "percent", "better": "higher"},
                {"name": "val/loss", "label": "Val loss", "digits": 2, "better": "lower"},
            ],
            "plots": [
                {"x": "params.backbone", "y": "val/mlm_acc", "logx": True, "hue": "model.sharing"},
                {"x": "model.embed_dim", "y": "val/loss"},
            ],
        }
    )
