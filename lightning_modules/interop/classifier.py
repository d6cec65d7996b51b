"""A fine-tuned :class:`~ablate.lightning_modules.model.classifier.Classifier` <-> transformers
``*ForSequenceClassification``: the encoder maps as for pre-training, the head's pooler and classifier
are HF's (FastBERT's exits are never converted). :func:`classifier_for` builds the classifier a saved
state dict fits; :func:`load_classifier` reads an export, a run's ``model/`` artifacts or a
transformers checkpoint (docs/guides/interop.md, "A fine-tuned classifier")."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from torch import nn

from ablate.lightning_modules.config.errors import ConfigError, require
from ablate.lightning_modules.config.experiment import ExperimentConfig
from ablate.lightning_modules.config.finetune import FinetuneConfig
from ablate.lightning_modules.config.jsonio import read_json
from ablate.lightning_modules.config.load import load_config
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.config.task_kinds import Kind
from ablate.lightning_modules.interop.consistency import (
    check_against_ablate,
    check_hf_config,
    check_tokenizer_fits,
    embedding_rows,
)
from ablate.lightning_modules.interop.maps import (
    CLASSIFIER_CLASSES,
    albert_identity_in,
    check_albert_identity_in,
    check_covered,
    classifier_pairs,
    copy_pairs,
    family,
    hf_class,
    hf_config,
    model_config,
)
from ablate.lightning_modules.model.classifier import Classifier, new_head
from ablate.lightning_modules.model.encoder import build_encoder

if TYPE_CHECKING:  # transformers is imported when used (the hf extra)
    from transformers import PretrainedConfig, PreTrainedModel

EXITS = "exits"  # Classifier.exits: FastBERT's exit heads, never exported
WEIGHTS, EXPORT_YAML = "model.safetensors", "ablate.yaml"


# transformers' ``problem_type`` of each kind of task a sequence classifier is exported for
PROBLEM_TYPES: dict[Kind, str] = {"classification": "single_label_classification", "regression": "regression"}


def label_names(num_labels: int, labels: Sequence[str] | None = None) -> list[str]:
    """The class names written as ``id2label``: ``labels``, else ``LABEL_0`` ... (transformers' default)."""
    names = [f"LABEL_{i}" for i in range(num_labels)] if labels is None else [str(n) for n in labels]
    if len(names) != num_labels or len(set(names)) != num_labels:
        raise ConfigError(f"labels: {num_labels} distinct names needed (one per class), got {names}")
    return names


def export_labels(f: FinetuneConfig, num_labels: int, given: Sequence[str] | None = None) -> list[str] | None:
    """The names an exported classifier's ``id2label`` gives its ``num_labels`` outputs: ``given`` (``ablate
    export --labels``), else the run's ``finetune.label_names``, else None (``LABEL_i``). ConfigError naming
    whichever does not give ``num_labels`` different, non-empty names."""
    for field, names in (("--labels", given), ("finetune.label_names", f.label_names)):
        if names is None:
            continue
        if len(names) != num_labels or len(set(names)) != len(names) or not all(names):
            what = "one name" if num_labels == 1 else f"{num_labels} different names, one per class,"
            raise ConfigError(f"{field}: {', '.join(names)}: give {what} in the order of the task's label ids")
        return [str(n) for n in names]
    return None


def without_exits(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` less FastBERT's exit heads."""
    return {k: v for k, v in state.items() if not k.startswith(EXITS + ".")}


def to_transformers_classifier(
    model: Classifier, cfg: ModelConfig, labels: Sequence[str] | None = None, kind: Kind = "classification"
) -> PreTrainedModel:
    """The equivalent transformers ``*ForSequenceClassification`` (by :func:`family`), weights copied.

    ``num_labels`` is the head's, ``id2label``/``label2id`` name the classes (``labels``, else
    ``LABEL_i``); ``problem_type`` is ``kind``'s (a regression model: one output, ``regression``, so
    that transformers' pipeline returns the raw score). ``cfg`` must describe ``model.encoder``
    (ConfigError when not expressible). The exits, if any, are left out.
    """
    if kind not in PROBLEM_TYPES:
        raise ConfigError(f"finetune.kind: {kind}: not a sequence classifier ({', '.join(PROBLEM_TYPES)})")
    if kind == "regression" and model.num_labels != 1:
        raise ConfigError(f"finetune.kind: regression needs one output; the model has {model.num_labels}")
    name = family(cfg)
    names = label_names(model.num_labels, labels)
    p = float(model.head.dropout.p)
    dropout = {"classifier_dropout_prob": p} if name == "albert" else {"classifier_dropout": p}
    labelled = {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}
    config = hf_config(cfg, name, **labelled, problem_type=PROBLEM_TYPES[kind], **dropout)
    hf = hf_class(name, CLASSIFIER_CLASSES)(config)
    hf.train(model.training)
    ours = without_exits({k.replace("_orig_mod.", ""): v for k, v in model.named_parameters()})
    theirs = dict(hf.named_parameters())
    mapping = classifier_pairs(name, cfg)
    written = copy_pairs(ours, theirs, mapping, to_hf=True)
    if name == "albert":
        written |= albert_identity_in(hf, cfg)
    check_covered("transformers", set(theirs), written)
    check_covered("ablate", set(ours), {pair[1] for pair in mapping})
    return hf


def write_labels(folder: Path) -> None:
    """Name every class in a saved classifier's ``config.json``: transformers leaves ``id2label`` and
    ``label2id`` out when they are its defaults for 2 labels (``LABEL_0``, ``LABEL_1``)."""
    path = folder / "config.json"
    config = read_json(path)
    assert isinstance(config, dict)  # read_json(expect=dict)
    if "id2label" not in config:
        num = config.get("num_labels", 2)
        C = num if isinstance(num, int) else 2
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(C)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(C)}
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _dropout(name: str, hf_cfg: PretrainedConfig) -> float:
    """HF's classifier dropout, as its ``*ForSequenceClassification`` reads it."""
    if name == "albert":
        return float(hf_cfg.classifier_dropout_prob)
    p = getattr(hf_cfg, "classifier_dropout", None)
    return float(hf_cfg.hidden_dropout_prob if p is None else p)


def from_transformers_classifier(hf: PreTrainedModel) -> tuple[ModelConfig, Classifier]:
    """Our config and :class:`Classifier` (no exits) for a transformers ``*ForSequenceClassification``.

    A regression model (one output, ``problem_type`` ``regression``) comes back as a one-output
    classifier. ConfigError for an architecture ablate cannot express, another model class or a
    multi-label model.
    """
    name, cfg = model_config(hf.config)
    if not isinstance(hf, hf_class(name, CLASSIFIER_CLASSES)):
        raise ConfigError(
            f"{type(hf).__name__}: expected a {CLASSIFIER_CLASSES[name]} (load it with that class or "
            "AutoModelForSequenceClassification)"
        )
    C, problem = int(cast(int, hf.config.num_labels)), getattr(hf.config, "problem_type", None)
    regression = C == 1 and problem in (None, "regression")  # transformers regresses on one output
    if problem == "multi_label_classification" or (C < 2 and not regression) or (problem == "regression" and C != 1):
        kind = "multi-label classification" if problem == "multi_label_classification" else f"{problem}, {C} outputs"
        raise ConfigError(
            f"problem_type: {kind} is not supported (ablate's classifiers pick one of 2 or more labels, or regress "
            "one score)"
        )
    if name == "albert":
        check_albert_identity_in(hf, cfg)
    model = Classifier(build_encoder(cfg), new_head(cfg.hidden_dim, C, _dropout(name, hf.config), cfg.init_std))
    model.train(hf.training)
    ours = dict(model.named_parameters())
    written = copy_pairs(dict(hf.named_parameters()), ours, classifier_pairs(name, cfg), to_hf=False)
    check_covered("ablate", set(ours), written)
    return cfg, model


def classifier_for(exp: ExperimentConfig, state: Mapping[str, torch.Tensor]) -> Classifier:
    """The :class:`Classifier` a fine-tuning run's config describes (encoder ``exp.model``, head of
    ``exp.finetune.num_labels`` classes), ready to take ``state``.

    It has exits when ``state`` has FastBERT exit heads laid out as classification heads (one per
    layer but the last); exit heads of another layout are left out, with a warning.
    """
    m, C = exp.model, exp.finetune.num_labels
    model = Classifier(build_encoder(m), new_head(m.hidden_dim, C, m.dropout, m.init_std))
    saved = {k: tuple(v.shape) for k, v in state.items() if k.startswith(EXITS + ".")}
    if saved:
        count = 1 + max((int(k.split(".")[1]) for k in saved if k.split(".")[1].isdigit()), default=-1)
        exits = nn.ModuleList(new_head(m.hidden_dim, C, m.dropout, m.init_std) for _ in range(count))
        if {f"{EXITS}.{k}": tuple(v.shape) for k, v in exits.state_dict().items()} == saved:
            model.exits = exits
        else:
            warnings.warn("exits: saved exit heads of an unknown layout are not loaded", stacklevel=2)
    return model


# --- checkpoint folders: a transformers checkpoint (config.json) or an ablate one (model.safetensors + yaml) ------


def checkpoint_folder(path: str | Path) -> Path:
    """``path`` as a folder; ConfigError when there is none."""
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such checkpoint folder")
    return folder


def hf_checkpoint(folder: Path, classes: dict[str, str]) -> tuple[PreTrainedModel, list[str]]:
    """The transformers model of a checkpoint folder (``config.json``), read locally with its class
    in ``classes``, and the names of the weights it lacked (HF initialised them). With
    ``CLASSIFIER_CLASSES``, a checkpoint saved from another class (``architectures``) is refused."""
    path = folder / "config.json"
    config = read_json(path)
    assert isinstance(config, dict)  # read_json(expect=dict)
    model_type = config.get("model_type")
    if model_type not in classes:
        raise ConfigError(f"{path}: model_type {model_type!r} is not supported ({', '.join(classes)})")
    found = config.get("architectures")
    architectures = [str(a) for a in found] if isinstance(found, list) else []
    if classes is CLASSIFIER_CLASSES and not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        saved = f"a {architectures[0]}" if architectures else "not a *ForSequenceClassification"
        raise ConfigError(f"{folder}: {saved} checkpoint, not a sequence classifier")
    check_hf_config(path, config)
    yaml_path = folder / EXPORT_YAML
    if yaml_path.is_file():  # an export: both files describe the model
        check_against_ablate(path, config, yaml_path, load_config(yaml_path).model)
    vocab = config.get("vocab_size")
    if isinstance(vocab, int):
        check_tokenizer_fits(folder, vocab, f"{path.name}'s vocab_size is")
    from safetensors import SafetensorError

    require("transformers.utils.logging", "hf").disable_progress_bar()  # no "Loading weights" bar on stderr
    try:
        loaded: Any = hf_class(model_type, classes).from_pretrained(  # with output_loading_info: (model, info)
            str(folder), local_files_only=True, output_loading_info=True
        )
        hf, info = loaded
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:  # missing, truncated, mismatched
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{folder}: cannot load the transformers checkpoint ({first})") from None
    return hf, sorted(info.get("missing_keys", []))


def ablate_checkpoint(folder: Path) -> tuple[Path, ExperimentConfig]:
    """The config file (``ablate.yaml``, or ``config.yaml`` of a run's ``model/`` artifacts) and config
    of an ablate folder; ConfigError when the folder is neither kind of checkpoint."""
    yaml_path = next((folder / n for n in (EXPORT_YAML, "config.yaml") if (folder / n).is_file()), None)
    if yaml_path is None or not (folder / WEIGHTS).is_file():
        raise ConfigError(
            f"{folder}: neither a transformers checkpoint (config.json) nor an ablate export "
            f"({WEIGHTS} + {EXPORT_YAML})"
        )
    exp = load_config(yaml_path)
    rows = embedding_rows(folder / WEIGHTS)
    if rows is not None and rows[1] != exp.model.vocab_size:
        raise ConfigError(
            f"{yaml_path}: model.vocab_size {exp.model.vocab_size}, but {WEIGHTS}'s {rows[0]} has {rows[1]} rows "
            "(one per token)"
        )
    check_tokenizer_fits(folder, exp.model.vocab_size, f"{yaml_path.name}'s model.vocab_size is")
    return yaml_path, exp


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``folder``'s ``model.safetensors``; ConfigError when unreadable."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(folder / WEIGHTS))
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"{folder / WEIGHTS}: unreadable ({str(exc).strip()[:200]})") from None


M = TypeVar("M", bound=nn.Module)


def built_empty(build: Callable[[], M]) -> M:
    """``build()`` without its random initialisation, for a model whose every weight is loaded next
    (:func:`load_weights` is strict): built on the meta device, then given uninitialised host memory
    (BERT-base: 1.0 s of drawing initial weights saved per load on the 2-core CPU; no random numbers drawn)."""
    with torch.device("meta"):
        model = build()
    return model.to_empty(device="cpu")


def load_weights(
    model: nn.Module, folder: Path, yaml_path: Path, state: Mapping[str, torch.Tensor] | None = None
) -> None:
    """Load ``state`` (else ``folder``'s ``model.safetensors``) into ``model``; ConfigError when it does not fit."""
    state = read_weights(folder) if state is None else state
    if isinstance(model, Classifier) and model.exits is None:
        state = without_exits(state)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"{folder / WEIGHTS}: does not match {yaml_path.name} ({first})") from None


def load_classifier(path: str | Path) -> tuple[ModelConfig, Classifier]:
    """Our config and fine-tuned :class:`Classifier` (in eval mode) from a transformers
    ``*ForSequenceClassification`` checkpoint folder (``config.json``) or an ablate folder of a
    fine-tuning run (``model.safetensors`` + ``ablate.yaml``, or ``config.yaml`` as in the run's
    ``model/`` artifacts; FastBERT exits come back when saved). ConfigError for a pre-trained model."""
    folder = checkpoint_folder(path)
    if (folder / "config.json").is_file():
        hf, missing = hf_checkpoint(folder, CLASSIFIER_CLASSES)
        if missing:
            raise ConfigError(f"{folder}: not a trained sequence classifier (it lacks {', '.join(missing[:3])})")
        try:
            cfg, model = from_transformers_classifier(hf)
        except ConfigError as exc:  # a field ablate cannot express: named with its file
            raise ConfigError(f"{folder / 'config.json'}: {exc}") from None
        return cfg, model.eval()
    yaml_path, exp = ablate_checkpoint(folder)
    if exp.regime != "finetune":
        raise ConfigError(
            f"{folder}: a pre-trained model (regime {exp.regime}), not a fine-tuned classifier (load_pretrained "
            "reads it)"
        )
    state = read_weights(folder)
    classifier = built_empty(lambda: classifier_for(exp, state))
    load_weights(classifier, folder, yaml_path, state)
    return exp.model, classifier.eval()
