"""``ablate export RUN OUT_DIR``: a run's logged weights become a transformers checkpoint or an ablate export."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from ablate.cli import main  # noqa: E402
from ablate.lightning_modules.config import ExperimentConfig, ModelConfig  # noqa: E402
from ablate.lightning_modules.heads import build_pretraining_model  # noqa: E402
from ablate.lightning_modules.interop import load_pretrained  # noqa: E402
from ablate.sweeps import tracking  # noqa: E402
from ablate.sweeps.weights import load_run_weights, log_weights  # noqa: E402

SMALL = dict(
    vocab_size=500, embed_dim=16, hidden_dim=32, num_layers=2, num_heads=2, ffn_dim=64, max_position=32, dropout=0.0
)


def test_export_from_a_run(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.connect(uri)
    exp = tracking.experiment_id(client, "ablate", uri)
    runs = {}
    for name, sharing in [("albert", "all"), ("attn", "attn")]:
        model_cfg = ModelConfig(**SMALL, sharing=sharing)
        cfg = ExperimentConfig(model=model_cfg)
        model = build_pretraining_model(cfg.model, cfg.objective)
        run_id = tracking.start_run(client, exp, name, {})
        log_weights(client, run_id, model, cfg)
        runs[name] = (run_id, model)
    bare = tracking.start_run(client, exp, "no weights", {})

    loaded_cfg, loaded = load_run_weights(uri, runs["attn"][0])
    assert loaded_cfg.model.sharing == "attn"
    assert all(
        torch.equal(a, b)
        for a, b in zip(runs["attn"][1].state_dict().values(), loaded.state_dict().values(), strict=False)
    )

    for name, fmt, marker in [("albert", "transformers", "config.json"), ("attn", "ablate", "model.safetensors")]:
        out = tmp_path / f"out-{name}"
        assert main(["export", runs[name][0], str(out), "--tracking-uri", uri]) == 0
        assert f"({fmt} format)" in capsys.readouterr().out
        assert (out / marker).is_file() and (out / "ablate.yaml").is_file()
        cfg, _ = load_pretrained(out)
        assert cfg.sharing == ("all" if name == "albert" else "attn")

    for args, needle in [
        ([bare, str(tmp_path / "x")], f"error: run {bare}: saved no weights"),
        (["0" * 32, str(tmp_path / "x")], "error: run 00000000000000000000000000000000: no such run"),
        ([runs["attn"][0], str(tmp_path / "out-attn")], "already exists"),
        ([bare, str(tmp_path / "x"), "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"], "no MLflow store there"),
    ]:
        if "--tracking-uri" not in args:
            args = [*args, "--tracking-uri", uri]
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists() and not (tmp_path / "none.db").exists()
