"""``ablate predict``'s output as each benchmark takes it: GLUE's submission labels (names for MNLI, QNLI,
RTE; numbers for CoLA, SST-2, MRPC, QQP, WNLI; STS-B's score) and file names; another task's labels by
``finetune.label_names``. The command on real runs: :mod:`tests.sweeps.engine.test_predictions`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.sweeps.engine.predict import default_output, submission_label
from ablate.sweeps.engine.predictions import dev_table, label_text


def test_glue_submissions_name_or_number_the_labels_as_glue_takes_them():
    rte = FinetuneConfig(task="rte", label_names=("entailment", "not_entailment"))
    sst2 = FinetuneConfig(task="sst2", label_names=("negative", "positive"))
    mnli = FinetuneConfig(task="x", glue="mnli", num_labels=3, label_names=("entailment", "neutral", "contradiction"))
    stsb = FinetuneConfig(task="stsb", kind="regression", num_labels=1, metric="pearson")
    own = FinetuneConfig(task="mine", label_names=("no", "yes"))
    assert [submission_label(v, rte) for v in (0, 1)] == ["entailment", "not_entailment"]
    assert [submission_label(v, sst2) for v in (0, 1)] == ["0", "1"]
    assert submission_label(2, mnli) == "contradiction" and submission_label(3.25, stsb) == "3.25"
    assert submission_label(1, own) == "yes" and label_text(1, FinetuneConfig(task="mine")) == "1"
    assert default_output(sst2, Path("test.tsv")) == Path("SST-2.tsv")
    assert default_output(mnli, Path("test_matched.tsv")) == Path("MNLI-m.tsv")
    assert default_output(mnli, Path("test_mismatched.tsv")) == Path("MNLI-mm.tsv")
    assert default_output(own, Path("t.tsv")) == Path("mine.tsv")
    assert default_output(FinetuneConfig(task="squad", kind="span", metric="f1"), Path("d.json")) == Path(
        "predictions.json"
    )


def test_a_dev_table_has_an_id_the_prediction_and_the_label_per_row():
    stsb = FinetuneConfig(task="stsb", kind="regression", num_labels=1, metric="pearson")
    table = dev_table(np.array([1.5, 4.123456789]), np.array([2.0, 5.0], dtype=np.float32), stsb)
    assert table == "id\tprediction\tlabel\n0\t1.5\t2\n1\t4.12346\t5\n"
