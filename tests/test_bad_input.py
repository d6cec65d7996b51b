"""Bad input, everywhere: one line ``error: ...``, exit status 2, no traceback, nothing created.

Config YAML, studies, corpora, checkpoints and storage URLs, each through the real CLI
(``ablate.cli.main``) in a fresh folder; afterwards no MLflow run and no Optuna trial
exists there (an unreachable store is reported before anything is written).
"""

from __future__ import annotations

import gzip
import logging
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.interop.export import export
from ablate.lightning_modules.model.heads import build_pretraining_model
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


def _distill(model: dict | None = None, **distill: object) -> Callable[[Path, Path], list[str]]:
    """A distillation from the checkpoint (an albert-tiny of 1000 tokens, H 32, without a tokenizer)."""

    def make(tmp: Path, ckpt: Path) -> list[str]:
        tree = _config(tmp, distill={"teacher": str(ckpt), **distill})
        tree["model"] = {**tree["model"], **(model or {})}
        return ["train", _write(tmp, tree)]

    return make


def _latin1() -> bytes:
    return ("Élève très âgé. " * 400).encode("latin-1")


def _text(content: str, name: str = "cfg.yaml") -> Callable[[Path, Path], list[str]]:
    return lambda tmp, ckpt: ["train", _write(tmp, content, name)]


def _cache_is_a_file(tmp: Path, ckpt: Path) -> list[str]:
    (tmp / "cache-file").write_text("x")
    return _train(data={"cache_dir": str(tmp / "cache-file")})(tmp, ckpt)


def _bench(*flags: str) -> Callable[[Path, Path], list[str]]:
    def make(tmp: Path, ckpt: Path) -> list[str]:
        (tmp / "a-file").write_text("x")
        return ["bench", *(f.replace("TMP", str(tmp)) for f in flags)]

    return make


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
    "yaml duplicate key": (
        _text("model: {preset: albert-tiny}\noptim: {lr: 1.0e-3}\noptim: {warmup_steps: 5}\n"),
        "cfg.yaml: invalid YAML at line 3: duplicate key 'optim' (first at line 2)",
    ),
    "yaml duplicate nested key": (
        _text("model:\n  preset: albert-tiny\n  hidden_dim: 64\n  hidden_dim: 128\n"),
        "cfg.yaml: invalid YAML at line 4: duplicate key 'hidden_dim'",
    ),
    "yaml tab indent": (_text("model:\n\tpreset: albert-tiny\n"), "cfg.yaml: invalid YAML at line 2"),
    "yaml key not a name": (_text("1: x\n"), "1: unknown key"),
    "yaml model as a preset name": (_text("model: albert-tiny\n"), "model: a mapping of model fields"),
    "override duplicate key": (
        lambda tmp, c: ["train", _write(tmp, _config(tmp)), "model.layers=[{num_heads: 2, num_heads: 4}]"],
        "override 'model.layers=[{num_heads: 2, num_heads: 4}]': duplicate key 'num_heads'",
    ),
    # settings of two sections that used to fail inside the training loop, after the run existed
    "max_length above max_position": (_train(data={"max_length": 96}), "data.max_length: 96 tokens"),
    "one token type with sop": (_train(model={"token_types": 1}), "model.token_types: 1 row, but objective.sentence"),
    "one token type with intrinsic probes": (
        _train(model={"token_types": 1}, objective={"sentence": "none"}, trainer={"intrinsic": True}),
        "model.token_types: 1 row, but trainer.intrinsic",
    ),
    "seed negative": (_train(seed=-1), "seed: must be between 0 and 4294967295"),
    "seed too large": (_train(seed=2**40), "seed: must be between 0"),
    "accelerator unknown": (_train(trainer={"accelerator": "gpus"}), "trainer.accelerator: 'gpus' is not one of"),
    "tokenizer cache is a file": (_cache_is_a_file, "data.cache_dir: TMP/cache-file: is a file, not a folder"),
    # command-line values
    "sweep --n-trials 0": (_sweep_with("--n-trials", "0"), "error: --n-trials: must be a positive integer, got 0"),
    "sweep --n-trials negative": (_sweep_with("--n-trials=-3"), "--n-trials: must be a positive integer, got -3"),
    "sweep --n-trials not a number": (_sweep_with("--n-trials", "ten"), "--n-trials: must be a positive integer"),
    "sweep without a study": (lambda tmp, c: ["sweep"], "ablate sweep: the following arguments are required: STUDY"),
    "unknown command": (lambda tmp, c: ["trian"], "COMMAND: invalid choice: 'trian'"),
    "unknown option": (
        _sweep_with("--trials", "3"),
        "--trials: not an option of ablate sweep (see ablate sweep --help)",
    ),
    "bench --steps 0": (_bench("--steps", "0"), "error: --steps: must be a positive integer, got 0"),
    "bench --steps negative": (_bench("--steps=-5"), "--steps: must be a positive integer, got -5"),
    "bench --device unknown": (_bench("--device", "gpu0"), "--device: expected cpu, cuda, cuda:N, mps or auto"),
    "bench --out under a file": (_bench("--out", "TMP/a-file/table.md"), "--out: TMP/a-file/table.md: "),
    "bench --out a folder": (_bench("--out", "TMP"), "is a folder"),
    # studies
    "empty search space": (_study(search={"model.sharing": {"choices": []}}), "search"),
    "search unknown field": (_study(search={"model.colour": {"choices": [1]}}), "search.model.colour"),
    "grid over a range": (_study(search={"optim.lr": {"low": 1e-4, "high": 1e-2}}), "search.optim.lr"),
    "unknown sampler": (_study(sampler="bayes"), "sampler"),
    "tpe without n_trials": (_study(sampler="tpe"), "n_trials"),
    "variant unknown field": (_study(variants={"x": {"model.colour": 1}}), "variants.x.model.colour"),
    "unknown report": (_study(report="albert-table9"), "report: albert-table9"),
    "accuracy bound without a reference": (
        _study(optimize={"metric": "model_bytes", "guard": {"metric": "val/mlm_acc", "max_drop": 0.01}}),
        "optimize.guard.reference: the bound on val/mlm_acc needs a reference",
    ),
    "accuracy bound both absolute and relative": (
        _study(
            optimize={
                "metric": "model_bytes",
                "guard": {"metric": "val/mlm_acc", "max_drop": 0.01, "max_relative_drop": 0.01, "reference": 0.5},
            }
        ),
        "optimize.guard.max_drop: give one of max_drop (absolute) and max_relative_drop, not both",
    ),
    "accuracy bound on a metric no trial logs": (
        _study(
            optimize={"metric": "model_bytes", "guard": {"metric": "sst2/accuracy", "max_drop": 0.01, "reference": 0.9}}
        ),
        "optimize.guard.metric: 'sst2/accuracy' is not a metric ablate logs",
    ),
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
    "corpus an empty string": (_train(data={"corpus": ""}), "data.corpus: empty; give norvig-big"),
    "corpus glob matches nothing": (_train(data={"corpus": "/tmp/ablate-nothing-*.jsonl.gz"}), "data.corpus"),
    "hub corpus unreachable": (_train(data={"corpus": "someone/no-such-corpus"}), "data.corpus"),
    # checkpoints
    "init_from missing": (_train(init_from="/nonexistent/checkpoint"), "init_from"),
    "checkpoint truncated": (_truncated, "init_from"),
    "checkpoint of another architecture": (_other_architecture, "init_from"),
    "teacher run missing": (_train(distill={"teacher": "runs:/0123456789abcdef"}), "distill.teacher"),
    "teacher tokenizer mismatch": (_teacher_tokenizer_mismatch, "distill.teacher"),
    "distill: student vocabulary larger than the teacher's": (
        _distill({"vocab_size": 1200}),
        "model.vocab_size: the student's",
    ),
    "distill: mix_prob with the teacher's vocabulary": (
        _distill(mix_prob=0.3),
        "distill.mix_prob: only for a student with",
    ),
    "distill: word embedding copied across vocabularies": (
        _distill({"vocab_size": 500}, init_embeddings="word"),
        "distill.init_embeddings: 'word' copies the teacher's word embedding",
    ),
    "distill: own vocabulary, teacher without a tokenizer": (
        _distill({"vocab_size": 500}),
        "distill.teacher: the student has",
    ),
    "distill: shared projection between equal widths": (_distill(projection="shared"), "distill.projection: 'shared'"),
    "distill: shared projection no term uses": (
        _distill(projection="shared", fmt_weight=0.0),
        "distill.projection: 'shared' projects the student's hidden states for",
    ),
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
    assert needle.replace("TMP", str(tmp_path)) in err, err
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


def _corrupt_second_file(folder: Path, corruption: str) -> tuple[Path, int]:
    """A corpus folder whose first file reads fine but yields no training pair (one-word documents:
    the corpus check and the tokenizer pass), so the first training batch reads the second file,
    whose line 41 is corrupt; that file and line."""
    folder.mkdir()
    words = [f"word{i}" for i in range(300)]
    (folder / "a.jsonl.gz").write_bytes(gzip.compress("".join(f'{{"text": "{w}"}}\n' for w in words).encode()))
    with gzip.open(WIKI, "rb") as fh:
        lines = [fh.readline() for _ in range(60)]
    bad = {"json": b'{"text": "no closing quote}\n', "utf-8": b'{"text": "caf\xe9 au lait"}\n'}
    if corruption in bad:
        lines.insert(40, bad[corruption])
        (folder / "b.jsonl.gz").write_bytes(gzip.compress(b"".join(lines)))
    else:  # truncated: the gzip stream stops two thirds of the way in
        whole = gzip.compress(b"".join(lines))
        (folder / "b.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])
    return folder / "b.jsonl.gz", 41


@pytest.mark.parametrize(("corruption", "workers"), [("json", 1), ("utf-8", 0), ("truncated", 0)])
def test_a_corrupt_record_deep_in_the_corpus_fails_the_run_in_one_line(
    corruption, workers, tmp_path, capsys, monkeypatch
):
    """Read inside the training loop (in a DataLoader worker or not): one line naming the file and
    line, exit 2, and the run ends FAILED with that line as its reason."""
    if not WIKI.is_file():
        pytest.skip(f"shared test data not found at {WIKI}")
    monkeypatch.chdir(tmp_path)
    bad_file, line = _corrupt_second_file(tmp_path / "corpus", corruption)
    tree = _config(
        tmp_path,
        data={"corpus": str(tmp_path / "corpus"), "num_workers": workers, "tokenizer_docs": 100, "val_fraction": 0.1},
        trainer={"max_steps": 2, "val_every": 2, "measure": False},
    )
    capsys.readouterr()
    for logger in [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]:
        for handler in logger.handlers:  # Lightning's and torch's, bound to an earlier test's stderr, now closed
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                monkeypatch.setattr(handler, "stream", sys.stderr)
    assert main(["train", _write(tmp_path, tree)]) == 2
    err = capsys.readouterr().err
    errors = [e for e in err.splitlines() if e.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err and "Failed to load" not in err, err
    assert str(bad_file) in errors[0], errors[0]
    if corruption != "truncated":
        assert f"at line {line} (" in errors[0], errors[0]
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    assert run.data.tags["ablate.fail_reason"] == errors[0].removeprefix("error: ")


def test_a_study_reads_1e_3_as_a_float_and_no_as_a_name(tmp_path):
    """``1e-3`` is a float (PyYAML alone reads the string "1e-3", which Optuna would sample as a
    string); ``no``/``off`` stay strings where a string is meant and still set booleans."""
    from ablate.sweeps.spec import load_study

    study = {
        "name": "floats",
        "base": {**_config(tmp_path), "trainer": {"max_steps": 6, "progress": "off"}},
        "search": {"optim.lr": {"choices": ["1e-3", "1e-2"]}},
        "variants": {"no": {"model.sharing": "none"}, "off": {"model.sharing": "all"}},
    }
    path = Path(_write(tmp_path, study, "study.yaml"))
    path.write_text(path.read_text().replace("'1e-3'", "1e-3").replace("'1e-2'", "1e-2").replace("'off'", "off"))
    assert "1e-3" in path.read_text() and "'" not in path.read_text().split("search:")[1].split("variants:")[0]
    spec, base = load_study(path)
    assert spec.space["optim.lr"].choices == [0.001, 0.01]
    assert all(type(v) is float for v in spec.space["optim.lr"].choices)
    assert set(spec.space["variant"].choices) == {"no", "off"}
    assert base.apply().trainer.progress is False


def test_help_still_exits_zero(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "--help"])
    assert exc.value.code == 0
    assert "check" in capsys.readouterr().out  # the modes of ablate sweep
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "run", "--help"])
    assert exc.value.code == 0
    assert "--n-trials" in capsys.readouterr().out
