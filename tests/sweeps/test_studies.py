"""Every shipped study validates (fields, grid, report), and variants expand into configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ablate.lightning_modules.config.errors import ConfigError
from ablate.reports.catalog import study_report
from ablate.sweeps.spec import corner_configs, load_study

STUDIES = sorted((Path(__file__).resolve().parents[2] / "sweeps" / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_shipped_study_is_valid(path):
    spec, base = load_study(path)
    assert study_report(spec, path).metrics
    assert spec.total_trials() == len(corner_configs(spec, base)) * len(spec.seeds)


def test_variants_expand_and_name_bad_keys(tmp_path):
    spec, base = load_study(next(p for p in STUDIES if p.stem == "schubert_shapes"))
    configs = {c.model.num_layers: c.model for c in corner_configs(spec, base)}
    assert set(configs) == {2, 4, 8}
    slanted = [c for c in corner_configs(spec, base) if c.model.layers is not None]
    assert [s.ffn_dim for s in slanted[0].model.layers] == [816, 680, 408, 272]
    raw = yaml.safe_load(STUDIES[0].read_text())
    raw["variants"] = {"broken": {"model.colour": 1}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="variants.broken.model.colour: not a config field"):
        load_study(bad)


def test_the_distilbert_recipe_is_the_papers(capsys):
    from ablate.cli import main
    from ablate.lightning_modules.config.load import load_config
    from ablate.lightning_modules.measure.accounting import report_for

    recipe = Path(__file__).resolve().parents[2] / "sweeps" / "recipes" / "distilbert.yaml"
    cfg = load_config(recipe, ["distill.teacher=runs:/teacher"])
    d, m = cfg.distill, cfg.model
    assert (cfg.regime, m.num_layers, m.hidden_dim, m.num_heads, m.token_types) == ("distill", 6, 768, 12, 0)
    assert (d.init_layers, d.init_embeddings, d.mlm_weight, d.kd_weight, d.cos_weight, d.temperature) == (
        "every_other",
        "all",
        2.0,
        5.0,
        1.0,
        2.0,
    )
    assert (d.fmt_weight, d.at_weight, cfg.objective.sentence) == (0.0, 0.0, "none")
    assert abs(report_for(m).backbone - 66e6) < 1e6  # DistilBERT: 66M
    assert main(["train", str(recipe), "--print-config"]) == 0  # from bert-base-uncased, with its tokenizer
    shipped = load_config(recipe)
    assert (shipped.distill.teacher, shipped.data.tokenizer, m.vocab_size) == ("bert-base-uncased",) * 2 + (30522,)
