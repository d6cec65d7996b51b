"""The recipes that start from public checkpoints (sweeps/recipes/): DistilBERT and TinyBERT from
bert-base-uncased, FastBERT and Q-BERT fine-tuning it. They check out (as ``ablate train`` and ``sweep
--check`` check a run before anything is written) wherever the hub or the data catalog's ``models:``
has the checkpoint, their sizes are the public models', and one runs at tiny scale with the catalog
mapping ``bert-base-uncased`` to a tiny BERT written locally."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ablate.cli import main
from ablate.datamodules.catalog import ENV
from ablate.lightning_modules.config.errors import DataError
from ablate.lightning_modules.config.experiment import to_dict
from ablate.lightning_modules.config.load import load_config
from ablate.lightning_modules.config.presets import get_preset
from ablate.lightning_modules.interop.pretrained import load_pretrained
from ablate.lightning_modules.measure.accounting import report_for
from ablate.sweeps.checks import check_run
from tests.conftest import SHARED_DATA, documented_catalog
from tests.hub_checkpoints import write_checkpoint

RECIPES = Path(__file__).resolve().parents[2] / "sweeps" / "recipes"
PUBLIC = ["distilbert", "tinybert", "fastbert", "qbert"]


def _catalog(tmp_path: Path, folder: str) -> Path:
    datasets = documented_catalog(SHARED_DATA) if SHARED_DATA.is_dir() else ""
    path = tmp_path / "catalog.yaml"
    path.write_text(datasets + "\n" + yaml.safe_dump({"models": {"bert-base-uncased": folder}}))
    return path


@pytest.mark.parametrize("name", PUBLIC)
def test_a_recipe_checks_out_with_the_catalogs_copy_of_its_checkpoint(name, tmp_path, monkeypatch):
    if not SHARED_DATA.is_dir():
        pytest.skip("the shared data (Wikipedia, SST-2) is not here")
    cfg = load_config(RECIPES / f"{name}.yaml")
    names = {cfg.distill.teacher, cfg.data.tokenizer, cfg.finetune.source} - {None}
    assert names == {"bert-base-uncased"}
    folder = write_checkpoint(tmp_path / "bert", layers=4, hidden=128)  # where the catalog says (its files are read)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["max_position_embeddings"] = 512  # as the public checkpoint: the recipes read 128 tokens
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    monkeypatch.setenv(ENV, str(_catalog(tmp_path, "bert")))
    check_run(cfg, None, None)  # what sweep --check and ablate train check first
    monkeypatch.setenv(ENV, str(_catalog(tmp_path, "gone")))
    with pytest.raises(
        DataError, match=r": bert-base-uncased: ABLATE_DATA_CATALOG: .*models.bert-base-uncased: .*gone"
    ):
        check_run(cfg, None, None)


def test_the_recipes_have_the_public_models_sizes():
    import transformers

    from ablate.lightning_modules.interop.maps import model_config

    _, released = model_config(transformers.BertConfig())  # bert-base-uncased's config.json
    assert to_dict(released) == to_dict(get_preset("bert-base-uncased"))
    assert released.vocab_size == 30522
    tiny = load_config(RECIPES / "tinybert.yaml").model
    assert (tiny.num_layers, tiny.hidden_dim, tiny.ffn_dim, tiny.vocab_size) == (4, 312, 1200, 30522)
    assert abs(report_for(tiny).paper_count - 14.5e6) < 0.3e6  # TinyBERT-4: 14.5M
    student = load_config(RECIPES / "distilbert.yaml").model
    assert to_dict(student) == {**to_dict(released), "num_layers": 6, "token_types": 0, "dropout": student.dropout}


def test_the_distilbert_recipe_runs_from_the_catalogs_bert_base_uncased(tmp_path, monkeypatch, wiki_validation):
    """At tiny scale: the catalog's bert-base-uncased is a 4-layer BERT written locally, the student
    two of its layers (0 and 2) with its embeddings and vocabulary."""
    write_checkpoint(tmp_path / "bert", layers=4)
    monkeypatch.setenv(ENV, str(_catalog(tmp_path, "bert")))
    teacher, _ = load_pretrained(tmp_path / "bert")
    sizes = {k: v for k, v in to_dict(teacher).items() if k != "layers"}
    overrides = [f"model.{k}={v}" for k, v in {**sizes, "num_layers": 2, "token_types": 0}.items() if v is not None]
    overrides += [
        f"data.corpus={wiki_validation}",
        "data.max_length=64",
        "data.batch_size=8",
        "data.num_workers=0",
        f"data.cache_dir={tmp_path / 'cache'}",
        "trainer.max_steps=2",
        "trainer.val_every=2",
        "trainer.val_batches=1",
        "trainer.measure=false",
        "trainer.progress=false",
        f"tracking.root={tmp_path / 'runs'}",
    ]
    monkeypatch.chdir(tmp_path)
    assert main(["train", str(RECIPES / "distilbert.yaml"), *overrides]) == 0
