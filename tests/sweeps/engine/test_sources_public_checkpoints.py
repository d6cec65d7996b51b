"""Public checkpoints as starting points, in every regime: tiny BERTs written locally with transformers
(real architecture, config and tokenizer files, random weights) and named by hub names that the data
catalog's ``models:`` maps to their folders, with their own tokenizer (``data.tokenizer``): pre-training
continued, a student distilled keeping the teacher's vocabulary, pruning, a fine-tuned model quantized;
and the inputs refused before any run exists."""

from __future__ import annotations

import os

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.datamodules.catalog import ENV
from ablate.lightning_modules.config.experiment import to_dict
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.interop.pretrained import load_pretrained, state_dict
from ablate.sweeps.engine import weights
from ablate.sweeps.engine.runner import train
from tests.conftest import SHARED_DATA, documented_catalog
from tests.hub_checkpoints import SPECIALS, vocabulary, write_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")
BERT, TEACHER, SST2_BERT = "acme/bert-tiny", "acme/bert-tiny-4", "acme/bert-tiny-sst2"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, wiki_validation):
    """The folders, a catalog naming them (and the shared data), the base tree of a run."""
    tmp = tmp_path_factory.mktemp("public")
    write_checkpoint(tmp / "bert")
    write_checkpoint(tmp / "bert4", layers=4, seed=1)
    write_checkpoint(tmp / "bert-sst2", classifier=True, vocab_only=True, seed=2)  # vocab.txt only
    tokens = vocabulary()
    write_checkpoint(tmp / "other", tokens=[*SPECIALS, *reversed(tokens[len(SPECIALS) :])])  # same size, other ids
    (tmp / "empty").mkdir()
    catalog = tmp / "catalog.yaml"
    models = {BERT: "bert", TEACHER: "bert4", SST2_BERT: "bert-sst2", "acme/other": "other"}
    datasets = documented_catalog(SHARED_DATA) if SHARED_DATA.is_dir() else ""
    catalog.write_text(datasets + "\n" + yaml.safe_dump({"models": models}))
    model, _ = load_pretrained(tmp / "bert")
    base = {
        "model": to_dict(model),
        "objective": {"sentence": "nsp"},
        "data": {
            "corpus": str(wiki_validation),
            "tokenizer": BERT,
            "max_length": 64,
            "batch_size": 8,
            "num_workers": 0,
            "shuffle_buffer": 20,
            "cache_dir": str(tmp / "cache"),
        },
        "optim": {"lr": 1e-8, "warmup_steps": 1},  # the weights stay the checkpoint's, to the 6th digit
        "trainer": {"max_steps": 2, "val_every": 2, "val_batches": 1, "progress": False, "measure": False},
        "tracking": {"root": str(tmp / "runs")},
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, str(catalog))
        yield tmp, base


def _tree(base: dict, **sections) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    for key, value in sections.items():
        tree[key] = {**tree.get(key, {}), **value} if isinstance(value, dict) else value
    return tree


def _close(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], prefix: str) -> None:
    keys = [k for k in theirs if k.startswith(prefix)]
    assert keys and all(torch.allclose(ours[k], theirs[k], atol=1e-5) for k in keys)


def _run(result):
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    return run


def _logged_vocab(result, tmp) -> dict[str, int]:
    from tokenizers import Tokenizer

    path = weights.run_tokenizer(MlflowClient(result.tracking_uri), result.run_id, tmp)
    assert path is not None
    return Tokenizer.from_file(str(path)).get_vocab()


def test_pre_training_continues_from_a_public_checkpoint(hub, tmp_path):
    tmp, base = hub
    result = train(build_config(_tree(base, init_from=BERT)))
    run = _run(result)
    assert "via ABLATE_DATA_CATALOG" in run.data.tags["ablate.data.tokenizer"]
    assert _logged_vocab(result, tmp_path) == {t: i for i, t in enumerate(vocabulary())}
    _, model = weights.load_run_weights(result.tracking_uri, result.run_id)
    _, checkpoint = load_pretrained(tmp / "bert")
    _close(state_dict(model), state_dict(checkpoint), "")  # every weight: the checkpoint's, trained on


def test_a_student_distilled_from_a_public_teacher_keeps_its_vocabulary(hub, tmp_path):
    tmp, base = hub
    tree = _tree(
        base,
        distill={"teacher": TEACHER, "init_layers": "every_other", "init_embeddings": "all", "cos_weight": 1.0},
    )
    result = train(build_config(tree))
    run = _run(result)
    assert run.data.tags["ablate.teacher_run"] == TEACHER
    assert _logged_vocab(result, tmp_path) == {t: i for i, t in enumerate(vocabulary())}
    _, student = weights.load_run_weights(result.tracking_uri, result.run_id)
    _, teacher = load_pretrained(tmp / "bert4")
    _close(state_dict(student), state_dict(teacher), "encoder.embeddings.")  # DistilBERT: the teacher's embeddings
    s, t = state_dict(student), state_dict(teacher)
    second = [k for k in s if ".1." in k and k.startswith("encoder.")]  # student layer i: teacher layer 2i
    assert second and all(torch.allclose(s[k], t[k.replace(".1.", ".2.")], atol=1e-5) for k in second)


def test_pruning_a_public_checkpoint(hub):
    _, base = hub
    prune = {"source": BERT, "method": "uniform", "target": 0.7, "rounds": 1, "gate_steps": 2, "finetune_steps": 2}
    result = train(build_config(_tree(base, prune=prune)))
    m = _run(result).data.metrics
    assert m["params.backbone"] < 0.8 * m["source/params.backbone"]


def test_the_quant_regime_quantizes_a_public_checkpoint(hub):
    _, base = hub
    result = train(build_config(_tree(base, quant={"source": BERT, "method": "dynamic-int8"})))
    m = _run(result).data.metrics
    assert m["quant/layers"] > 0 and m["model_bytes"] < m["quant/fp32_model_bytes"]


def test_quantizing_a_public_fine_tuned_model_read_from_vocab_txt(hub, tmp_path):
    if not SHARED_DATA.is_dir():
        pytest.skip("SST-2 is not here")
    tmp, base = hub
    task = {
        "source": SST2_BERT,
        "train": "nyu-mll/glue:sst2",
        "train_examples": 64,
        "validation_examples": 64,
        "max_length": 32,
        "batch_size": 16,
        "max_steps": 4,
        "val_every": 2,
        "lr": 1e-4,
    }
    tree = _tree(base, finetune=task, quant={"method": "dynamic-int8"})
    del tree["data"]["tokenizer"]  # the source's own vocab.txt
    result = train(build_config(tree))
    m = _run(result).data.metrics
    assert "sst2/fp32_accuracy" in m and 0.0 <= m["sst2/final_accuracy"] <= 1.0
    assert _logged_vocab(result, tmp_path) == {t: i for i, t in enumerate(vocabulary())}
    assert m["model_bytes"] > 0


CASES = {
    "vocab size": (
        {"model": {"vocab_size": 30522}},
        "error: model.vocab_size: 30522, but data.tokenizer acme/bert-tiny has {size} tokens "
        "(set model.vocab_size={size})",
    ),
    "no vocabulary": ({"data": {"tokenizer": "{tmp}/empty"}}, "error: data.tokenizer: {tmp}/empty: no vocabulary in"),
    "teacher": (
        {"data": {"tokenizer": "acme/other"}, "distill": {"teacher": TEACHER}},
        f"error: distill.teacher: {TEACHER} was trained with a different tokenizer than this run's (set data.tokenizer",
    ),
    "init_from": (
        {"data": {"tokenizer": "acme/other"}, "init_from": BERT},
        f"error: init_from: {BERT} is a different tokenizer than this run's (set data.tokenizer",
    ),
    "finetune.source": (
        {
            "data": {"tokenizer": "acme/other"},
            "finetune": {"source": SST2_BERT, "train": "nyu-mll/glue:sst2", "max_length": 64},
        },
        f"error: finetune.source: {SST2_BERT} was trained with a different tokenizer than this run's",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_inputs_are_one_line_before_any_run_exists(hub, case, tmp_path, monkeypatch, capsys):
    tmp, base = hub
    sections, expected = CASES[case]
    tree = _tree(base, **sections, tracking={"root": str(tmp_path / "runs")})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(tree).replace("{tmp}", str(tmp)))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "run.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    size = len(vocabulary())
    assert len(err.splitlines()) == 1 and err.startswith(expected.format(tmp=tmp, size=size)), err
    assert sorted(os.listdir(tmp_path)) == ["run.yaml"]  # no runs/ (MLflow's store), no mlruns/
