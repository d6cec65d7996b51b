"""Classes of bad input, several cases each, through the real CLI (``ablate.cli.main``) in a fresh
folder: exit status 2, exactly one line ``error: ...`` naming the key or file, no traceback, nothing
created (no MLflow store, no Optuna store, no run folder), and fast.

* YAML whose aliases expand far beyond its size (an alias bomb) in a config, a study, its base, a
  report spec, the data catalog and a ``key=value`` override;
* a search checked at every value it can sample, not only its ends (and the message naming the
  searched key and value that break the rule, not a valid one beside it);
* a searched key that the study's own settings override, or that no trial reads;
* a study whose search space changed since its trials ran in the same Optuna store;
* a folder given where a file goes (and a file where a folder goes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml

from ablate.cli import main
from tests.conftest import CATALOG_ENV, SHARED_DATA, one_error
from tests.sweeps.conftest import tiny_base

WIKI = SHARED_DATA / "wiki-en" / "validation-00-of-01.jsonl.gz"
Make = Callable[[Path], list[str]]


def _bomb(levels: int = 9, width: int = 9) -> str:
    """A flow list that expands to ``width ** levels`` strings from a few hundred characters."""
    lines = [f"&l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"&l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "[" + ", ".join(lines) + "]"


BOMB = f"model:\n  preset: albert-tiny\n  layers: {_bomb()}\n"
MERGE_BOMB = "".join(
    ["a0: &a0 {x: 1, y: 2, z: 3}\n"]
    + [f"a{i}: &a{i}\n  <<: [{', '.join([f'*a{i - 1}'] * 9)}]\n  k{i}: 1\n" for i in range(1, 9)]
)


def _write(tmp: Path, tree: object, name: str) -> Path:
    path = tmp / name
    path.write_text(tree if isinstance(tree, str) else yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    return path


def _study_tree(tmp: Path, **changes: object) -> dict:
    return {"name": "bad", "base": tiny_base(tmp, WIKI), "search": {"model.sharing": {"choices": ["all"]}}, **changes}


def _sweep(*flags: str, **changes: object) -> Make:
    return lambda tmp: ["sweep", str(_write(tmp, _study_tree(tmp, **changes), "study.yaml")), *flags]


def _train_text(text: str, *overrides: str) -> Make:
    return lambda tmp: ["train", str(_write(tmp, text, "cfg.yaml")), *overrides]


def _study_base_bomb(tmp: Path) -> list[str]:
    _write(tmp, BOMB, "base.yaml")
    return ["sweep", "--check", str(_write(tmp, _study_tree(tmp, base="base.yaml"), "study.yaml"))]


def _study_text_bomb(tmp: Path) -> list[str]:
    text = yaml.safe_dump(_study_tree(tmp), sort_keys=False) + f"variants:\n  x: {{model.layers: {_bomb()}}}\n"
    return ["sweep", str(_write(tmp, text, "study.yaml"))]


def _report_bomb(tmp: Path) -> list[str]:
    text = f"title: t\nstudy: s\nrows: [model.sharing]\nmetrics: {_bomb()}\n"
    return ["report", str(_write(tmp, text, "report.yaml"))]


def _catalog_bomb(tmp: Path) -> list[str]:
    catalog = f"datasets:\n  nyu-mll/glue:sst2:\n    train: {_bomb()}\n"
    os.environ[CATALOG_ENV] = str(_write(tmp, catalog, "catalog.yaml"))
    return ["train", str(_write(tmp, tiny_base(tmp, WIKI), "cfg.yaml"))]


def _catalog_merge_bomb(tmp: Path) -> list[str]:
    os.environ[CATALOG_ENV] = str(_write(tmp, MERGE_BOMB, "catalog.yaml"))
    return ["sweep", "--check", str(_write(tmp, _study_tree(tmp), "study.yaml"))]


def _catalog_folder(tmp: Path) -> list[str]:
    os.environ[CATALOG_ENV] = _in(tmp, "cat")
    return ["train", str(_write(tmp, tiny_base(tmp, WIKI), "cfg.yaml"))]


def _in(tmp: Path, name: str, kind: str = "folder") -> str:
    path = tmp / name
    if kind == "folder":
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.write_text("x\n")
    return str(path)


def _study_with(**base_changes: object) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        tree = _study_tree(tmp)
        for key, value in base_changes.items():
            section, _, field = key.partition(".")
            value = value(tmp) if callable(value) else value
            if field:
                tree["base"].setdefault(section, {})[field] = value
            else:
                tree["base"][section] = value
        return ["sweep", "--check", str(_write(tmp, tree, "study.yaml"))]

    return make


LAYERS = [{"num_heads": 2, "qk_dim": 16, "v_dim": 16, "ffn_dim": 64}] * 2

CASES: dict[str, tuple[Make, str]] = {
    # YAML whose aliases expand far beyond its size: refused at once, naming the file
    "alias bomb in a config": (_train_text(BOMB), "cfg.yaml: invalid YAML at line 3: aliases expand"),
    "alias bomb in a study": (_study_text_bomb, "study.yaml: invalid YAML at line"),
    "alias bomb in a study, checked": (lambda tmp: ["sweep", "--check", *_study_text_bomb(tmp)[1:]], "aliases expand"),
    "alias bomb in a study's base file": (_study_base_bomb, "base.yaml: invalid YAML at line 3: aliases expand"),
    "alias bomb in a report spec": (_report_bomb, "report.yaml: invalid YAML at line"),
    "alias bomb in the data catalog": (_catalog_bomb, f"{CATALOG_ENV}: TMP/catalog.yaml: invalid YAML at line"),
    "merge-key bomb in the data catalog": (_catalog_merge_bomb, "catalog.yaml: invalid YAML at line"),
    "alias bomb in an override": (
        lambda tmp: _train_text("model: {preset: albert-tiny}\n", f"model.layers={_bomb()}")(tmp),
        "override 'model.layers=",
    ),
    "alias that contains itself": (_train_text("model: &m {layers: [*m]}\n"), "cfg.yaml: invalid YAML at line 1"),
    # every value a search can sample
    "an int range's interior value": (
        _sweep(sampler="random", n_trials=2, search={"model.hidden_dim": {"low": 32, "high": 64}}),
        "search.model.hidden_dim=33: model.hidden_dim: hidden_dim 33 is not divisible by num_heads 2",
    ),
    "an int range's step value": (
        _sweep(sampler="tpe", n_trials=2, search={"model.num_heads": {"low": 2, "high": 8, "step": 2}}),
        "search.model.num_heads=6: model.num_heads: hidden_dim 32 is not divisible by num_heads 6",
    ),
    "a long int range between its ends": (
        _sweep(
            sampler="random",
            n_trials=2,
            overrides={"model.num_heads": 4},
            search={"model.hidden_dim": {"low": 64, "high": 640, "step": 2}},
        ),
        "search.model.hidden_dim=66: model.num_heads",
    ),
    "a float range read as a whole number": (
        _sweep(sampler="random", n_trials=2, search={"trainer.max_steps": {"low": 4.0, "high": 8.0, "type": "float"}}),
        "search.trainer.max_steps=4.4: trainer.max_steps",
    ),
    "a log range past a bound inside": (
        _sweep(sampler="tpe", n_trials=2, search={"objective.mask_prob": {"low": 0.01, "high": 1.0, "log": True}}),
        "search.objective.mask_prob=1.0: objective.mask_prob",
    ),
    "two searched keys together": (
        _sweep(search={"model.hidden_dim": {"choices": [32, 48]}, "model.num_heads": {"choices": [2, 3]}}),
        "search.model.num_heads=3",
    ),
    "a range of heads against searched widths": (
        _sweep(
            sampler="random",
            n_trials=2,
            search={"model.hidden_dim": {"choices": [48, 96]}, "model.num_heads": {"low": 2, "high": 8}},
        ),
        "search.model.num_heads=5",
    ),
    # searched keys the study's own settings override, or that no trial reads
    "searched and set by a variant": (
        _sweep(search={"model.sharing": {"choices": ["all", "none"]}}, variants={"a": {"model.sharing": "attn"}}),
        "search.model.sharing: also set by variants.a ('attn')",
    ),
    "searched and fixed by overrides": (
        _sweep(search={"model.sharing": {"choices": ["all", "none"]}}, overrides={"model.sharing": "attn"}),
        "overrides.model.sharing: searched by the study (search.model.sharing)",
    ),
    "seed searched": (_sweep(search={"seed": {"choices": [1, 2]}}), "search.seed: each trial's seed is one of"),
    "name searched": (_sweep(search={"name": {"choices": ["a", "b"]}}), "search.name: each trial is named"),
    "heads searched where model.layers fixes them": (
        _sweep(search={"model.num_heads": {"choices": [2, 4]}}, overrides={"model.layers": LAYERS}),
        "search.model.num_heads: no trial reads it (model.layers gives every layer's heads)",
    ),
    "n-gram length searched with token masking": (
        _sweep(search={"objective.max_ngram": {"choices": [2, 3]}}),
        "search.objective.max_ngram: no trial reads it (objective.masking is 'token'",
    ),
    "a quantization field the method does not read": (
        _sweep(search={"quant.group_size": {"choices": [16, 32]}}),
        "search.quant.group_size: no trial reads it (quant.method 'none'",
    ),
    # a folder where a file goes, a file where a folder goes
    "train a folder": (lambda tmp: ["train", _in(tmp, "cfg.yaml")], "TMP/cfg.yaml: is a folder, not a file"),
    "params a folder": (lambda tmp: ["params", _in(tmp, "conf")], "TMP/conf: is a folder, not a file"),
    "sweep a folder": (lambda tmp: ["sweep", _in(tmp, "study.yaml")], "TMP/study.yaml: is a folder, not a file"),
    "sweep --check a folder": (lambda tmp: ["sweep", "--check", _in(tmp, "s")], "TMP/s: is a folder, not a file"),
    "report a folder": (lambda tmp: ["report", _in(tmp, "report.yaml")], "TMP/report.yaml: is a folder, not a file"),
    "a study's base a folder": (
        lambda tmp: [
            "sweep",
            str(_write(tmp, _study_tree(tmp, base=Path(_in(tmp, "base.yaml")).name), "study.yaml")),
        ],
        "TMP/base.yaml: is a folder, not a file",
    ),
    "the data catalog a folder": (_catalog_folder, "TMP/cat: is a folder, not a catalog file"),
    "init_from a file": (_study_with(init_from=lambda tmp: _in(tmp, "ckpt", "file")), "init_from: TMP/ckpt: is a file"),
    "data.tokenizer a file": (
        _study_with(**{"data.tokenizer": lambda tmp: _in(tmp, "tok.json", "file")}),
        "data.tokenizer: TMP/tok.json: is a file, not a tokenizer folder",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_class_of_bad_input_is_one_line_and_creates_nothing(case, fresh, capsys):
    make, needle = CASES[case]
    argv = make(fresh)
    before = sorted(p.name for p in fresh.iterdir())
    capsys.readouterr()
    start = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - start
    line = one_error(code, capsys.readouterr().err)
    assert needle.replace("TMP", str(fresh)) in line, line
    assert elapsed < 10, f"took {elapsed:.1f} s to say so"
    assert sorted(p.name for p in fresh.iterdir()) == before, "something was created"


def test_an_error_names_the_searched_value_that_breaks_the_rule_not_one_beside_it(fresh, capsys):
    """Of two searched keys, the message names the one whose value is refused (num_heads=3), not the
    valid value of the other (sharing), nor a valid value of its own."""
    study = _study_tree(
        fresh, search={"model.sharing": {"choices": ["all", "none"]}, "model.num_heads": {"choices": [2, 4, 3]}}
    )
    code = main(["sweep", "--check", str(_write(fresh, study, "study.yaml"))])
    line = one_error(code, capsys.readouterr().err)
    assert "search.model.num_heads=3: model.num_heads: hidden_dim 32 is not divisible by num_heads 3" in line, line
    assert "sharing" not in line and "=2" not in line and "=4" not in line, line


def test_a_valid_search_over_ranges_is_accepted(fresh, capsys):
    """The checks refuse only what breaks: ranges whose every value is valid pass ``--check``."""
    search = {
        "model.hidden_dim": {"low": 32, "high": 64, "step": 16},
        "model.num_heads": {"choices": [1, 2, 4, 8, 16]},
        "optim.lr": {"low": 1.0e-4, "high": 1.0e-2, "log": True},
        "model.dropout": {"low": 0.0, "high": 0.3},
    }
    study = _study_tree(fresh, search=search, sampler="tpe", n_trials=4)
    assert main(["sweep", "--check", str(_write(fresh, study, "study.yaml"))]) == 0, capsys.readouterr().err


def _ran_before(tmp: Path, distributions: dict[str, optuna.distributions.BaseDistribution]) -> str:
    """An Optuna store holding study ``bad`` with one finished trial over ``distributions`` (as an earlier
    ablate, which kept no definition of the study, left it); its URL."""
    (tmp / "runs").mkdir()
    url = f"sqlite:///{tmp / 'runs' / 'optuna.db'}"
    study = optuna.create_study(study_name="bad", storage=url)
    params = {name: dist.to_external_repr(dist.to_internal_repr(_first(dist))) for name, dist in distributions.items()}
    study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=1.0))
    return url


def _first(dist: optuna.distributions.BaseDistribution) -> object:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return dist.choices[0]
    return dist.low  # type: ignore[attr-defined]


SEARCHED = {
    "model.sharing": optuna.distributions.CategoricalDistribution(["all"]),
    "seed": optuna.distributions.CategoricalDistribution([0]),
}
CHANGED: dict[str, tuple[dict, dict, str]] = {
    "other choices": (
        SEARCHED,
        {"search": {"model.sharing": {"choices": ["all", "none"]}}},
        "search.model.sharing: choices ['all', 'none'] here, but the study 'bad' in sqlite:///TMP/runs/optuna.db "
        "sampled choices ['all'] (trial 0)",
    ),
    "a range where choices were": (
        {**SEARCHED, "model.num_layers": optuna.distributions.CategoricalDistribution([1, 2])},
        {"search": {"model.sharing": {"choices": ["all"]}, "model.num_layers": {"low": 1, "high": 2}}, "n_trials": 2},
        "search.model.num_layers: int 1..2 here, but the study 'bad' in",
    ),
    "other seeds": (SEARCHED, {"seeds": [0, 1]}, "seeds: [0, 1] here, but the study 'bad' in"),
    "a key searched now": (
        SEARCHED,
        {"search": {"model.sharing": {"choices": ["all"]}, "optim.lr": {"choices": [0.001]}}},
        "search.optim.lr: searched here, but not by the study 'bad'",
    ),
    "a key searched no more": (
        {**SEARCHED, "optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)},
        {},
        "search.optim.lr: not searched here, but the study 'bad' in",
    ),
}


@pytest.mark.parametrize("case", list(CHANGED))
def test_a_study_whose_search_changed_since_its_trials_ran_is_named_before_anything_is_written(case, fresh, capsys):
    distributions, changes, needle = CHANGED[case]
    url = _ran_before(fresh, distributions)
    tree = _study_tree(fresh, **{"sampler": "random" if "n_trials" in changes else "grid", **changes})
    capsys.readouterr()
    code = main(["sweep", str(_write(fresh, tree, "study.yaml"))])
    line = one_error(code, capsys.readouterr().err)
    assert needle.replace("TMP", str(fresh)) in line, line
    assert "give the study a new name (name:) or another store (--storage)" in line, line
    (summary,) = optuna.get_all_study_summaries(url)
    assert summary.n_trials == 1, "a trial was added"
    assert not (fresh / "runs" / "mlflow.db").exists() or _no_runs(fresh), "an MLflow run was created"


def _no_runs(tmp: Path) -> bool:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp / 'runs' / 'mlflow.db'}")
    return not client.search_runs([e.experiment_id for e in client.search_experiments()])


def test_check_not_searched_refuses_a_fixed_value_of_a_searched_key():
    """The one refusal a command-line override of a searched key shares with the study's own overrides."""
    from ablate.lightning_modules.config.errors import ConfigError
    from ablate.sweeps.reach import check_not_searched
    from ablate.sweeps.spec import StudySpec

    spec = StudySpec(name="s", search={"model.sharing": {"choices": ["all", "none"]}})  # type: ignore[arg-type]
    check_not_searched(spec, ["model.hidden_dim"])
    with pytest.raises(ConfigError, match=r"model\.sharing: searched by the study \(search\.model\.sharing\)"):
        check_not_searched(spec, ["model.hidden_dim", "model.sharing"])


BLAMED: dict[str, tuple[list[str], str, str]] = {
    "a width set against a preset's heads": (
        ["model.hidden_dim=102"],
        "model.hidden_dim: hidden_dim 102 is not divisible by num_heads 4",
        "model.num_heads:",
    ),
    "heads set against a preset's width": (
        ["model.num_heads=3"],
        "model.num_heads: hidden_dim 128 is not divisible by num_heads 3",
        "model.hidden_dim:",
    ),
    "a bottleneck set against the heads": (
        ["model.intra_dim=30"],
        "model.intra_dim: intra_dim 30 is not divisible by num_heads 4",
        "model.num_heads:",
    ),
    "low bits set above the high bits": (
        ["quant.method=weight-mixed", "quant.low_bits=8"],
        "quant.low_bits: high_bits 8 must be above low_bits 8",
        "quant.high_bits:",
    ),
    "another regime's source set": (
        ["regime=finetune", "prune.source=runs:/abc"],
        "finetune.source: required by regime 'finetune' (prune.source is set instead: regime prune)",
        "Traceback",
    ),
}


@pytest.mark.parametrize("case", list(BLAMED))
def test_a_rule_between_two_fields_names_the_one_the_config_set(case, fresh, capsys):
    """Of two fields a rule ties together, the error names the one this config (its overrides before its
    file, its file before the preset) set to break it, not the other's valid value."""
    overrides, needle, not_named = BLAMED[case]
    cfg = _write(fresh, "model: {preset: albert-tiny}\n", "cfg.yaml")  # 4 heads of H 128
    code = main(["params", str(cfg), *overrides])
    line = one_error(code, capsys.readouterr().err)
    assert needle in line and not_named not in line, line
