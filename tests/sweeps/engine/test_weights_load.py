"""A run's saved model read back: a finished run's is downloaded once per process and each caller gets a copy
of its own; reading it, from the store or from that copy, draws nothing from torch's generator, so a study's
later tasks get the numbers a fresh process would; a run that ends again is read again."""

from __future__ import annotations

import torch

from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.model.heads import build_pretraining_model
from ablate.sweeps.engine import tracking, weights

SMALL = ModelConfig(
    vocab_size=300, embed_dim=16, hidden_dim=32, num_layers=2, num_heads=2, ffn_dim=64, max_position=32, dropout=0.0
)


def _saved(tmp_path, finished: bool = True) -> tuple[str, str, torch.nn.Module]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = tracking.connect(uri)
    cfg = ExperimentConfig(model=SMALL)
    model = build_pretraining_model(cfg.model, cfg.objective)
    run_id = tracking.start_run(client, tracking.experiment_id(client, "ablate", uri), "pretrain", {})
    weights.log_weights(client, run_id, model, cfg)
    if finished:
        client.set_terminated(run_id, "FINISHED")
    return uri, run_id, model


def _equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_a_finished_run_is_read_once_and_each_caller_gets_its_own_copy(tmp_path, monkeypatch) -> None:
    uri, run_id, saved = _saved(tmp_path)
    weights._finished_run.cache_clear()
    downloads = []
    real = weights._download
    monkeypatch.setattr(weights, "_download", lambda client, rid: downloads.append(rid) or real(client, rid))
    _, first = weights.load_run_weights(uri, run_id)
    _, second = weights.load_run_weights(uri, run_id)
    assert downloads == [run_id]  # the second came from the process's copy
    assert first is not second and _equal(first, saved) and _equal(second, saved)
    with torch.no_grad():
        next(first.parameters()).add_(1.0)  # a caller trains its own
    assert _equal(second, saved)
    _, third = weights.load_run_weights(uri, run_id)
    assert _equal(third, saved)


def test_reading_a_run_draws_nothing_from_the_generator_cached_or_not(tmp_path) -> None:
    uri, run_id, _ = _saved(tmp_path)
    weights._finished_run.cache_clear()
    for _ in range(2):  # downloaded, then from the process's copy
        torch.manual_seed(7)
        weights.load_run_weights(uri, run_id)
        drawn = torch.rand(3)
        torch.manual_seed(7)
        assert torch.equal(drawn, torch.rand(3))


def test_a_run_not_finished_is_read_each_time_and_one_that_ends_again_is_read_anew(tmp_path) -> None:
    uri, run_id, saved = _saved(tmp_path, finished=False)
    weights._finished_run.cache_clear()
    weights.load_run_weights(uri, run_id)
    assert weights._finished_run.cache_info().currsize == 0  # RUNNING: its weights may still change
    client = tracking.connect(uri)
    client.set_terminated(run_id, "FINISHED", end_time=1_000)
    _, before = weights.load_run_weights(uri, run_id)
    changed = build_pretraining_model(SMALL, ExperimentConfig(model=SMALL).objective)  # other random weights
    weights.log_weights(client, run_id, changed, ExperimentConfig(model=SMALL))  # a resumed run saves anew
    client.set_terminated(run_id, "FINISHED", end_time=2_000)
    _, after = weights.load_run_weights(uri, run_id)
    assert _equal(before, saved) and _equal(after, changed) and not _equal(after, saved)
