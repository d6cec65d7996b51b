"""Bad input: one line ``error: ...`` naming the key or file, exit status 2, no traceback, nothing written."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from ablate.cli import main
from tests import forked
from tests.sweeps.conftest import write_study


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """``ablate ARGS`` in a process of its own (tests/forked.py)."""
    return forked.run(args, cwd=cwd or os.getcwd(), env=os.environ, timeout=300)


def test_params_json_matches_published_cell():
    proc = run_cli("params", "albert-base", "model.sharing=none", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {"backbone", "embedding", "encoder", "heads", "flops_per_token"} <= set(out)
    assert abs(out["paper_count"] - 89e6) <= 1.1e6  # ALBERT Table 4, E=128, not shared
    assert out["backbone"] == out["embedding"] + out["encoder"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["params", "albert-base", "model.num_heads=7"], "error: model.num_heads:"),
        (["params", "albert-base", "model.embed_dim=0"], "error: model.embed_dim:"),
        (["params", "albert-base", "model.sharing=half"], "error: model.sharing:"),
        (["params", "albert-base", "model.colour=red"], "error: model.colour: unknown key"),
        (["params", "albert-base", "model.embed_dim"], "expected key=value"),
        (["params", "no-such-preset"], "error: no-such-preset:"),
        (["train", "missing.yaml"], "error: missing.yaml: no such file"),
        (["params", "mobilebert", "model.num_heads=3"], "error: model.num_heads: intra_dim 128 is not divisible"),
        (["params", "mobilebert", "model.embed_dim=1024"], "error: model.embed_dim: a trigram embedding needs E <= H"),
        (["params", "bert-base", "model.attention_input=shared_qk"], "error: model.attention_input:"),
        (
            [
                "params",
                "bert-base",
                "model.sharing=all",
                "model.num_layers=2",
                "model.layers=[{num_heads: 12, qk_dim: 64, v_dim: 64, ffn_dim: 3072}, "
                "{num_heads: 6, qk_dim: 64, v_dim: 64, ffn_dim: 3072}]",
            ],
            "error: model.sharing: 'all' shares modules across layers, but model.layers differ at layer 1",
        ),
        (
            [
                "params",
                "bert-base",
                "model.num_layers=2",
                "model.layers=[{num_heads: 12, qk_dim: 0, v_dim: 64, ffn_dim: 1}, "
                "{num_heads: 12, qk_dim: 64, v_dim: 64, ffn_dim: 1}]",
            ],
            "error: model.layers[0].qk_dim: Input should be greater than 0",
        ),
    ],
)
def test_cli_errors_are_one_line(args, needle, tmp_path):
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ablate-runs").exists()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"search": {"model.colour": {"choices": [1]}}}, "search.model.colour: not a config field"),
        ({"search": {"optim.lr": {"low": 1e-4, "high": 1e-2}}}, "search.optim.lr: the grid sampler needs"),
        ({"search": {"model.sharing": {"choices": []}}}, "empty search space"),
        (
            {"search": {"model.hidden_dim": {"choices": [32, 33]}}},
            "search.model.hidden_dim=33: model.hidden_dim: hidden_dim 33",
        ),
        ({"sampler": "tpe"}, "n_trials: required"),
        ({"pruner": {"type": "sometimes"}}, "pruner.type"),
        ({"optimize": {"direction": "up"}}, "optimize.direction"),
    ],
)
def test_bad_studies_fail_before_anything_runs(tmp_path, change, needle, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here. Another one there.\n\nA second document. With two sentences.\n")
    path = write_study(tmp_path, corpus)
    study = yaml.safe_load(path.read_text())
    study.update(change)
    path.write_text(yaml.safe_dump(study))
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err, err
    assert not (tmp_path / "runs").exists()


def test_bad_yaml_names_the_file(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nsearch: {model.sharing: [all\n")
    assert main(["sweep", str(path)]) == 2
    assert "broken.yaml: invalid YAML at line" in capsys.readouterr().err


def test_missing_corpus_names_the_file(tmp_path, capsys):
    path = write_study(tmp_path, tmp_path / "nowhere.jsonl.gz")
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert "nowhere.jsonl.gz" in err and err.startswith("error: ")
