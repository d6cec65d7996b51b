"""The overview's technique columns, read from configs: each system's, in its stage."""

from __future__ import annotations

import pytest

from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.methods.techniques import TECHNIQUES, applied, stages_of

TINY = {"model": {"preset": "bert-tiny", "vocab_size": 1000}}
FT = {"finetune.source": "runs:/s", "finetune.train": "t.tsv", "finetune.validation": "v.tsv"}


def cfg(**overrides):
    return build_config(TINY, overrides)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, set()),
        ({"model.embed_dim": 32, "model.sharing": "all"}, {"factorization", "sharing"}),  # ALBERT
        ({"distill.teacher": "runs:/t", "model.intra_dim": 32}, {"distillation", "factorization"}),  # MobileBERT
        ({"prune.source": "runs:/p"}, {"pruning"}),  # schuBERT
        ({"quant.source": "runs:/q", "quant.method": "weight-mixed"}, {"quantization"}),  # Q-BERT's model
        ({"quant.embeddings": "int8"}, {"quantization"}),
        ({**FT, "finetune.exits": True, "finetune.exit_steps": 5}, {"distillation"}),  # FastBERT
        ({**FT, "distill.teacher": "runs:/t"}, {"distillation"}),  # task distillation
        ({**FT, "model.sharing": "all"}, set()),  # a fine-tuning run inherits its architecture
    ],
)
def test_each_config_applies_its_techniques(overrides, expected):
    assert applied(cfg(**overrides)) == expected


def test_a_trial_says_where_each_technique_is_applied():
    tinybert = stages_of(cfg(**{"distill.teacher": "runs:/t"}), [cfg(**FT, **{"distill.teacher": "runs:/t"})])
    assert tinybert["technique.distillation"] == "both"
    qbert = stages_of(cfg(), [cfg(**FT, **{"quant.method": "weight-int4", "quant.qat_steps": 5})])
    assert qbert["technique.quantization"] == "fine-tuning"
    albert = stages_of(cfg(**{"model.sharing": "all"}), [])
    assert albert["technique.sharing"] == "pre-training" and albert["technique.pruning"] == "-"
    assert list(albert) == [f"technique.{name}" for name in TECHNIQUES]
