"""Pruning runs end to end: a small trained model pruned by schuBERT's rounds and by the baselines."""

from __future__ import annotations

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config, load_config
from ablate.lightning_modules.methods.pruning.budget import backbone_params, unit_costs
from ablate.sweeps.engine.runner import train
from tests.sweeps.conftest import trained_run

MODEL = {
    "preset": "bert-tiny",
    "vocab_size": 1000,
    "embed_dim": 32,
    "hidden_dim": 32,
    "num_layers": 2,
    "num_heads": 4,
    "ffn_dim": 64,
    "max_position": 64,
    "dropout": 0.0,
}


@pytest.fixture(scope="module")
def source_run(tmp_path_factory, wiki_validation):
    return trained_run(tmp_path_factory.mktemp("prune"), wiki_validation, MODEL)


def _pruned(base: dict, source: str, **prune) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["prune"] = {"source": source, "rounds": 2, "gate_steps": 3, "finetune_steps": 3, **prune}
    return tree


@pytest.mark.parametrize(("method", "target"), [("schubert-all", 0.7), ("schubert-f", 0.9)])
def test_schubert_rounds_follow_the_plan_and_shrink_for_real(source_run, method, target, tmp_path):
    base, source = source_run
    cfg = build_config(_pruned(base, f"runs:/{source.run_id}", method=method, target=target))
    result = train(cfg)
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.source_run"] == source.run_id
    start = backbone_params(build_config(base).model)
    eta = round(target * start)
    history = [m.value for m in sorted(client.get_metric_history(result.run_id, "prune/params"), key=lambda m: m.step)]
    assert history[0] == start and len(history) == 3
    for r, count in enumerate(history[1:], start=1):  # within one unit's worth of the round's plan
        plan = round(start - r * (start - eta) / 2)
        assert plan - max(max(v) for v in unit_costs(build_config(base).model).values()) < count <= plan
    assert run.data.metrics["params.backbone"] == history[-1]
    # the outcome: a config with per-layer dimensions that `ablate train` can train from scratch
    local = client.download_artifacts(result.run_id, "model", str(tmp_path))
    pruned = load_config(f"{local}/config.yaml")
    assert pruned.model.layers is not None and backbone_params(pruned.model) == history[-1]
    if method == "schubert-f":  # only the FFN had gates
        assert all((s.num_heads, s.qk_dim, s.v_dim) == (4, 8, 8) for s in pruned.model.layers)
        assert pruned.model.hidden_dim == 32
    dims = client.download_artifacts(result.run_id, "dims.md", str(tmp_path))
    assert "| layer | heads a | qk k | value v | ffn f |" in open(dims).read()
    assert run.data.metrics["flops_per_token"] < run.data.metrics["source/flops_per_token"]
    scratch = tmp_path / "scratch.yaml"
    scratch.write_text(
        yaml.safe_dump(
            {
                **base,
                "model": {k: v for k, v in vars(pruned.model).items() if k != "layers"}
                | {"layers": [vars(s) for s in pruned.model.layers]},
                "trainer": {**base["trainer"], "max_steps": 2, "val_every": 2},
            }
        )
    )
    assert main(["train", str(scratch)]) == 0


@pytest.mark.parametrize(("method", "layers"), [("uniform", 2), ("fewer-layers", 1)])
def test_baselines_reach_the_target_at_once(source_run, method, layers):
    base, source = source_run
    result = train(build_config(_pruned(base, f"runs:/{source.run_id}", method=method, target=0.6)))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    start = backbone_params(build_config(base).model)
    assert run.data.metrics["params.backbone"] < start
    assert run.data.tags["ablate.pruned_layers"].count("/") == 3 * layers
    steps = [m.step for m in client.get_metric_history(result.run_id, "train/loss")]
    assert max(steps) < 2 * 3  # fine-tuned rounds x finetune_steps, once


def test_a_bad_source_is_one_line_and_no_run(source_run, tmp_path, capsys):
    base, source = source_run
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_pruned(base, "runs:/ffffffffffffffffffffffffffffffff")))
    assert main(["train", str(path)]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("error: prune.source: run ffffffffffffffffffffffffffffffff: no such run")
    )


def test_a_source_with_shared_layers_is_refused_before_the_run(tmp_path, wiki_validation, capsys):
    base, source = trained_run(tmp_path, wiki_validation, {**MODEL, "sharing": "all"})
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(_pruned(base, f"runs:/{source.run_id}", method="schubert-f")))
    client = MlflowClient(source.tracking_uri)
    before = len(client.search_runs([e.experiment_id for e in client.search_experiments()]))
    capsys.readouterr()  # the source's training said its phase
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: prune.source: model.sharing:"), err
    assert len(client.search_runs([e.experiment_id for e in client.search_experiments()])) == before  # no run
