"""A fine-tuning run's classifier, kept as its ``model/`` artifacts: ``ablate export`` makes it a transformers
sequence classifier whose ``text-classification`` pipeline labels real SST-2 sentences as ablate's own
classifier does; ablate reads it back as a classifier and refuses it, by name, where a pre-trained model goes."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
import yaml

transformers = pytest.importorskip("transformers")

from ablate.cli import main  # noqa: E402
from ablate.lightning_modules.config.errors import ConfigError  # noqa: E402
from ablate.lightning_modules.config.experiment import to_dict  # noqa: E402
from ablate.lightning_modules.config.load import build_config  # noqa: E402
from ablate.lightning_modules.interop.classifier import load_classifier  # noqa: E402
from ablate.lightning_modules.model.classifier import Classifier, build_classifier  # noqa: E402
from ablate.sweeps.engine import tracking  # noqa: E402
from ablate.sweeps.engine.sources import load_classifier_source, load_source  # noqa: E402
from ablate.sweeps.engine.weights import (  # noqa: E402
    export_run,
    load_run_classifier,
    load_run_weights,
    log_weights,
    run_tokenizer,
)
from tests.conftest import SHARED_DATA  # noqa: E402
from tests.sweeps.conftest import trained_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SST2 = SHARED_DATA / "sst2"
TOL = 1e-4
T = 64  # the tiny model's positions: sentences are truncated to them, on both sides


def _sst2(split: str, n: int) -> tuple[list[str], list[int]]:
    rows = [line.split("\t") for line in (SST2 / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1 : n + 1]]
    return [r[0].strip() for r in rows], [int(r[1]) for r in rows]


def _encode(tokenizer_file, sentences: list[str]) -> dict[str, torch.Tensor]:
    """The batch ablate's classifier reads: the run's own tokenizer (``tokenizers``), [CLS] a [SEP], padded."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.enable_truncation(T)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"))
    enc = tok.encode_batch(sentences)
    return {
        "input_ids": torch.tensor([e.ids for e in enc]),
        "token_type_ids": torch.tensor([e.type_ids for e in enc]),
        "attention_mask": torch.tensor([e.attention_mask for e in enc]).bool(),
    }


def _fine_tune(model: Classifier, batch: dict[str, torch.Tensor], labels: torch.Tensor, steps: int = 120) -> None:
    """A few real optimizer steps on SST-2 training sentences, so that the classifier's labels mean something."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        rows = torch.randint(0, len(labels), (32,), generator=g)
        loss = F.cross_entropy(model({k: v[rows] for k, v in batch.items()}), labels[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, wiki_validation):
    """A tiny ALBERT pre-trained on real text, fine-tuned briefly on SST-2 and logged, as a fine-tuning run
    logs its classifier, into a run of the same store (regime finetune)."""
    if not (SST2 / "validation.tsv").is_file() or not (SST2 / "train.tsv").is_file():
        pytest.skip(f"shared test data not found at {SST2}")
    tmp = tmp_path_factory.mktemp("classifier")
    base, pre = trained_run(tmp, wiki_validation)
    uri, client = pre.tracking_uri, tracking.connect(pre.tracking_uri)
    pre_cfg, pretrained = load_run_weights(uri, pre.run_id)
    tokenizer = run_tokenizer(client, pre.run_id, tmp)

    torch.manual_seed(0)
    model = build_classifier(pretrained, num_labels=2, dropout=0.1, init_std=0.02)
    train_text, train_labels = _sst2("train", 512)
    _fine_tune(model, _encode(tokenizer, train_text), torch.tensor(train_labels))
    dev_text, dev_labels = _sst2("validation", 200)
    dev = _encode(tokenizer, dev_text)
    with torch.no_grad():
        logits = model(dev)
    accuracy = (logits.argmax(-1) == torch.tensor(dev_labels)).float().mean().item()

    tree = yaml.safe_load(yaml.safe_dump(base))
    tree["finetune"] = {
        "source": f"runs:/{pre.run_id}",
        "task": "sst2",
        "num_labels": 2,
        "max_length": T,
        "train": str(SST2 / "train.tsv"),
        "validation": str(SST2 / "validation.tsv"),
    }
    cfg = build_config(tree)
    assert cfg.regime == "finetune" and cfg.model == pre_cfg.model
    exp = tracking.experiment_id(client, "finetune", uri)
    run_id = tracking.start_run(client, exp, "sst2", {})
    tracking.log_run_inputs(client, run_id, cfg, {}, tokenizer)  # params (regime finetune), config, tokenizer
    log_weights(client, run_id, model, cfg, tokenizer)
    client.log_metric(run_id, "sst2/final_accuracy", accuracy)
    tracking.end_run(client, run_id, "FINISHED")
    return tmp, uri, pre.run_id, run_id, model, tokenizer, dev_text, dev, logits


def test_the_cli_exports_a_finetune_run_as_a_transformers_text_classifier(finetuned, capsys):
    tmp, uri, _, run_id, _, tokenizer, dev_text, dev, logits = finetuned
    out = tmp / "sst2-classifier"
    assert main(["export", f"runs:/{run_id}", str(out), "--tracking-uri", uri]) == 0
    assert "(transformers format; a fine-tuned sequence classifier)" in capsys.readouterr().out
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        "ablate.yaml",
    } <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["AlbertForSequenceClassification"]
    names = {"0": "negative", "1": "positive"}  # task sst2: the GLUE table's label names
    assert config["id2label"] == names and config["label2id"] == {"negative": 0, "positive": 1}
    card = (out / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and f"`runs:/{run_id}`" in card
    assert "(`id2label`: 0 `negative`, 1 `positive`)" in card
    assert "sequence classifier fine-tuned with ablate on the task `sst2` (2 labels" in card
    assert (
        "Dev accuracy (`finetune.metric`): **" in card and "exits (`finetune.exits`), which are never exported" in card
    )

    # the same tokens through transformers' tokenizer as through the run's
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    hf_batch = hf_tok(dev_text, truncation=True, padding=True, return_tensors="pt")
    assert hf_tok.model_max_length == T and torch.equal(hf_batch["input_ids"], dev["input_ids"])
    # the same logits from AutoModelForSequenceClassification ...
    auto = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        theirs = auto(**hf_batch).logits
    assert (theirs - logits).abs().max() < TOL
    # ... and the same labels from the text-classification pipeline, on raw sentences
    classify = transformers.pipeline("text-classification", model=str(out))
    predicted = [auto.config.label2id[r["label"]] for r in classify(dev_text, truncation=True, batch_size=50)]
    assert predicted == logits.argmax(-1).tolist()
    assert len(set(predicted)) == 2  # a classifier that tells the sentences apart, not a constant


def test_export_names_the_classes_it_is_given(finetuned, capsys):
    """``--labels`` names the classes in ``id2label`` (and the card); a count that is not the classifier's
    is refused before anything is written."""
    tmp, uri, _, run_id, _, _, dev_text, _, logits = finetuned
    out = tmp / "named"
    assert main(["export", run_id, str(out), "--tracking-uri", uri, "--labels", "negative,positive,neutral"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --labels: negative, positive, neutral: give 2 different names, one per class, in the order of the "
        "task's label ids"
    )
    assert not out.exists() or not any(out.iterdir())
    assert main(["export", run_id, str(out), "--tracking-uri", uri, "--labels", "negative, positive"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert "(`id2label`: 0 `negative`, 1 `positive`)" in (out / "README.md").read_text()
    classify = transformers.pipeline("text-classification", model=str(out))
    names = [r["label"] for r in classify(dev_text[:20], truncation=True)]
    assert names == [("negative", "positive")[i] for i in logits[:20].argmax(-1).tolist()]


def test_an_ablate_format_export_and_the_run_load_back_as_the_classifier(finetuned):
    tmp, uri, _, run_id, model, tokenizer, _, dev, logits = finetuned
    cfg, loaded = load_run_classifier(uri, run_id)
    assert cfg.regime == "finetune" and loaded.num_labels == 2 and not loaded.training
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())

    written = export_run(uri, run_id, tmp / "ablate-format", format="ablate")
    assert (written.format, written.tokenizer, written.classifier) == ("ablate", True, True)
    _, from_folder = load_classifier(tmp / "ablate-format")
    with torch.no_grad():
        assert torch.equal(from_folder(dev), logits)

    run_source = load_classifier_source(f"runs:/{run_id}", uri, tmp / "teacher", field="distill.teacher")
    assert (run_source.run_id, run_source.num_labels, run_source.model_cfg) == (run_id, 2, cfg.model)
    assert run_source.tokenizer is not None and run_source.tokenizer.read_bytes() == tokenizer.read_bytes()
    folder = load_classifier_source(str(tmp / "ablate-format"), uri, tmp / "teacher2", field="distill.teacher")
    assert folder.run_id is None and folder.tokenizer == tmp / "ablate-format" / "tokenizer.json"


def test_each_reader_says_which_kind_of_model_a_run_holds(finetuned):
    tmp, uri, pre_id, run_id, model, tokenizer, *_ = finetuned
    client = tracking.connect(uri)
    bare = tracking.start_run(client, tracking.experiment_id(client, "finetune", uri), "no weights", {})
    client.log_param(bare, "regime", "finetune")
    cases = [
        (
            lambda: load_classifier_source(f"runs:/{pre_id}", uri, tmp, field="distill.teacher"),
            f"distill.teacher: runs:/{pre_id} is a pre-training run, not a fine-tuned classifier",
        ),
        (
            lambda: load_source(f"runs:/{run_id}", uri, tmp, field="finetune.source"),
            f"finetune.source: run {run_id} is a fine-tuned classifier (regime finetune, from runs:/{pre_id})",
        ),
        (lambda: load_run_weights(uri, run_id), f"run {run_id} is a fine-tuned classifier"),
        (
            lambda: load_classifier_source(f"runs:/{bare}", uri, tmp, field="distill.teacher"),
            f"distill.teacher: run {bare}: saved no weights",
        ),
        (
            lambda: load_classifier_source(str(tmp / "missing"), uri, tmp, field="distill.teacher"),
            "distill.teacher: ",
        ),
    ]
    for call, needle in cases:
        with pytest.raises(ConfigError) as info:
            call()
        assert str(info.value).startswith(needle) and "\n" not in str(info.value), str(info.value)

    wrong = build_config({"model": {"preset": "albert-tiny"}, "finetune": {"source": "runs:/x", "num_labels": 2}})
    with pytest.raises(ValueError, match="cfg.model does not describe the classifier's encoder"):
        log_weights(client, bare, model, wrong, tokenizer)


def _use_block(card: str) -> str:
    """The card's ``## Use`` code block, as a user copies it."""
    use = card.split("## Use", 1)[1]
    return use.split("```python\n", 1)[1].split("\n```", 1)[0]


def test_the_cards_example_runs_as_written_over_the_whole_sst2_dev_set(finetuned, capsys):
    """A run whose config names its labels (as the GLUE task table does) exports them as ``id2label``; its
    card's example, pointed at the folder and run as written, labels every one of SST-2's 872 dev sentences
    (the pipeline it builds truncates, as fine-tuning did: without truncation it fails on the long ones) as
    ablate's classifier does."""
    tmp, uri, _, run_id, model, tokenizer, *_ = finetuned
    cfg, _ = load_run_classifier(uri, run_id)
    tree = to_dict(cfg)
    tree["finetune"]["label_names"] = ["negative", "positive"]
    named = build_config(tree)
    client = tracking.connect(uri)
    named_id = tracking.start_run(client, tracking.experiment_id(client, "finetune", uri), "sst2 named", {})
    tracking.log_run_inputs(client, named_id, named, {}, tokenizer)
    log_weights(client, named_id, model, named, tokenizer)
    tracking.end_run(client, named_id, "FINISHED")

    out = tmp / "sst2-named"
    assert main(["export", named_id, str(out), "--tracking-uri", uri]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert main(["export", named_id, str(tmp / "renamed"), "--tracking-uri", uri, "--labels", "bad,good"]) == 0
    assert json.loads((tmp / "renamed" / "config.json").read_text())["id2label"] == {"0": "bad", "1": "good"}
    capsys.readouterr()
    assert main(["export", named_id, str(tmp / "three"), "--tracking-uri", uri, "--labels", "a,b,c"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --labels: a, b, c: give 2 different names, one per class, in the order of the task's label ids"
    )
    assert not (tmp / "three").exists() or not any((tmp / "three").iterdir())

    card = (out / "README.md").read_text()
    assert "labels: negative, positive" in card and "cut to them" in card and "`model_max_length` 64" in card
    code = _use_block(card)
    assert code.count("PATH/TO/THIS/FOLDER") == 3 and "truncation=True" in code
    namespace: dict[str, object] = {}
    exec(code.replace("PATH/TO/THIS/FOLDER", str(out)), namespace)  # noqa: S102 - the card's own example
    printed = capsys.readouterr().out
    assert printed.count("'label': '") == 2 and all(name in ("negative", "positive") for name in _labels(printed))

    sentences, _ = _sst2("validation", 872)
    assert len(sentences) == 872
    classify = namespace["classify"]
    results = classify(sentences, batch_size=64)  # type: ignore[operator]
    assert len(results) == 872
    with torch.no_grad():
        ours = model(_encode(tokenizer, sentences)).argmax(-1).tolist()
    assert [("negative", "positive").index(r["label"]) for r in results] == ours

    plain = transformers.pipeline("text-classification", model=str(out))  # what the card said before: no truncation
    lengths = transformers.AutoTokenizer.from_pretrained(out)(sentences)["input_ids"]
    longest = max(range(872), key=lambda i: len(lengths[i]))
    assert len(lengths[longest]) > T
    with pytest.raises((IndexError, RuntimeError, ValueError)):
        plain(sentences[longest])


def _labels(printed: str) -> list[str]:
    return [part.split("'", 1)[0] for part in printed.split("'label': '")[1:]]
