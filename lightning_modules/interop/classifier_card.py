"""The part of an export's model card that a fine-tuned sequence classifier (or regressor) adds: what it
predicts, its labels, its dev score and a ``## Use`` example with transformers' ``text-classification``
pipeline that runs as written (docs/guides/interop.md, "A fine-tuned classifier"). Torch-free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ablate.lightning_modules.config.experiment import ExperimentConfig
    from ablate.lightning_modules.config.finetune import FinetuneConfig
    from ablate.lightning_modules.model.classifier import Classifier

# the card's example inputs: one text (single-sentence tasks) or one pair per line
_SENTENCES = ("A gripping, moving film.", "A dull, lifeless script that goes nowhere.")
_PAIRS = (("A man is playing a guitar.", "A person plays the guitar."), ("A dog runs.", "Stocks fell."))


def tokenizer_length(cfg: ExperimentConfig, classifier: bool) -> int:
    """The exported tokenizer's ``model_max_length``: a classifier's ``finetune.max_length`` (the tokens it
    was fine-tuned and scored on, so that truncating there scores texts as ablate did), else
    ``model.max_position``."""
    m = cfg.model.max_position
    return min(cfg.finetune.max_length, m) if classifier else m


def _names(labels: Sequence[str] | None) -> str:
    """How the card names the outputs: their ``id2label`` names, or transformers' ``LABEL_i``."""
    if labels is None:
        return "`LABEL_i`; `finetune.label_names` or `ablate export --labels` names them"
    return ", ".join(f"{i} `{name}`" for i, name in enumerate(labels))


def _example(pair: bool, regression: bool, where: str, length: int, labels: Sequence[str] | None) -> list[str]:
    """The ``## Use`` code block of a transformers classifier export."""
    inputs = (
        [f"    {{'text': {a!r}, 'text_pair': {b!r}}}," for a, b in _PAIRS]
        if pair
        else [f"    {text!r}," for text in _SENTENCES]
    )
    options = 'truncation=True, function_to_apply="none"' if regression else "truncation=True"
    names = ", ".join(labels) if labels is not None else "LABEL_0" if regression else "LABEL_0, LABEL_1, ..."
    result = (
        f"# one {{'label': '{names}', 'score': the predicted value}} per input"
        if regression
        else f"# one {{'label': ..., 'score': its probability}} per input; labels: {names}"
    )
    return [
        "```python",
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline",
        "",
        f"# truncation=True: an input longer than the model's {length} tokens is cut to them, as in fine-tuning"
        + ("; function_to_apply='none': the score is the model's output" if regression else ""),
        f'classify = pipeline("text-classification", model="{where}", {options})',
        f"inputs = [{'  # sentence pairs: text, text_pair' if pair else ''}",
        *inputs,
        "]",
        "print(classify(inputs))",
        result,
        "",
        f'model = AutoModelForSequenceClassification.from_pretrained("{where}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{where}")',
        "```",
    ]


def classifier_use(
    model: Classifier,
    cfg: ExperimentConfig,
    name: str,
    what: str,
    hf_class: str | None,
    metrics: Mapping[str, float],
    source: str | None,
    where: str,
    labels: Sequence[str] | None = None,
) -> list[str]:
    """A classifier card's description and ``## Use`` section (``labels``: its ``id2label`` names, None:
    ``LABEL_i``)."""
    f = cfg.finetune
    pair, regression = len(f.text_fields) == 2, f.kind == "regression"
    inputs = "sentence pairs (" + ", ".join(f"`{t}`" for t in f.text_fields) + ")" if pair else "single sentences"
    outputs = "one output, a score" if regression else f"{model.num_labels} labels"
    lines = [
        f"{name} sequence {'regressor' if regression else 'classifier'} fine-tuned with ablate on the task "
        f"`{f.task}` ({outputs}, {inputs})" + (f" in {source}" if source else "") + f", exported as {what}. "
        f"Its encoder was pre-trained as `{f.source}`.",
    ]
    lines += _dev_score(f, metrics)
    lines += ["", _outputs_meaning(model, f, hf_class, labels), "", "## Use", ""]
    if hf_class:
        length = tokenizer_length(cfg, classifier=True)
        lines += _example(pair, regression, where, length, labels)
        lines += [
            "",
            f"The tokenizer cuts texts at {length} tokens (`finetune.max_length`), as fine-tuning and ablate's dev "
            "scores did"
            + (
                "; a pair's longer text is cut first, and its segment ids are BERT's (0 for `[CLS]` a `[SEP]`, "
                "1 for b `[SEP]`)."
                if pair
                else "."
            )
            + " In ablate, `ablate.lightning_modules.interop.classifier.load_classifier(folder)` loads it as "
            "ablate's classifier.",
        ]
    return lines


def _dev_score(f: FinetuneConfig, metrics: Mapping[str, float]) -> list[str]:
    """The card's line of the run's dev score (none where the run logged none)."""
    score = next(
        (metrics[k] for k in (f"{f.task}/final_{f.metric}", f"{f.task}/best_{f.metric}") if k in metrics), None
    )
    if score is None:
        return []
    base = metrics.get(f"{f.task}/majority_accuracy")
    return [
        "",
        f"Dev {f.metric} (`finetune.metric`): **{score:.4g}** on `{f.validation or f.task}`"
        + (f" (majority-class accuracy {base:.4g})." if base is not None else "."),
    ]


def _outputs_meaning(model: Classifier, f: FinetuneConfig, hf_class: str | None, labels: Sequence[str] | None) -> str:
    """What the exported outputs mean, and what becomes of FastBERT's exits."""
    exits = (
        "Its FastBERT exit classifiers (`finetune.exits`) are not exported: transformers has no place for them, "
        "so every layer runs and the final classifier decides."
        if model.exits is not None or f.exits
        else "It has no FastBERT exits (`finetune.exits`), which are never exported: transformers has no place "
        "for them."
    )
    named = f" (`id2label`: {_names(labels)})" if hf_class else ""
    meaning = (
        f"Its output{named} is the predicted value of the task's `{f.label_field}` column "
        "(`problem_type: regression`: trained with MSE, no softmax or sigmoid)."
        if f.kind == "regression"
        else f"Class `i` is label `i` of the task's `{f.label_field}` column{named}."
    )
    return f"{meaning} {exits}"
