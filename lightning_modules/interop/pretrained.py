"""Interop with Hugging Face ``transformers``: :func:`to_transformers` / :func:`from_transformers`
convert a :class:`PretrainingModel` to and from ``*ForPreTraining`` when the config is expressible
(:mod:`ablate.lightning_modules.interop.maps`); :func:`load_pretrained` reads a transformers or an
ablate checkpoint folder, :func:`initial_model` builds what a run with ``init_from`` starts from
(docs/guides/interop.md, "Conversion" and "Starting from a checkpoint")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from ablate.lightning_modules.config.errors import ConfigError, require
from ablate.lightning_modules.config.experiment import ExperimentConfig, ObjectiveConfig, to_dict
from ablate.lightning_modules.config.jsonio import read_json
from ablate.lightning_modules.config.load import load_config, read_yaml
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.config.yamlio import dump_yaml
from ablate.lightning_modules.interop.classifier import (
    EXPORT_YAML,
    ablate_checkpoint,
    built_empty,
    checkpoint_folder,
    hf_checkpoint,
    load_weights,
)
from ablate.lightning_modules.interop.consistency import check_against_ablate, check_hf_config
from ablate.lightning_modules.interop.hub import (
    folder_tokenizer,
    same_vocabulary,
)
from ablate.lightning_modules.interop.maps import (
    CLASSES,
    albert_identity_in,
    check_albert_identity_in,
    check_covered,
    copy_pairs,
    family,
    hf_class,
    hf_config,
    model_config,
    pairs,
)
from ablate.lightning_modules.model import names
from ablate.lightning_modules.model.heads import PretrainingModel, build_pretraining_model

if TYPE_CHECKING:  # transformers is imported when used (the hf extra)
    from transformers import PreTrainedModel

# the sentence task of each family; HF label 0 = in order, as ours
SENTENCE: dict[str, Literal["sop", "nsp"]] = {"bert": "nsp", "albert": "sop", "mobilebert": "nsp"}
_MLM = "cls.predictions"  # MobileBERT's MLM head, mapped by hand


def state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU, contiguous state dict of our model (``torch.compile`` wrappers removed)."""
    return {k.replace("_orig_mod.", ""): v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def to_transformers(model: PretrainingModel, cfg: ModelConfig) -> PreTrainedModel:
    """The equivalent transformers ``*ForPreTraining`` model, weights copied (ConfigError if not expressible).

    Without our sentence head, HF's pooler and NSP/SOP classifier keep HF's initialisation.
    """
    name = family(cfg)
    hf = hf_class(name)(hf_config(cfg, name))
    hf.train(model.training)
    ours, theirs = dict(model.named_parameters()), dict(hf.named_parameters())
    ours = {k.replace("_orig_mod.", ""): v for k, v in ours.items()}
    mapping = pairs(name, cfg, model.sentence_head is not None)
    written = copy_pairs(ours, theirs, mapping, to_hf=True)
    read = {p[1] for p in mapping}
    with torch.no_grad():
        if name == "albert":  # our "no projection" (E == H) is HF's identity mapping
            written |= albert_identity_in(hf, cfg)
        if name == "mobilebert":
            tree: Any = hf  # transformers' submodules, by their attribute names
            E, head, t = cfg.embed_dim, model.mlm_head, tree.cls.predictions.transform
            exact = cfg.mlm_head == "mobilebert"  # same head: every tensor maps; else ours fills HF's first E rows
            if not exact:
                for param in (
                    t.dense.weight,
                    t.dense.bias,
                    t.LayerNorm.weight,
                    t.LayerNorm.bias,
                    tree.cls.predictions.dense.weight,
                ):
                    param.zero_()
            rows = slice(None) if exact else slice(0, E)
            for param, value in (
                (t.dense.weight, head.transform.weight),
                (t.dense.bias, head.transform.bias),
                (t.LayerNorm.weight, head.norm.weight),
                (t.LayerNorm.bias, head.norm.bias),
            ):
                param[rows].copy_(value)
            if exact:
                assert head.extra is not None, "model.mlm_head: mobilebert has the extra decoder columns"
                tree.cls.predictions.dense.weight.copy_(head.extra.t())  # (H - E, V)
            written |= {n for n in theirs if n.startswith(_MLM)}
            read |= {n for n in ours if n.startswith(names.mlm_head() + ".")}
    untouched = {n for n in theirs if model.sentence_head is not None or not _is_sentence(n)}
    check_covered("transformers", untouched, written)
    check_covered("ablate", set(ours), read)
    return hf


def _is_sentence(hf_name: str) -> bool:
    return hf_name.startswith(
        ("bert.pooler", "cls.seq_relationship", "albert.pooler", "sop_classifier", "mobilebert.pooler")
    )


def from_transformers(hf: PreTrainedModel) -> tuple[ModelConfig, PretrainingModel]:
    """Our config and model for a transformers ``Bert|Albert|MobileBert ForPreTraining`` model.

    The sentence head is always built (``nsp`` for BERT and MobileBERT, ``sop`` for ALBERT).
    """
    name, cfg = model_config(hf.config)
    if not isinstance(hf, hf_class(name)):
        raise ConfigError(f"{type(hf).__name__}: expected a {CLASSES[name]} (load it with that class)")
    theirs = dict(hf.named_parameters())
    if name == "albert":
        check_albert_identity_in(hf, cfg)
    model = build_pretraining_model(cfg, ObjectiveConfig(sentence=SENTENCE[name]))
    model.train(hf.training)
    ours = dict(model.named_parameters())
    mapping = pairs(name, cfg, True)
    written = copy_pairs(theirs, ours, mapping, to_hf=False)
    if name == "mobilebert":
        tree: Any = hf  # transformers' submodules, by their attribute names
        head, t = model.mlm_head, tree.cls.predictions.transform  # cfg.mlm_head is "mobilebert": exact
        assert isinstance(head.norm, torch.nn.LayerNorm), "model.mlm_head: mobilebert norms with a LayerNorm"
        assert head.extra is not None, "model.mlm_head: mobilebert has the extra decoder columns"
        with torch.no_grad():
            for param, value in (
                (head.transform.weight, t.dense.weight),
                (head.transform.bias, t.dense.bias),
                (head.norm.weight, t.LayerNorm.weight),
                (head.norm.bias, t.LayerNorm.bias),
            ):
                param.copy_(value)
            head.extra.copy_(tree.cls.predictions.dense.weight.t())  # (V, H - E)
        written |= {n for n in ours if n.startswith(names.mlm_head() + ".")}
    check_covered("ablate", set(ours), written)
    return cfg, model


def expressible(cfg: ModelConfig) -> bool:
    """Whether ``cfg`` has a transformers equivalent."""
    try:
        family(cfg)
    except ConfigError:
        return False
    return True


def _saved_regime(folder: Path) -> object:
    """The ``regime`` an ablate folder's config names (None when it has none); ConfigError naming the file
    when it does not parse (never skipped: it says what the weights beside it are)."""
    for name in (EXPORT_YAML, "config.yaml"):
        if (folder / name).is_file():
            return read_yaml(folder / name, what="an ablate config").get("regime")
    return None


def folder_model(path: str | Path) -> ModelConfig:
    """The architecture of a checkpoint folder, read from its config files alone (no weights loaded; the
    files checked against each other as :func:`load_pretrained` checks them): ``config.json`` (a
    transformers checkpoint), else ``ablate.yaml`` / ``config.yaml``. ConfigError naming the file."""
    folder = checkpoint_folder(path)
    path = folder / "config.json"
    if not path.is_file():
        return ablate_checkpoint(folder)[1].model
    config = read_json(path)
    assert isinstance(config, dict)  # read_json(expect=dict)
    check_hf_config(path, config)
    if (folder / EXPORT_YAML).is_file():  # an export: both files describe the model
        check_against_ablate(path, config, folder / EXPORT_YAML, load_config(folder / EXPORT_YAML).model)
    transformers = require("transformers", "hf")
    try:
        hf_cfg = transformers.AutoConfig.for_model(**config)
        model = model_config(hf_cfg)[1]
    except (ConfigError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{path}: {(str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]}") from None
    return model


def load_pretrained(path: str | Path) -> tuple[ModelConfig, PretrainingModel]:
    """Our config and model (in eval mode) from a transformers checkpoint folder (``config.json``,
    read locally with the matching ``*ForPreTraining``) or an ablate folder (``model.safetensors``
    + ``ablate.yaml``, or ``config.yaml`` as in a run's ``model/`` artifacts); ConfigError for an
    ablate folder of a fine-tuned classifier (:func:`load_classifier` reads those)."""
    folder = checkpoint_folder(path)
    if _saved_regime(folder) == "finetune":
        raise ConfigError(f"{folder}: a fine-tuned classifier, not a pre-trained model (load_classifier reads it)")
    if (folder / "config.json").is_file():
        hf = hf_checkpoint(folder, CLASSES)[0]
        try:
            cfg, model = from_transformers(hf)
        except ConfigError as exc:  # a field ablate cannot express: named with its file
            raise ConfigError(f"{folder / 'config.json'}: {exc}") from None
        return cfg, model.eval()
    yaml_path, exp = ablate_checkpoint(folder)
    model = built_empty(lambda: build_pretraining_model(exp.model, exp.objective))
    load_weights(model, folder, yaml_path)
    return exp.model, model.eval()


def different_tokenizer(field: str, theirs: str | Path) -> str:
    """The error of a run whose tokenizer is not that of the checkpoint ``field`` starts it from."""
    return (
        f"{field}: {theirs} is a different tokenizer than this run's (set data.tokenizer to the checkpoint's, "
        "or data.corpus, data.lowercase, data.tokenizer_docs and model.vocab_size to those it was trained with)"
    )


# fields that may differ between a run's config and its init_from checkpoint
_FREE = {"dropout", "init_std"}


def _arch_differences(want: ModelConfig, have: ModelConfig) -> list[str]:
    """``model.key=value`` (the checkpoint's value) for every architecture field that differs."""
    a, b = to_dict(want), to_dict(have)
    out = []
    for key in a:
        if key in _FREE or a[key] == b[key] or (key == "norm_eps" and want.norm == have.norm == "no_norm"):
            continue
        if key == "layers" and want.layer_specs() == have.layer_specs():
            continue
        value = dump_yaml(b[key], default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
        out.append(f"model.{key}={value}")
    return out


def check_architecture(cfg: ExperimentConfig, have: ModelConfig) -> None:
    """``cfg.model`` describes ``have``, the architecture of its ``init_from`` checkpoint (``dropout`` and
    ``init_std`` may differ): else ConfigError listing the ``model.key=value`` overrides that match it."""
    differences = _arch_differences(cfg.model, have)
    if differences:
        raise ConfigError(
            f"init_from: {cfg.init_from} has a different architecture than model.*; set " + " ".join(differences)
        )


def initial_model(
    cfg: ExperimentConfig, tokenizer: str | Path | None = None, folder: str | Path | None = None
) -> PretrainingModel | None:
    """The model a run starts from: None without ``init_from``, else ``cfg``'s model with the
    checkpoint's weights, read from ``folder`` (where ``init_from``, a hub name, was resolved to;
    None: ``init_from`` is the folder).

    ``model`` must describe the checkpoint's architecture (``dropout`` and ``init_std`` may
    differ): otherwise ConfigError listing the ``model.key=value`` overrides that match it.
    Given the run's ``tokenizer`` (its JSON file) and a checkpoint with a ``tokenizer.json`` (an
    ``ablate export`` folder has one), both must have the same vocabulary: the embedding rows
    mean the checkpoint's tokens. The sentence head is dropped when ``objective.sentence`` is
    none and freshly initialised when the checkpoint has none.
    """
    if cfg.init_from is None:
        return None
    folder = cfg.init_from if folder is None else folder
    try:
        have, ckpt = load_pretrained(folder)
    except ConfigError as exc:
        raise ConfigError(f"init_from: {exc}") from None
    check_architecture(cfg, have)
    theirs = folder_tokenizer(folder)
    if tokenizer is not None and theirs is not None and not same_vocabulary(theirs, tokenizer):
        raise ConfigError(different_tokenizer("init_from", theirs))
    model = build_pretraining_model(cfg.model, cfg.objective)
    state = state_dict(ckpt)
    if model.sentence_head is None:
        state = {k: v for k, v in state.items() if not k.startswith(names.sentence_head() + ".")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith(names.sentence_head() + ".") for k in missing):
        raise ConfigError(f"init_from: {cfg.init_from}: weights do not fit ({(unexpected or missing)[:3]})")
    return model
