"""Test data for the reports tests: one study logged to MLflow exactly as the sweep contract says."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Metric, Param

STUDY = "emb-sharing"

BACKBONE = {
    ("all", 64): 4.1e6,
    ("all", 128): 4.6e6,
    ("none", 64): 11.2e6,
    ("none", 128): 11.7e6,
    ("attn", 64): 7.0e6,
    ("ffn", 64): 6.5e6,
}

# (sharing, embed_dim, num_ffn, seed, state, final metrics)
TRIALS = [
    ("all", 64, 1, 1, "COMPLETE", {"val/mlm_acc": 0.60, "val/loss": 2.0, "val/sentence_acc": 0.80}),
    ("all", 64, 1, 2, "COMPLETE", {"val/mlm_acc": 0.62, "val/loss": 1.9, "val/sentence_acc": 0.82}),
    ("none", 128, 1, 1, "COMPLETE", {"val/mlm_acc": 0.64, "val/loss": 1.8}),  # no sentence_acc
    ("all", 128, 1, 1, "COMPLETE", {"val/mlm_acc": 0.63, "val/loss": 1.85, "val/sentence_acc": 0.81}),
    ("none", 64, 1, 1, "COMPLETE", {"val/mlm_acc": 0.65, "val/loss": 1.7, "val/sentence_acc": 0.84}),
    ("none", 64, 1, 2, "COMPLETE", {"val/mlm_acc": 0.67, "val/loss": 1.6, "val/sentence_acc": 0.86}),
    ("none", 128, 1, 2, "FAIL", {}),
    ("attn", 64, 2, 1, "FAIL", {}),
    ("ffn", 64, 1, 1, "PRUNED", {"val/mlm_acc": 0.30}),
]


@dataclass
class Store:
    uri: str
    root: Path
    experiment_id: str
    parent_id: str
    trial_ids: list[str] = field(default_factory=list)

    def client(self) -> MlflowClient:
        return MlflowClient(tracking_uri=self.uri)


def log_trial(client: MlflowClient, exp_id: str, parent: str, number: int, trial: tuple) -> str:
    sharing, embed, ffn, seed, state, metrics = trial
    run = client.create_run(
        exp_id,
        run_name=f"embed_dim={embed} sharing={sharing} seed={seed}",
        tags={
            "mlflow.parentRunId": parent,
            "ablate.role": "trial",
            "ablate.study": STUDY,
            "ablate.trial": str(number),
            "ablate.state": state,
        },
    )
    rid = run.info.run_id
    params = {
        "model.embed_dim": embed,
        "model.sharing": sharing,
        "model.num_ffn": ffn,
        "seed": seed,
        "data.corpus": "norvig-big",
        "model.dropout": 0.1,
        "model.intra_dim": None,
    }
    backbone = BACKBONE[(sharing, embed)]
    static = {
        "params.backbone": backbone,
        "params.embedding": 30000 * embed,
        "params.heads": 1.5e6,
        "flops_per_token": 2 * backbone * 1.3,
    }
    logged = [Metric(k, v, 0, 0) for k, v in static.items()]
    logged += [Metric("train/loss", 5.0 - step, 1000 + step, step) for step in range(3)]
    for name, value in metrics.items():  # an early value, then the final one
        logged += [Metric(name, value / 2, 1000, 0), Metric(name, value, 2000, 1)]
    client.log_batch(rid, metrics=logged, params=[Param(k, str(v)) for k, v in params.items()])
    client.set_terminated(rid, "FAILED" if state == "FAIL" else "FINISHED")
    return rid
