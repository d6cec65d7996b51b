"""A fine-tuning run's dev predictions as its ``predictions/`` artifacts: SQuAD's files, on which the
official evaluation scripts (:mod:`tests.sweeps.squad_official`, the reference) print the run's logged EM
and F1 to the last digit (v1.1; v2.0 with ``null_odds.json``); a classification run's TSV, whose accuracy is
the one logged; ``ablate predict`` on both runs gives the same predictions again, in the benchmarks'
formats, and refuses what it cannot read in one line, writing nothing."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.lightning_modules.config.load import build_config
from ablate.sweeps.engine.runner import train
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import trained_run

SQUAD = SHARED_DATA / "squad"
RTE = SHARED_DATA / "glue" / "rte" / "validation.tsv"
ROOT = Path(__file__).resolve().parents[3]


def _squad_parts(tmp, name: str, questions: int) -> tuple[str, str]:
    """A training file (two articles) and a dev file of about ``questions`` whole questions, in the official JSON."""
    path = SQUAD / name
    if not path.is_file():
        pytest.skip(f"shared SQuAD data not found at {path}")
    tree = json.loads(path.read_text(encoding="utf-8"))
    article = dict(tree["data"][10])
    kept, n = [], 0
    for p in article["paragraphs"]:
        if n >= questions:
            break
        kept.append(p)
        n += len(p["qas"])
    article["paragraphs"] = kept
    out = []
    for part, data in (("train", tree["data"][:2]), ("dev", [article])):
        file = tmp / f"{name}-{part}.json"
        file.write_text(json.dumps({"version": tree["version"], "data": data}), encoding="utf-8")
        out.append(str(file))
    return out[0], out[1]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, wiki_validation):
    tmp = tmp_path_factory.mktemp("predictions")
    base, result = trained_run(tmp, wiki_validation)
    return tmp, base, result


def _finetune(base: dict, source, **task) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["finetune"] = {"source": f"runs:/{source.run_id}", "batch_size": 16, "lr": 2e-3, **task}
    return tree


def _span(pretrained, name: str, **task):
    tmp, base, source = pretrained
    train_file, dev_file = _squad_parts(tmp, name, 30)
    span = {"task": "squad", "kind": "span", "metric": "f1", "train": train_file, "validation": dev_file}
    span |= {"train_examples": 200, "max_length": 64, "max_query_length": 20, "doc_stride": 24}
    result = train(build_config(_finetune(base, source, **span, max_steps=16, val_every=8, **task)))
    return dev_file, result


@pytest.fixture(scope="module")
def squad_v1(pretrained):
    return _span(pretrained, "dev-v1.1.json")


@pytest.fixture(scope="module")
def rte(pretrained):
    if not RTE.is_file():
        pytest.skip(f"shared GLUE data not found at {RTE}")
    tmp, base, source = pretrained
    task = {"task": "rte", "train_examples": 64, "validation_examples": 40, "max_length": 64}
    return train(build_config(_finetune(base, source, **task, max_steps=8, val_every=4)))


def _logged(result, tmp_path) -> dict:
    client = MlflowClient(result.tracking_uri)
    folder = client.download_artifacts(result.run_id, "predictions", str(tmp_path))
    return {p.name: p for p in Path(folder).iterdir()}


def _official(version: str, *args: str) -> dict:
    """The official script's printed scores (the reference, run as a command)."""
    cmd = [sys.executable, "-m", "tests.sweeps.squad_official", version, *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_squad_v1_predictions_give_the_logged_scores_under_the_official_script(squad_v1, tmp_path):
    dev_file, result = squad_v1
    m = MlflowClient(result.tracking_uri).get_run(result.run_id).data.metrics
    files = _logged(result, tmp_path)
    assert set(files) == {"predictions.json", "nbest_predictions.json"}
    official = _official("v1.1", dev_file, str(files["predictions.json"]))
    assert official["exact_match"] / 100 == m["squad/best_exact"]
    assert official["f1"] / 100 == m["squad/best_f1"] > 0
    preds = json.loads(files["predictions.json"].read_text(encoding="utf-8"))
    nbest = json.loads(files["nbest_predictions.json"].read_text(encoding="utf-8"))
    assert len(preds) >= 30 and set(nbest) == set(preds)
    for qid, entries in nbest.items():
        assert entries[0]["text"] == preds[qid] and 1 <= len(entries) <= 20
        assert set(entries[0]) == {"text", "probability", "start_logit", "end_logit"}
        assert abs(sum(e["probability"] for e in entries) - 1) < 1e-9
        scores = [e["start_logit"] + e["end_logit"] for e in entries]
        assert scores == sorted(scores, reverse=True) and len({e["text"] for e in entries}) == len(entries)


def test_squad_v2_predictions_and_null_odds_give_the_logged_scores(pretrained, tmp_path):
    dev_file, result = _span(pretrained, "dev-v2.0.json", no_answer=True)
    m = MlflowClient(result.tracking_uri).get_run(result.run_id).data.metrics
    files = _logged(result, tmp_path)
    assert set(files) == {"predictions.json", "nbest_predictions.json", "null_odds.json"}
    args = (dev_file, str(files["predictions.json"]), "-n", str(files["null_odds.json"]))
    official = _official("v2.0", *args)
    assert official["NoAns_total"] > 0 and official["HasAns_total"] > 0
    assert official["best_exact"] / 100 == m["squad/best_exact"]
    assert official["best_f1"] / 100 == m["squad/best_f1"]
    assert official["best_f1_thresh"] == m["squad/best_f1_thresh"]
    assert official["exact"] / 100 == m["squad/best_exact_at0"] and official["f1"] / 100 == m["squad/best_f1_at0"]
    nbest = json.loads(files["nbest_predictions.json"].read_text(encoding="utf-8"))
    assert all(any(e["text"] == "" for e in entries) for entries in nbest.values())  # the no-answer candidate


def test_a_classification_run_logs_its_dev_predictions_as_a_tsv(rte, tmp_path):
    m = MlflowClient(rte.tracking_uri).get_run(rte.run_id).data.metrics
    files = _logged(rte, tmp_path)
    assert set(files) == {"rte.tsv"}
    rows = list(csv.reader(files["rte.tsv"].open(encoding="utf-8"), delimiter="\t"))
    assert rows[0] == ["id", "prediction", "label"] and len(rows) == 41
    truth = list(csv.reader(RTE.open(encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE))[1:41]
    names = ["entailment", "not_entailment"]
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(40)]
    assert [r[2] for r in rows[1:]] == [names[int(t[2])] for t in truth]
    assert {r[1] for r in rows[1:]} <= set(names)
    assert sum(r[1] == r[2] for r in rows[1:]) / 40 == pytest.approx(m["rte/best_accuracy"], abs=1e-6)


def test_predict_writes_glue_submissions_and_squad_predictions(rte, squad_v1, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    test_file = tmp_path / "rte-test.tsv"  # as GLUE's test files: an index, the texts, no label
    lines = RTE.read_text(encoding="utf-8").splitlines()[1:41]
    rows = [
        "index\tsentence1\tsentence2",
        *(f"{i}\t" + "\t".join(line.split("\t")[:2]) for i, line in enumerate(lines)),
    ]
    test_file.write_text("\n".join(rows) + "\n", encoding="utf-8")
    uri = ["--tracking-uri", rte.tracking_uri]
    assert main(["predict", f"runs:/{rte.run_id}", str(test_file), *uri]) == 0
    assert "40 predictions" in capsys.readouterr().out
    written = list(csv.reader((tmp_path / "RTE.tsv").open(encoding="utf-8"), delimiter="\t"))
    logged = list(csv.reader(_logged(rte, tmp_path / "a")["rte.tsv"].open(encoding="utf-8"), delimiter="\t"))
    assert written[0] == ["index", "prediction"]
    assert [r[1] for r in written[1:]] == [r[1] for r in logged[1:]]  # the kept model, the same rows
    dev_file, span = squad_v1
    out = tmp_path / "answers.json"
    assert main(["predict", span.run_id, dev_file, "--out", str(out), "--tracking-uri", span.tracking_uri]) == 0
    logged_answers = json.loads(_logged(span, tmp_path / "b")["predictions.json"].read_text(encoding="utf-8"))
    assert json.loads(out.read_text(encoding="utf-8")) == logged_answers


def test_predict_refuses_in_one_line_and_writes_nothing(rte, pretrained, tmp_path, monkeypatch, capsys):
    _, _, source = pretrained
    monkeypatch.chdir(tmp_path)
    no_label = tmp_path / "in" / "other.tsv"
    no_label.parent.mkdir()
    no_label.write_text("index\tpremise\n0\ta\n", encoding="utf-8")
    uri = ["--tracking-uri", rte.tracking_uri]
    cases = [
        (["predict", "0123abc", str(RTE), *uri], r"^error: RUN: 0123abc: no such run"),
        (["predict", source.run_id, str(RTE), *uri], r"^error: RUN: runs:/\S+ is a pre-training run"),
        (["predict", rte.run_id, "missing.tsv", *uri], r"^error: FILE: missing.tsv: no such file"),
        (["predict", rte.run_id, str(no_label), *uri], r"^error: FILE: \S+other.tsv: no column 'sentence1'"),
        (["predict", rte.run_id, str(RTE), "--out", "no/such/x.tsv", *uri], r"^error: --out: .*does not exist"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.search(message, err[0]), (message, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
