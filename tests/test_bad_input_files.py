"""Bad input files, by class, through the real CLI (``ablate.cli.main``) in a fresh folder: exit status 2,
one line ``error: ...`` naming the file and the field, nothing created (no store, no cache, no run).

* JSON read strictly (a key given twice, ``NaN``, another top-level type) wherever ablate reads it: a
  checkpoint's ``config.json``, a tokenizer folder's ``tokenizer_config.json`` and ``tokenizer.json``;
* files whose fields contradict each other: ``config.json`` against itself, its weights and the
  ``ablate.yaml`` beside it; ``tokenizer_config.json`` against ``tokenizer.json``; a TSV header naming a
  column twice; a SQuAD file's version against its questions;
* a method that cannot apply to its source's shape, refused by ``train``, ``train --print-plan`` and
  ``sweep --check`` before the store exists.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from ablate.cli import main
from ablate.lightning_modules.config.errors import ConfigError, DataError
from ablate.lightning_modules.config.jsonio import JsonProblem, parse_json, read_json
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.interop.export import export
from ablate.lightning_modules.model.heads import build_pretraining_model
from tests.conftest import SHARED_DATA, one_error
from tests.sweeps.conftest import tiny_base

WIKI = SHARED_DATA / "wiki-en" / "validation-00-of-01.jsonl.gz"
SST2 = SHARED_DATA / "sst2"
SQUAD = SHARED_DATA / "squad" / "dev-v2.0.json"
Make = Callable[[Path, Path], list[str]]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export (``config.json``, ``ablate.yaml``, weights) of an untrained tiny ALBERT without sharing,
    with a BERT tokenizer of a 1000-token vocabulary beside it."""
    if not WIKI.is_file():
        pytest.skip(f"shared test data not found at {WIKI}")
    root = tmp_path_factory.mktemp("source")
    tree = tiny_base(root, WIKI)
    tree["model"]["sharing"] = "none"
    cfg = build_config(tree)
    export(build_pretraining_model(cfg.model, cfg.objective), cfg, root / "model")
    from ablate.datamodules.tokenizer import new_tokenizer

    tok = new_tokenizer(True)
    from tokenizers import models

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.model = models.WordPiece({t: i for i, t in enumerate([*specials, "a", "b"])}, unk_token="[UNK]")
    tok.save(str(root / "model" / "tokenizer.json"))
    return root / "model"


def _copy(tmp: Path, source: Path, name: str = "ckpt") -> Path:
    return Path(shutil.copytree(source, tmp / name))


def _cfg(tmp: Path, **changes: object) -> str:
    tree = tiny_base(tmp, WIKI)
    tree["model"]["sharing"] = "none"
    for key, value in changes.items():
        section, _, field = key.partition(".")
        if field:
            tree.setdefault(section, {})[field] = value
        else:
            tree[section] = value
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return str(path)


def _edit_json(path: Path, text: Callable[[str], str]) -> None:
    path.write_text(text(path.read_text(encoding="utf-8")), encoding="utf-8")


def _set(name: str, key: str, value: object) -> Callable[[str], str]:
    """Set ``key`` of the JSON object in file ``name`` to ``value`` (re-serialised)."""

    def edit(text: str) -> str:
        tree = json.loads(text)
        tree[key] = value
        return json.dumps(tree, indent=2)

    return edit


def _source_with(file: str, edit: Callable[[str], str], field: str = "init_from", **more: object) -> Make:
    """``ablate train`` from a copy of the source whose ``file`` was edited, named by ``field``."""

    def make(tmp: Path, source: Path) -> list[str]:
        ckpt = _copy(tmp, source)
        path = ckpt / file
        if not path.exists():
            path.write_text("{}", encoding="utf-8")
        _edit_json(path, edit)
        return ["train", _cfg(tmp, **{field: str(ckpt), **more})]

    return make


def _tokenizer_folder(files: dict[str, str]) -> Make:
    """``ablate train`` with ``data.tokenizer`` a folder of the source's tokenizer and ``files``."""

    def make(tmp: Path, source: Path) -> list[str]:
        folder = tmp / "tok"
        folder.mkdir()
        shutil.copy(source / "tokenizer.json", folder / "tokenizer.json")
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
        return ["train", _cfg(tmp, **{"data.tokenizer": str(folder), "model.vocab_size": 7})]

    return make


def _vocab_folder(config: str) -> Make:
    def make(tmp: Path, source: Path) -> list[str]:
        folder = tmp / "tok"
        folder.mkdir()
        (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
        (folder / "tokenizer_config.json").write_text(config, encoding="utf-8")
        return ["train", _cfg(tmp, **{"data.tokenizer": str(folder), "model.vocab_size": 6})]

    return make


def _sst2_header(header: str) -> Make:
    def make(tmp: Path, source: Path) -> list[str]:
        rows = (SST2 / "validation.tsv").read_text(encoding="utf-8").splitlines()[1:20]
        (tmp / "train.tsv").write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
        ft = {"source": str(source), "train": str(tmp / "train.tsv"), "validation": str(tmp / "train.tsv")}
        ft |= {"max_length": 64}
        return ["train", _cfg(tmp, regime="finetune", finetune=ft)]

    return make


def _prune(*flags: str, **prune: object) -> Make:
    def make(tmp: Path, source: Path) -> list[str]:
        return ["train", *flags, _cfg(tmp, prune={"source": str(source), **prune})]

    return make


def _quant(quant: dict[str, object], **changes: object) -> Make:
    return lambda tmp, source: ["train", _cfg(tmp, quant={"source": str(source), **quant}, **changes)]


def _edited_tokenizer(tmp: Path, source: Path, edit: Callable[[str], str]) -> list[str]:
    argv = _tokenizer_folder({})(tmp, source)
    _edit_json(tmp / "tok" / "tokenizer.json", edit)
    return argv


def _study(**base: object) -> Make:
    def make(tmp: Path, source: Path) -> list[str]:
        changes = {key: value(source) if callable(value) else value for key, value in base.items()}
        tree = yaml.safe_load(Path(_cfg(tmp, **changes)).read_text(encoding="utf-8"))
        (tmp / "cfg.yaml").unlink()
        study = {"name": "bad", "base": tree, "search": {"optim.lr": {"choices": [0.001]}}}
        (tmp / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False), encoding="utf-8")
        return ["sweep", "--check", str(tmp / "study.yaml")]

    return make


def _dup(key: str) -> Callable[[str], str]:
    return lambda text: text.replace("{", f'{{\n  "{key}": 1,', 1)


CASES: dict[str, tuple[Make, str]] = {
    # JSON read strictly, the file and the key named
    "config.json with a key given twice": (
        _source_with("config.json", _dup("vocab_size")),
        "init_from: TMP/ckpt/config.json: duplicate key 'vocab_size' in one object",
    ),
    "config.json with NaN": (
        _source_with("config.json", lambda t: t.replace('"initializer_range": 0.02', '"initializer_range": NaN')),
        "TMP/ckpt/config.json: 'initializer_range': NaN at line",
    ),
    "config.json a list": (_source_with("config.json", lambda t: "[1, 2]"), "TMP/ckpt/config.json: an object expected"),
    "tokenizer_config.json that does not parse, beside vocab.txt": (
        _vocab_folder('{"do_lower_case": true,,}'),
        "data.tokenizer: TMP/tok/tokenizer_config.json: invalid JSON at line 1",
    ),
    "tokenizer_config.json that does not parse, beside tokenizer.json": (
        _tokenizer_folder({"tokenizer_config.json": '{"do_lower_case": tru}'}),
        "TMP/tok/tokenizer_config.json: invalid JSON at line 1",
    ),
    "tokenizer_config.json whose do_lower_case is a string": (
        _vocab_folder('{"do_lower_case": "yes"}'),
        "TMP/tok/tokenizer_config.json: do_lower_case: 'yes' is neither true nor false",
    ),
    "tokenizer.json with a key given twice": (
        lambda tmp, src: _edited_tokenizer(tmp, src, _dup("version")),
        "data.tokenizer: TMP/tok/tokenizer.json: duplicate key 'version' in one object",
    ),
    # two fields of one folder that contradict each other
    "hidden_size not a multiple of the heads": (
        _source_with("config.json", _set("config.json", "hidden_size", 33)),
        "TMP/ckpt/config.json: hidden_size 33 is not a multiple of num_attention_heads 2",
    ),
    "config.json's vocab_size against its weights": (
        _source_with("config.json", _set("config.json", "vocab_size", 2000)),
        "TMP/ckpt/config.json: vocab_size 2000, but model.safetensors's albert.embeddings.word_embeddings.weight "
        "has 1000 rows",
    ),
    "config.json against the ablate.yaml beside it": (
        _source_with("config.json", _set("config.json", "num_hidden_layers", 3)),
        "TMP/ckpt/config.json: num_hidden_layers 3, but ablate.yaml beside it says model.num_layers 2",
    ),
    "a shape field of config.json not a whole number": (
        _source_with("config.json", _set("config.json", "intermediate_size", 64.5)),
        "TMP/ckpt/config.json: intermediate_size: 64.5 is not a positive whole number",
    ),
    "tokenizer_config.json's class against tokenizer.json's model": (
        _tokenizer_folder({"tokenizer_config.json": '{"tokenizer_class": "AlbertTokenizer"}'}),
        "TMP/tok/tokenizer_config.json: tokenizer_class 'AlbertTokenizer' (a Unigram tokenizer), but tokenizer.json "
        "beside it has model.type 'WordPiece'",
    ),
    "tokenizer_config.json's casing against tokenizer.json's normalizer": (
        _tokenizer_folder({"tokenizer_config.json": '{"do_lower_case": false}'}),
        "TMP/tok/tokenizer_config.json: do_lower_case false, but tokenizer.json beside it has normalizer.lowercase "
        "true",
    ),
    "a TSV header naming a column twice": (
        _sst2_header("sentence\tlabel\tlabel"),
        "finetune.train: TMP/train.tsv: the header names column 'label' twice (sentence, label, label)",
    ),
    # a method that cannot apply to its source's shape, before the store
    "a pruning target above the source": (
        _prune(target=10**8),
        "prune.target: 1e+08 is 100000000 backbone parameters, but TMP-SOURCE has 34720",
    ),
    "a pruning target above the source, print-plan": (
        _prune("--print-plan", target=40000),
        "prune.target: 40000 is 40000 backbone parameters, but TMP-SOURCE has 34720",
    ),
    "a source with fewer positions than the run reads": (
        _quant({"method": "weight-int8"}, **{"data.max_length": 128}),
        "quant.source: TMP-SOURCE has 64 positions (its model.max_position), fewer than data.max_length 128",
    ),
    "a group size that fits none of the source's layers": (
        _quant({"method": "weight-int4", "group_size": 48}),
        "quant.group_size: 48 divides none of the quantized layers' input widths (16, 32, 64) (the model of "
        "quant.source)",
    ),
    "init_from of another architecture": (
        lambda tmp, src: ["train", _cfg(tmp, init_from=str(src), **{"model.num_layers": 3})],
        "init_from: TMP-SOURCE has a different architecture than model.*; set model.num_layers=2",
    ),
    "a pruning target above the source, in a study": (
        _study(prune=lambda src: {"source": str(src), "target": 10**8}),
        "prune.target: 1e+08 is 100000000 backbone parameters",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_file_is_one_line_naming_file_and_field_and_creates_nothing(case, fresh, source, capsys):
    make, needle = CASES[case]
    argv = make(fresh, source)
    before = sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*"))
    capsys.readouterr()
    code = main(argv)
    line = one_error(code, capsys.readouterr().err, ignore=("torchao", "_pytree"))
    assert needle.replace("TMP-SOURCE", str(source)).replace("TMP", str(fresh)) in line, line
    after = sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*"))
    assert after == before, f"created: {sorted(set(after) - set(before))}"
    assert not (fresh / "runs").exists() and not (fresh / "cache").exists()


def test_the_source_itself_is_accepted(fresh, source, capsys):
    """The checks refuse only what contradicts: the untouched export and a target below it pass print-plan."""
    code = main(["train", "--print-plan", _cfg(fresh, prune={"source": str(source), "target": 0.5})])
    assert code == 0, capsys.readouterr().err
    assert not (fresh / "runs").exists()


STRICT: dict[str, tuple[str, str]] = {
    "a key twice": ('{"a": 1,\n "a": 2}', "duplicate key 'a' in one object (lines 1 and 2)"),
    "a nested key twice": ('{"x": {"b": 1, "b": 1}}', "duplicate key 'b' in one object"),
    "NaN": ('{"lr": NaN}', "'lr': NaN at line 1 is not a number"),
    "-Infinity in a list": ("[1,\n -Infinity]", "-Infinity at line 2 is not a number"),
    "another top-level type": ("[1]", "an object expected at the top, not list"),
    "a syntax error": ('{"a": 1,}', "invalid JSON at line 1"),
}


@pytest.mark.parametrize("case", list(STRICT))
def test_parse_json_refuses_what_pythons_json_accepts(case):
    text, needle = STRICT[case]
    with pytest.raises(JsonProblem, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_json(text, dict)


def test_parse_json_reads_strict_json_and_read_json_names_the_file(tmp_path):
    assert parse_json('{"a": [1, 2.5, "NaN", null], "b": {"a": 1}}', dict) == {
        "a": [1, 2.5, "NaN", None],
        "b": {"a": 1},
    }
    (tmp_path / "x.json").write_text('{"a": 1, "a": 2}')
    with pytest.raises(ConfigError, match=r"x\.json: duplicate key 'a'"):
        read_json(tmp_path / "x.json")
    with pytest.raises(DataError, match=r"x\.json: duplicate key"):
        read_json(tmp_path / "x.json", error=DataError)


SQUAD_CASES: dict[str, tuple[Callable[[dict], None], str]] = {
    "v1.1 with an unanswerable question": (
        lambda tree: tree.update(version="1.1"),
        "version '1.1' has no unanswerable questions, but question",
    ),
    "unanswerable with answers": (
        lambda tree: _first_impossible(tree).update(answers=[{"text": "x", "answer_start": 0}]),
        "is_impossible true, but answers has 1 answers",
    ),
    "a key twice": (lambda tree: None, "duplicate key 'version'"),
}


def _first_impossible(tree: dict) -> dict:
    return next(qa for a in tree["data"] for p in a["paragraphs"] for qa in p["qas"] if qa.get("is_impossible"))


@pytest.mark.parametrize("case", list(SQUAD_CASES))
def test_a_squad_file_whose_fields_contradict_is_refused_naming_it(case, tmp_path):
    from ablate.datamodules.sources import resolve_task
    from ablate.datamodules.squad import read_questions

    if not SQUAD.is_file():
        pytest.skip(f"shared test data not found at {SQUAD}")
    tree = json.loads(SQUAD.read_text(encoding="utf-8"))
    tree["data"] = tree["data"][:2]
    edit, needle = SQUAD_CASES[case]
    edit(tree)
    text = json.dumps(tree)
    if case == "a key twice":
        text = text.replace("{", '{"version": "v2.0", ', 1)
    (tmp_path / "dev.json").write_text(text, encoding="utf-8")
    src = resolve_task("finetune.validation", str(tmp_path / "dev.json"), None, "validation")
    with pytest.raises(DataError, match="finetune.validation: .*dev.json") as err:
        read_questions(src, None, True)
    assert needle in str(err.value) and len(str(err.value).splitlines()) == 1, err.value


def test_the_other_readers_refuse_a_key_given_twice_naming_the_file(tmp_path):
    """The SQuAD questions ``ablate predict`` reads, a quantized model's description and a transformers
    question-answering folder's config.json are read strictly too: a key given twice is refused, the file named."""
    from ablate.lightning_modules.interop.qa_export import load_span_model
    from ablate.lightning_modules.interop.quantized import read_meta
    from ablate.sweeps.engine.predict import _questions

    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"id": "q1", "question": "who?", "question": "what?", "context": "a b"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"questions\.jsonl.*duplicate key 'question'"):
        _questions(questions)
    lines = tmp_path / "lines.jsonl"  # JSON lines still read, line by line
    rows = ['{"id": "q1", "question": "who?", "context": "a b"}', '{"id": "q2", "question": "x", "context": "c"}']
    lines.write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert [q.id for q in _questions(lines)] == ["q1", "q2"]
    (tmp_path / "quantization.yaml").write_text("format: a\nformat: b\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"quantization\.yaml: .*duplicate key 'format'") as got:
        read_meta(tmp_path)
    assert "\n" not in str(got.value)
    qa = tmp_path / "qa"
    qa.mkdir()
    (qa / "config.json").write_text('{"model_type": "bert", "model_type": "albert"}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config\.json: duplicate key 'model_type'"):
        load_span_model(qa)
