"""Every shipped study validates (fields, grid, report), and variants expand into configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ablate.lightning_modules.errors import ConfigError
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
