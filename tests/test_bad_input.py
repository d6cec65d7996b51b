"""Bad input, everywhere: one line ``error: ...``, exit status 2, no traceback, nothing created.

Config YAML, studies, corpora, checkpoints and storage URLs, each through the real CLI
(``ablate.cli.main``) in a fresh folder; afterwards no MLflow run and no Optuna trial
exists there (an unreachable store is reported before anything is written).
"""

from __future__ import annotations

import gzip
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.configio import build_config
from ablate.lightning_modules.heads import build_pretraining_model
from ablate.lightning_modules.interop import export
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import tiny_base

WIKI = SHARED_DATA / "wiki-en" / "validation-00-of-01.jsonl.gz"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """An export folder of an (untrained) tiny ALBERT, as ``ablate export`` writes it."""
    root = tmp_path_factory.mktemp("ckpt")
    cfg = build_config(tiny_base(root, WIKI))
    export(build_pretraining_model(cfg.model, cfg.objective), cfg, root / "model")
    return root / "model"


def _config(tmp: Path, **sections) -> dict:
    tree = tiny_base(tmp, WIKI)
    for section, values in sections.items():
        tree[section] = {**tree.get(section, {}), **values} if isinstance(values, dict) else values
    return tree


def _write(tmp: Path, tree: object, name: str = "cfg.yaml") -> str:
    path = tmp / name
    path.write_text(tree if isinstance(tree, str) else yaml.safe_dump(tree), encoding="utf-8")
    return str(path)


def _train(**sections) -> Callable[[Path, Path], list[str]]:
    return lambda tmp, ckpt: ["train", _write(tmp, _config(tmp, **sections))]


def _corpus(content: bytes, name: str, **data) -> Callable[[Path, Path], list[str]]:
    def make(tmp: Path, ckpt: Path) -> list[str]:
        (tmp / name).write_bytes(content)
        return ["train", _write(tmp, _config(tmp, data={"corpus": str(tmp / name), **data}))]

    return make


def _study(**changes) -> Callable[[Path, Path], list[str]]:
    def make(tmp: Path, ckpt: Path) -> list[str]:
        study = {
            "name": "bad",
            "base": _config(tmp),
            "search": {"model.sharing": {"choices": ["all", "none"]}},
            **changes,
        }
        return ["sweep", _write(tmp, study, "study.yaml")]

    return make


def _sweep_with(*flags: str) -> Callable[[Path, Path], list[str]]:
    def make(tmp: Path, ckpt: Path) -> list[str]:
        study = {"name": "bad", "base": _config(tmp), "search": {"model.sharing": {"choices": ["all"]}}}
        return ["sweep", _write(tmp, study, "study.yaml"), *flags]

    return make


def _truncated(tmp: Path, ckpt: Path) -> list[str]:
    folder = tmp / "truncated"
    shutil.copytree(ckpt, folder)
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])
    return _train(init_from=str(folder))(tmp, ckpt)


def _other_architecture(tmp: Path, ckpt: Path) -> list[str]:
    tree = _config(tmp, init_from=str(ckpt))
    tree["model"] = {**tree["model"], "hidden_dim": 64, "ffn_dim": 128}
    return ["train", _write(tmp, tree)]


def _teacher_tokenizer_mismatch(tmp: Path, ckpt: Path) -> list[str]:
    folder = tmp / "teacher"
    shutil.copytree(ckpt, folder)
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(
        models.WordPiece({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "the": 5}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    return _train(distill={"teacher": str(folder)})(tmp, ckpt)


def _latin1() -> bytes:
    return ("Élève très âgé. " * 400).encode("latin-1")


CASES: dict[str, tuple[Callable[[Path, Path], list[str]], str]] = {
    # config YAML
    "yaml syntax": (lambda tmp, c: ["train", _write(tmp, "model: {preset: bert-tiny\n")], "cfg.yaml"),
    "yaml not a mapping": (lambda tmp, c: ["train", _write(tmp, "- a\n- b\n")], "cfg.yaml"),
    "yaml empty": (lambda tmp, c: ["train", _write(tmp, "")], "cfg.yaml"),
    "config missing": (lambda tmp, c: ["train", str(tmp / "nope.yaml")], "nope.yaml: no such file"),
    "wrong type": (_train(model={"hidden_dim": "big"}), "model.hidden_dim"),
    "unknown key": (_train(model={"colour": "red"}), "model.colour: unknown key"),
    "unknown section": (_train(modle={"hidden_dim": 32}), "modle"),
    "impossible shape": (_train(model={"hidden_dim": 33}), "model.num_heads"),
    "negative size": (_train(model={"num_layers": -1}), "model.num_layers"),
    "zero size": (_train(data={"batch_size": 0}), "data.batch_size"),
    "zero steps": (_train(trainer={"max_steps": 0}), "trainer.max_steps"),
    "bad choice": (_train(model={"sharing": "half"}), "model.sharing"),
    "override without =": (lambda tmp, c: ["train", _write(tmp, _config(tmp)), "model.hidden_dim"], "key=value"),
    # studies
    "empty search space": (_study(search={"model.sharing": {"choices": []}}), "search"),
    "search unknown field": (_study(search={"model.colour": {"choices": [1]}}), "search.model.colour"),
    "grid over a range": (_study(search={"optim.lr": {"low": 1e-4, "high": 1e-2}}), "search.optim.lr"),
    "unknown sampler": (_study(sampler="bayes"), "sampler"),
    "tpe without n_trials": (_study(sampler="tpe"), "n_trials"),
    "variant unknown field": (_study(variants={"x": {"model.colour": 1}}), "variants.x.model.colour"),
    "unknown report": (_study(report="albert-table9"), "report: albert-table9"),
    # corpora
    "corpus missing": (_train(data={"corpus": "/nonexistent/corpus.txt"}), "data.corpus"),
    "corpus empty": (_corpus(b"", "empty.txt"), "data.corpus"),
    "corpus binary": (_corpus(bytes(range(256)) * 64, "binary.txt"), "data.corpus"),
    "corpus not utf-8": (_corpus(_latin1(), "latin1.txt"), "data.corpus"),
    "corpus one sentence": (_corpus(b"Just one short sentence here.\n", "one.txt"), "data.corpus"),
    "corpus gz not gzip": (_corpus(b"plain text, not gzip\n" * 50, "fake.jsonl.gz"), "data.corpus"),
    "corpus jsonl without the field": (
        _corpus(gzip.compress(b'{"body": "x. y."}\n' * 50), "nofield.jsonl.gz"),
        "data.text_field",
    ),
    "corpus glob matches nothing": (_train(data={"corpus": "/tmp/ablate-nothing-*.jsonl.gz"}), "data.corpus"),
    "hub corpus unreachable": (_train(data={"corpus": "someone/no-such-corpus"}), "data.corpus"),
    # checkpoints
    "init_from missing": (_train(init_from="/nonexistent/checkpoint"), "init_from"),
    "checkpoint truncated": (_truncated, "init_from"),
    "checkpoint of another architecture": (_other_architecture, "init_from"),
    "teacher run missing": (_train(distill={"teacher": "runs:/0123456789abcdef"}), "distill.teacher"),
    "teacher tokenizer mismatch": (_teacher_tokenizer_mismatch, "distill.teacher"),
    "prune source missing": (_train(prune={"source": "/nonexistent/model"}), "prune.source"),
    "finetune source missing": (
        _train(
            finetune={"source": "/nonexistent/model", "task": "sst2", "train": str(SHARED_DATA / "sst2" / "train.tsv")}
        ),
        "finetune.source",
    ),
    # storage URLs
    "storage malformed": (_sweep_with("--storage", "postgresq://x"), "--storage postgresq://x"),
    "storage unreachable": (
        _sweep_with("--storage", "postgresql://u:pw@127.0.0.1:1/optuna"),
        "--storage postgresql://u:***@127.0.0.1:1/optuna",
    ),
    "tracking uri unreachable": (_sweep_with("--tracking-uri", "http://127.0.0.1:1"), "http://127.0.0.1:1"),
    "tracking uri malformed": (_sweep_with("--tracking-uri", "nosuchscheme://x"), "nosuchscheme://x"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_and_creates_nothing(case, tmp_path, checkpoint, capsys, monkeypatch):
    if not WIKI.is_file():
        pytest.skip(f"shared test data not found at {WIKI}")
    monkeypatch.chdir(tmp_path)
    make, needle = CASES[case]
    argv = make(tmp_path, checkpoint)
    capsys.readouterr()
    start = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert needle in err, err
    assert elapsed < 120, f"took {elapsed:.0f} s to say so"  # no minutes of retries
    runs = tmp_path / "runs"
    if (runs / "mlflow.db").exists():
        client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
        exps = [e.experiment_id for e in client.search_experiments()]
        assert not client.search_runs(exps), "an MLflow run was created"
    if (runs / "optuna.db").exists():
        storage = f"sqlite:///{runs / 'optuna.db'}"
        for s in optuna.get_all_study_summaries(storage):
            assert s.n_trials == 0, "an Optuna trial was created"
