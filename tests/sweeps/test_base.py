"""A study's base (:class:`~ablate.sweeps.base.StudyBase`): its keys checked once at load, trial configs
made from it, its tree never changed by them, and the form the study definition hashes."""

from __future__ import annotations

import pytest
import yaml

from ablate.cli import main
from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.base import StudyBase
from ablate.sweeps.definition import definition
from ablate.sweeps.spec import StudySpec, load_study, trial_config
from tests.sweeps.conftest import tiny_base, write_study


def test_a_base_key_that_is_not_a_config_field_is_named_at_load(tmp_path, wiki_validation, capsys):
    path = write_study(tmp_path, wiki_validation)
    raw = yaml.safe_load(path.read_text())
    raw["base"]["model"]["colour"] = "red"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", "check", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {path}: base.model.colour: unknown key"
    # a base given as a file: the file is named, and the key in it
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump({**tiny_base(tmp_path, wiki_validation), "trainr": {"max_steps": 2}}))
    raw["base"] = "base.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["sweep", "check", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {config}: trainr: unknown key (did you mean trainer?)"
    assert not (tmp_path / "runs").exists()  # nothing created


def test_apply_is_the_base_with_a_trials_changes_and_names_a_bad_key(tmp_path, wiki_validation):
    tree = tiny_base(tmp_path, wiki_validation)
    base = StudyBase(tree)
    changes = {"model.sharing": "all", "optim.lr": 5e-4, "seed": 3}
    assert base.apply(changes) == build_config(tree, changes)
    assert base.apply().model.sharing == build_config(tree).model.sharing
    with pytest.raises(ConfigError, match=r"^model\.num_heads: "):
        base.apply({"model.num_heads": 3})  # 32 is not divisible by 3
    with pytest.raises(ConfigError, match=r"^trainer\.max_stepz: unknown key"):
        base.apply({"trainer.max_stepz": 3})


def test_the_base_is_copied_in_and_out(tmp_path, wiki_validation):
    tree = tiny_base(tmp_path, wiki_validation)
    base = StudyBase(tree)
    tree["model"]["hidden_dim"] = 64  # the caller's tree, changed after
    base.tree["model"]["num_layers"] = 7  # a copy handed out, changed
    base.section("trainer")["max_steps"] = 99
    changed = base.changed({"trainer.max_steps": 2, "trainer.accelerator": "cpu"})
    assert (base.apply().model.hidden_dim, base.apply().model.num_layers) == (32, 2)
    assert base.apply().trainer.max_steps == 6 and changed.apply().trainer.max_steps == 2
    assert changed.section("trainer")["accelerator"] == "cpu" and "accelerator" not in base.section("trainer")
    assert "tracking" not in base.without("tracking").tree and "tracking" in base.tree
    spec = StudySpec(name="s", base=base.tree, overrides={"optim.lr": 5e-4})
    assert trial_config(base, spec, {"seed": 1}) == base.apply({"optim.lr": 5e-4, "seed": 1, "name": "s"})


def test_the_definition_holds_the_base_as_dotted_keys_and_the_fixed_overrides(tmp_path, wiki_validation):
    """The form every stored study's definition was recorded in (an edited study is refused by it)."""
    path = write_study(tmp_path, wiki_validation, overrides={"optim.lr": 5e-4})
    spec, base = load_study(path)
    tree = tiny_base(tmp_path, wiki_validation)
    dotted = {f"{section}.{key}": value for section, fields in tree.items() for key, value in fields.items()}
    assert definition(spec, base)["base"] == {**dotted, "optim.lr": 5e-4}
    assert definition(spec, base.changed({"trainer.max_steps": 2}))["base"]["trainer.max_steps"] == 2
