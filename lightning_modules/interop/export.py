"""Export: a trained model as a new folder a user can load (:func:`export`): a transformers checkpoint
when the config is expressible, else ablate's ``model.safetensors``; ``ablate.yaml``, the run's
tokenizer and a model card either way. A fine-tuned classifier exports as a
``*ForSequenceClassification`` without its FastBERT exits, a span model through
:func:`~ablate.lightning_modules.interop.qa_export.export_span` (docs/guides/interop.md, "Export")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ablate.lightning_modules.config.errors import ConfigError, require
from ablate.lightning_modules.config.experiment import ExperimentConfig, to_yaml
from ablate.lightning_modules.interop.classifier import (
    EXPORT_YAML,
    WEIGHTS,
    export_labels,
    to_transformers_classifier,
    without_exits,
    write_labels,
)
from ablate.lightning_modules.interop.classifier_card import tokenizer_length
from ablate.lightning_modules.interop.hub import CARD, model_card, redact, save_tokenizer, staged
from ablate.lightning_modules.interop.maps import CLASSES, CLASSIFIER_CLASSES, family
from ablate.lightning_modules.interop.pretrained import state_dict, to_transformers
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.heads import PretrainingModel

if TYPE_CHECKING:  # transformers is imported when used (the hf extra)
    from transformers import PreTrainedModel


def export(
    model: PretrainingModel | Classifier,
    cfg: ExperimentConfig,
    out_dir: str | Path,
    format: Literal["auto", "transformers", "ablate"] = "auto",  # noqa: A002 - the CLI's word
    *,
    tokenizer: str | Path | None = None,
    metrics: Mapping[str, float] | None = None,
    source: str | None = None,
    repo: str | None = None,
    labels: Sequence[str] | None = None,
) -> str:
    """Write ``model`` to a new folder ``out_dir``; return the format written.

    ``transformers``: ``save_pretrained`` (config.json + model.safetensors), loadable with the
    ``*ForPreTraining`` class and the ``Auto*`` classes; ``ablate``: ``model.safetensors`` of our
    state dict. Both add ``ablate.yaml`` (the resolved config), ``README.md`` (a model card with
    the parameter and FLOP counts and ``metrics``, the run's final values) and, given the run's
    ``tokenizer`` (its JSON file), that tokenizer as a transformers tokenizer (``save_pretrained``:
    ``tokenizer.json`` + ``tokenizer_config.json``). ``auto`` picks transformers when expressible.
    ``source`` (``runs:/RUN_ID``) and ``repo`` (the Hub repository it is meant for) go in the card.
    A fine-tuned :class:`Classifier` (``cfg``: its fine-tuning run's config, whose ``model`` is its
    encoder's) becomes a ``*ForSequenceClassification`` (``id2label``: ``labels``, else
    ``finetune.label_names``, else ``LABEL_i``; ``problem_type`` by ``finetune.kind``; its tokenizer's
    ``model_max_length`` ``finetune.max_length``) or our state dict, without FastBERT's exits either
    way; its card names the task and dev metric and shows the pipeline that scores as ablate did.
    Written to a temporary sibling and renamed, so a failure leaves nothing behind.
    """
    out, classifier = Path(out_dir), isinstance(model, Classifier)
    labels = _checked(model, cfg, out, format, labels)
    why_not = None
    try:
        name = family(cfg.model)
    except ConfigError as exc:
        name, why_not = None, str(exc)
    if format == "auto":
        format = "transformers" if name is not None else "ablate"  # noqa: A001
    hf = None  # ConfigError says why not expressible
    if format == "transformers":
        hf = (
            to_transformers_classifier(model, cfg.model, labels, cfg.finetune.kind)
            if isinstance(model, Classifier)
            else to_transformers(model, cfg.model)
        )
    with staged(out) as tmp:
        tokens = _write_tokenizer(tokenizer, tmp, cfg, classifier, required=hf is not None)
        _write_weights(model, hf, tmp)
        (tmp / EXPORT_YAML).write_text(redact(to_yaml(cfg)), encoding="utf-8")
        classes = CLASSIFIER_CLASSES if classifier else CLASSES
        card = model_card(
            model,
            cfg,
            hf_class=classes[name] if hf is not None and name is not None else None,
            why_not=why_not,
            tokens=tokens,
            metrics=metrics,
            source=source,
            repo=repo,
            labels=labels if hf is not None else None,
        )
        (tmp / CARD).write_text(card, encoding="utf-8")
    return format


def _checked(
    model: PretrainingModel | Classifier, cfg: ExperimentConfig, out: Path, format: str, labels: Sequence[str] | None
) -> Sequence[str] | None:
    """Refuse an export that cannot be written (ConfigError naming the key or folder); return a
    classifier's labels (``--labels``, else ``finetune.label_names``, else None: ``LABEL_i``)."""
    if cfg.quant.enabled:  # its model/ artifacts hold the float weights: never hand those out as the model
        where = f"its source {cfg.quant.source}" if cfg.quant.source else "the same run without quant.method"
        raise ConfigError(
            f"quant.method: {cfg.quant.method}: a quantized model has no transformers (or ablate) export, and "
            f"writing its float weights would not be this model; export {where} instead"
        )
    if isinstance(model, Classifier) and cfg.regime != "finetune":
        raise ConfigError(f"regime: {cfg.regime!r}; a classifier is exported with its fine-tuning run's config")
    if labels is not None and not isinstance(model, Classifier):
        raise ConfigError("--labels: only for a fine-tuned classifier (a fine-tuning run's export)")
    if isinstance(model, Classifier):
        labels = export_labels(cfg.finetune, model.num_labels, labels)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: already exists and is not an empty folder")
    if format not in ("auto", "transformers", "ablate"):
        raise ConfigError(f"--format: {format!r} is not one of auto, transformers, ablate")
    return labels


def _write_tokenizer(
    tokenizer: str | Path | None, folder: Path, cfg: ExperimentConfig, classifier: bool, *, required: bool
) -> int | None:
    """The run's tokenizer (its JSON file) saved into ``folder``; its size (None: no tokenizer given).
    Without transformers (not ``required``), an ablate export copies the tokenizer file."""
    if tokenizer is None:
        return None
    length = tokenizer_length(cfg, classifier)  # a classifier's: finetune.max_length
    tokens = save_tokenizer(tokenizer, folder, cfg.data.lowercase, length, required=required)
    if tokens > cfg.model.vocab_size:
        raise ConfigError(
            f"{tokenizer}: {tokens} tokens, more than model.vocab_size={cfg.model.vocab_size} "
            "(not the tokenizer this model was trained with)"
        )
    return tokens


def _write_weights(model: PretrainingModel | Classifier, hf: PreTrainedModel | None, folder: Path) -> None:
    """The weights into ``folder``: ``hf``'s ``save_pretrained`` (a classifier's labels fixed), else
    our state dict as ``model.safetensors`` (a classifier's without its exits)."""
    classifier = isinstance(model, Classifier)
    if hf is not None:
        require("transformers.utils.logging", "hf").disable_progress_bar()  # no "Writing model shards" bar
        hf.save_pretrained(folder)
        if classifier:
            write_labels(folder)
        return
    from safetensors.torch import save_file

    state = without_exits(state_dict(model)) if classifier else state_dict(model)
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
