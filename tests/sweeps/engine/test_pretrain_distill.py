"""A tiny teacher -> student distillation end to end: real corpus, real MLflow store, the CLI; a student
with its own, smaller vocabulary (Zhao et al.) exported as a transformers model with its tokenizer."""

from __future__ import annotations

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine.runner import train
from tests.sweeps.conftest import trained_run

TEACHER = {
    "preset": "ibbert-mini",
    "vocab_size": 1000,
    "embed_dim": 16,
    "hidden_dim": 32,
    "intra_dim": 64,
    "num_layers": 2,
    "num_heads": 2,
    "ffn_dim": 128,
    "max_position": 64,
}
STUDENT = {
    "preset": "mobilebert-mini",
    "vocab_size": 1000,
    "embed_dim": 16,
    "hidden_dim": 32,
    "intra_dim": 16,
    "num_layers": 2,
    "num_heads": 2,
    "ffn_dim": 32,
    "max_position": 64,
}


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory, wiki_validation):
    tmp = tmp_path_factory.mktemp("distill")
    base, result = trained_run(tmp, wiki_validation, TEACHER)
    return tmp, base, result


def _student(base: dict, teacher: str, **distill) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["model"] = STUDENT
    tree["trainer"].update(max_steps=8, val_every=4)
    tree["distill"] = {"teacher": teacher, **distill}
    return tree


@pytest.mark.parametrize("strategy", ["auxiliary", "progressive"])
def test_student_distils_from_a_teacher_run(teacher_run, strategy):
    tmp, base, teacher = teacher_run
    cfg = build_config(_student(base, f"runs:/{teacher.run_id}", strategy=strategy, stage_steps=2))
    result = train(cfg)
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["ablate.teacher_run"] == teacher.run_id
    assert run.data.params["distill.teacher"] == f"runs:/{teacher.run_id}"
    assert run.data.params["distill.strategy"] == strategy
    for name in ("train/fmt_loss", "train/at_loss", "train/kd_loss", "train/mlm_loss", "val/mlm_loss"):
        assert name in run.data.metrics, name
    stages = [(m.step, m.value) for m in client.get_metric_history(result.run_id, "distill/stage")]
    if strategy == "progressive":  # layer 0 [0, 2), layer 1 [2, 4), pd [4, 8)
        assert stages == [(0, 0.0), (2, 1.0), (4, 2.0)]
        assert run.data.tags["ablate.stages"] == "layer 0 [0, 2): fmt+at; layer 1 [2, 4): fmt+at; pd [4, 8): pd"
        kd_steps = [m.step for m in client.get_metric_history(result.run_id, "train/kd_loss")]
        assert kd_steps and min(kd_steps) >= 4  # PD's curve starts at its stage, with no stale values before
    else:
        assert stages == [(0, 0.0)]
    # the student's weights are the run's model, not the teacher's
    names = {f.path for f in client.list_artifacts(result.run_id, "model")}
    assert names == {
        "model/model.safetensors",
        "model/config.yaml",
        "model/tokenizer.json",
        "model/tokenizer_config.json",
    }


def test_cli_errors_name_the_teacher(teacher_run, capsys, tmp_path):
    tmp, base, teacher = teacher_run
    cases = {
        "runs:/0123456789abcdef0123456789abcdef": "distill.teacher: run 0123456789abcdef0123456789abcdef: no such run",
        str(tmp_path / "nowhere"): "distill.teacher: " + str(tmp_path / "nowhere") + ": no such checkpoint folder",
    }
    client = MlflowClient(teacher.tracking_uri)
    before = len(client.search_runs([r.info.experiment_id for r in [client.get_run(teacher.run_id)]]))
    for source, message in cases.items():
        path = tmp_path / "student.yaml"
        path.write_text(yaml.safe_dump(_student(base, source)))
        assert main(["train", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and message in err[-1], err
    after = len(client.search_runs([client.get_run(teacher.run_id).info.experiment_id]))
    assert after == before  # nothing half-written: no run was created


def test_a_teacher_with_another_tokenizer_is_refused(teacher_run):
    tmp, base, teacher = teacher_run
    tree = _student(base, f"runs:/{teacher.run_id}")
    tree["data"]["lowercase"] = not build_config(base).data.lowercase  # a different vocabulary
    with pytest.raises(ConfigError, match="different tokenizer"):
        train(build_config(tree))


# Zhao et al.: a student with its own vocabulary (500 tokens, the teacher's 1000), dual training and
# one projection shared by every layer (H 16 -> the teacher's 32)
ZHAO_STUDENT = {
    "preset": "bert-tiny",
    "vocab_size": 500,
    "embed_dim": 16,
    "hidden_dim": 16,
    "num_layers": 2,
    "num_heads": 2,
    "ffn_dim": 32,
    "max_position": 64,
}


def test_a_student_with_its_own_vocabulary_trains_and_exports_with_its_tokenizer(teacher_run, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    import torch

    from ablate.sweeps.engine.weights import load_run_weights

    _, base, teacher = teacher_run
    tree = _student(base, f"runs:/{teacher.run_id}", projection="shared", cos_weight=1.0)
    tree["model"] = ZHAO_STUDENT
    tree["trainer"].update(max_steps=4, val_every=4)
    path = tmp_path / "zhao.yaml"
    path.write_text(yaml.safe_dump(tree))
    assert main(["train", str(path)]) == 0
    client = MlflowClient(teacher.tracking_uri)
    experiment = client.get_run(teacher.run_id).info.experiment_id
    (run,) = client.search_runs([experiment], filter_string="params.`model.vocab_size` = '500'")
    assert run.info.status == "FINISHED" and run.data.tags["ablate.teacher_run"] == teacher.run_id
    params, metrics = run.data.params, run.data.metrics
    assert (params["distill.mix_prob"], params["distill.dual_weight"], params["distill.projection"]) == (
        "0.5",
        "1.0",
        "shared",
    )
    for name in ("train/dual_loss", "train/kd_loss", "train/mlm_loss", "train/fmt_loss", "train/cos_loss"):
        assert name in metrics, name
    assert 0.9 < metrics["distill/vocab_coverage"] <= 1.0  # the same corpus: nearly every token is the teacher's

    out = tmp_path / "hf"
    capsys.readouterr()
    assert main(["export", run.info.run_id, str(out), "--tracking-uri", teacher.tracking_uri]) == 0
    assert "transformers format" in capsys.readouterr().out
    tok = transformers.AutoTokenizer.from_pretrained(out)
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    assert len(tok) == mlm.config.vocab_size == 500  # the student's own tokenizer, not the teacher's 1000
    enc = tok("The capital of France is [MASK].", return_tensors="pt")
    _, ours = load_run_weights(teacher.tracking_uri, run.info.run_id)
    ours.eval()
    with torch.no_grad():
        hidden = ours.encoder(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"].bool())[0]
        mine = ours.mlm_head(hidden, ours.encoder.embeddings.word.weight)
        theirs = mlm(**enc).logits[0]
    assert (mine - theirs).abs().max() < 1e-4
