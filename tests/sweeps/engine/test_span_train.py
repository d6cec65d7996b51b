"""SQuAD end to end: a tiny pre-trained run fine-tuned on a part of the real dev files and scored on
another (v1.1; v2.0 with the no-answer threshold), exported as a transformers question-answering model
whose pipeline gives ablate's answers, and the span task's refusals."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from ablate.cli import main
from ablate.datamodules.squad import Question, collate, encode
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.load import build_config
from ablate.lightning_modules.methods.squad_metrics import best_answers
from ablate.lightning_modules.model.span import span_logits
from ablate.sweeps.engine.runner import train
from ablate.sweeps.engine.weights import export_run, load_run_span
from tests.conftest import SHARED_DATA
from tests.sweeps.conftest import trained_run

SQUAD = SHARED_DATA / "squad"


def _parts(tmp, name: str, train: slice, dev: slice) -> tuple[str, str]:
    """Two small files in the official JSON: articles ``train`` and ``dev`` of a real dev file."""
    path = SQUAD / name
    if not path.is_file():
        pytest.skip(f"shared SQuAD data not found at {path}")
    tree = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for part, articles in (("train", train), ("dev", dev)):
        file = tmp / f"{name}-{part}.json"
        file.write_text(json.dumps({"version": tree["version"], "data": tree["data"][articles]}), encoding="utf-8")
        out.append(str(file))
    return out[0], out[1]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, wiki_validation):
    tmp = tmp_path_factory.mktemp("span")
    base, result = trained_run(tmp, wiki_validation)
    return tmp, base, result


def _span(base: dict, source: str, train: str, dev: str, **task) -> dict:
    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["finetune"] = {
        "source": source,
        "task": "squad",
        "kind": "span",
        "metric": "f1",
        "train": train,
        "validation": dev,
        "train_examples": 300,
        "validation_examples": 80,
        "max_length": 64,
        "max_query_length": 20,
        "doc_stride": 24,
        "batch_size": 16,
        "lr": 2e-3,
        "max_steps": 24,
        "val_every": 12,
        **task,
    }
    return tree


@pytest.fixture(scope="module")
def squad_v1(pretrained):
    """A span run fine-tuned on 300 questions of dev-v1.1's first articles, scored on 80 of another's."""
    tmp, base, source = pretrained
    train_file, dev_file = _parts(tmp, "dev-v1.1.json", slice(0, 2), slice(10, 11))
    result = train(build_config(_span(base, f"runs:/{source.run_id}", train_file, dev_file)))
    return train_file, dev_file, result


def test_squad_v1_fine_tunes_scores_and_exports_for_the_qa_pipeline(pretrained, squad_v1, tmp_path):
    train_file, dev_file, result = squad_v1
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    m = run.data.metrics
    assert run.info.status == "FINISHED"
    for name in ("squad/exact", "squad/f1", "squad/loss", "squad/best_f1", "squad/final_f1", "squad/score"):
        assert name in m, name
    assert 0.0 <= m["squad/exact"] <= m["squad/f1"] <= 1.0 and m["squad/final_f1"] == m["squad/best_f1"]
    assert m["squad/best_f1"] > 0.0  # some answers overlap the references after 24 steps
    assert len(client.get_metric_history(result.run_id, "squad/f1")) == 2
    losses = [h.value for h in client.get_metric_history(result.run_id, "train/loss")]
    assert losses[-1] < losses[0]

    out = tmp_path / "export"
    written = export_run(result.tracking_uri, result.run_id, out)
    assert written.format == "transformers" and written.tokenizer
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["BertForQuestionAnswering"] or config["architectures"][0].endswith(
        "ForQuestionAnswering"
    )
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "pipeline_tag: question-answering" in card
    snippet = re.search(r"```python\n(.*?)```", card, re.S)
    assert snippet is not None
    code = snippet.group(1).replace("PATH/TO/THIS/FOLDER", str(out))
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    hf_tok, hf_model = AutoTokenizer.from_pretrained(str(out)), AutoModelForQuestionAnswering.from_pretrained(str(out))
    # questions whose context (the sentence holding the answer) fits one window: the same windows both ways
    cfg, model = load_run_span(result.tracking_uri, result.run_id)
    tok_file = out / "tokenizer.json"
    tree = json.loads(open(dev_file, encoding="utf-8").read())
    questions = []
    for p in tree["data"][0]["paragraphs"]:
        for qa_item in p["qas"]:
            a = qa_item["answers"][0]
            lo = p["context"].rfind(". ", 0, a["answer_start"]) + 2 if ". " in p["context"][: a["answer_start"]] else 0
            hi = p["context"].find(". ", a["answer_start"])
            context = p["context"][lo : hi if hi > 0 else None]
            if 30 < len(context) < 160 and len(qa_item["question"]) < 60:
                questions.append(Question(qa_item["id"], qa_item["question"], context, (a["text"],), (0,)))
    questions = questions[:12]
    assert len(questions) >= 6
    from tokenizers import Tokenizer

    f = FinetuneConfig(kind="span", metric="f1", max_length=64, max_query_length=20, doc_stride=24, n_best=64)
    split = encode(Tokenizer.from_file(str(tok_file)), questions, f)
    single = [i for i in range(len(questions)) if (split.dev.windows.example == i).sum() == 1]
    assert len(single) >= 4
    batch = collate([split[i] for i in range(len(split))])
    with torch.no_grad():
        start, end = span_logits(model(batch), batch["attention_mask"])
    lengths = batch["attention_mask"].sum(1).tolist()
    starts = [start[i, :n].numpy() for i, n in enumerate(lengths)]
    ends = [end[i, :n].numpy() for i, n in enumerate(lengths)]
    ours, _ = best_answers(split.dev, starts, ends, f.n_best, 30)
    for i in single:
        q = questions[i]
        assert _qa_pipeline(hf_tok, hf_model, q.question, q.context, 30) == ours[q.id], (q.question, q.context)
    assert any(ours[questions[i].id] for i in single)
    # the card's example runs as written and prints the model's answer
    printed: list[str] = []
    exec(compile(code, "README.md", "exec"), {"print": printed.append})  # noqa: S102 - the card's own example
    assert printed == [_qa_pipeline(hf_tok, hf_model, "Who wrote it?", "It was written by Ann.", 30)]


def _qa_pipeline(tokenizer, model, question: str, context: str, max_answer_len: int) -> str:
    """transformers' question-answering pipeline as transformers 4 decoded one window (the pipeline is gone in
    transformers 5): softmax over the context tokens' start and end logits, the best span by the product of
    probabilities among ``start <= end < start + max_answer_len``, its characters by the tokens' offsets
    (``align_to_words=False``)."""
    enc = tokenizer(question, context, truncation="only_second", return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0]
    undesired = torch.tensor([s != 1 for s in enc.sequence_ids(0)])
    with torch.no_grad():
        out = model(**enc)
    start = out.start_logits[0].masked_fill(undesired, -10000.0).softmax(-1)
    end = out.end_logits[0].masked_fill(undesired, -10000.0).softmax(-1)
    candidates = torch.tril(torch.triu(start[:, None] * end[None, :]), max_answer_len - 1)
    i, j = divmod(int(candidates.flatten().argmax()), candidates.shape[1])
    return context[int(offsets[i][0]) : int(offsets[j][1])]


def test_task_distillation_and_qbert_qat_work_on_a_span_task(pretrained, squad_v1):
    tmp, base, source = pretrained
    train_file, dev_file, teacher = squad_v1
    tree = _span(base, f"runs:/{source.run_id}", train_file, dev_file, max_steps=8, val_every=4)
    tree["distill"] = {"teacher": f"runs:/{teacher.run_id}", "kd_weight": 1.0, "fmt_weight": 1.0, "temperature": 2.0}
    tree["quant"] = {"method": "weight-mixed", "sensitivity": "loss", "low_bits": 4, "high_bits": 8}
    tree["quant"] |= {"high_fraction": 0.5, "calib_batches": 2, "qat_steps": 4}
    result = train(build_config(tree))
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(result.run_id)
    m = run.data.metrics
    assert run.info.status == "FINISHED" and run.data.tags["ablate.teacher_run"] == teacher.run_id
    assert {"train/kd_loss", "train/fmt_loss", "train/label_loss"} <= set(m)
    assert m["train/kd_loss"] > 0 and 4 < m["quant/avg_bits"] < 8
    assert len(client.get_metric_history(result.run_id, "squad/f1")) >= 3  # fine-tuning, then QAT's validation
    assert 0.0 <= m["squad/final_f1"] <= 1.0 and "squad/fp32_f1" in m


def test_squad_v2_chooses_the_no_answer_threshold_on_dev(pretrained):
    tmp, base, source = pretrained
    train_file, dev_file = _parts(tmp, "dev-v2.0.json", slice(0, 1), slice(5, 6))
    tree = _span(base, f"runs:/{source.run_id}", train_file, dev_file, no_answer=True, max_steps=12, val_every=12)
    result = train(build_config(tree))
    m = MlflowClient(result.tracking_uri).get_run(result.run_id).data.metrics
    for name in ("f1", "exact", "f1_thresh", "exact_thresh", "f1_at0", "HasAns_f1", "NoAns_f1", "HasAns_exact"):
        assert f"squad/{name}" in m, name
    dev = json.loads(open(dev_file, encoding="utf-8").read())
    qas = [qa for p in dev["data"][0]["paragraphs"] for qa in p["qas"]][:80]
    no_answer = sum(not qa["answers"] for qa in qas) / len(qas)
    assert 0 < no_answer < 1
    # the threshold chosen on dev is never worse than answering nothing, nor than BERT's default threshold 0
    assert m["squad/f1"] >= max(no_answer, m["squad/f1_at0"]) - 1e-12
    assert m["squad/exact"] >= m["squad/exact_at0"] - 1e-12


def test_span_refusals_are_one_line_before_any_run(pretrained, tmp_path, capsys):
    tmp, base, source = pretrained
    train_file, dev_file = _parts(tmp, "dev-v1.1.json", slice(0, 1), slice(10, 11))
    bad = json.loads(open(train_file, encoding="utf-8").read())
    bad["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 1
    bad_file = tmp_path / "bad.json"
    bad_file.write_text(json.dumps(bad), encoding="utf-8")
    client = MlflowClient(source.tracking_uri)
    exp = client.get_run(source.run_id).info.experiment_id
    before = len(client.search_runs([exp]))
    src = f"runs:/{source.run_id}"
    cases = [
        (
            _span(base, src, str(bad_file), dev_file),
            r"finetune.train: .*bad.json: question \S+: answer .* answer_start",
        ),
        (_span(base, src, train_file, dev_file, exits=True, exit_steps=2), "finetune.exits"),
        (_span(base, src, train_file, dev_file, metric="accuracy"), "finetune.metric"),
        (_span(base, src, train_file, dev_file, max_query_length=62), "finetune.max_query_length"),
        (_span(base, src, train_file, dev_file, augment_copies=2), "finetune.augment_copies"),
    ]
    for tree, message in cases:
        path = tmp_path / "span.yaml"
        path.write_text(yaml.safe_dump(tree))
        assert main(["train", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err and err[-1].startswith("error: ") and re.search(message, err[-1]), (message, err)
    assert len(client.search_runs([exp])) == before
