"""Interop with Hugging Face ``transformers``: convert, export, load, start from a checkpoint.

- :func:`to_transformers` / :func:`from_transformers`: our :class:`PretrainingModel` <->
  ``BertForPreTraining`` / ``AlbertForPreTraining`` / ``MobileBertForPreTraining``, when the
  config is expressible (see :mod:`lightning_modules.interop_maps`). Encoder and sentence head
  are exact for all three; so is the MLM head, for MobileBERT with ``model.mlm_head: mobilebert``
  (HF's H -> H transform, LayerNorm over H, decoder ``[word_embedding (V x E) ; dense (V x (H - E))]``;
  HF -> ours always builds that head).
- A MobileBERT with our ``factorized`` head (H -> E, norm at E, tied V x E decoder) exports
  approximately: our transform fills HF's first E rows (zeros elsewhere, ``dense`` = 0), so only
  the norm statistics differ.
- :func:`export` writes a transformers checkpoint (``save_pretrained``, safetensors) when
  expressible, else ``model.safetensors`` of our state dict; ``ablate.yaml``, the run's tokenizer
  as a transformers tokenizer and a model card (``README.md``, :mod:`lightning_modules.hf_export`)
  either way.
- :func:`load_pretrained` reads either; :func:`initial_model` builds the model a run with
  ``init_from`` starts from (refusing a checkpoint whose tokenizer is not the run's).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import yaml

from ablate.lightning_modules import names
from ablate.lightning_modules.config import ExperimentConfig, ModelConfig, ObjectiveConfig, to_dict, to_yaml
from ablate.lightning_modules.configio import load_config
from ablate.lightning_modules.errors import ConfigError, require
from ablate.lightning_modules.heads import PretrainingModel, build_pretraining_model
from ablate.lightning_modules.hf_export import (
    CARD,
    folder_tokenizer,
    model_card,
    redact,
    same_vocabulary,
    save_tokenizer,
)
from ablate.lightning_modules.interop_maps import CLASSES, Pair, family, hf_config, model_config, pairs

SENTENCE = {"bert": "nsp", "albert": "sop", "mobilebert": "nsp"}  # HF label 0 = in order, as ours
WEIGHTS, EXPORT_YAML = "model.safetensors", "ablate.yaml"
_MLM = "cls.predictions"  # MobileBERT's MLM head, mapped by hand


def _hf_class(name: str) -> Any:
    transformers = require("transformers", "hf")

    return getattr(transformers, CLASSES[name])


@torch.no_grad()
def _copy(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], mapping: list[Pair], to_hf: bool) -> set[str]:
    """Copy every pair from ``src`` into ``dst`` (in place); the names of ``dst`` written."""
    written = set()
    for hf, ours, rows in mapping:
        s, d = (ours, hf) if to_hf else (hf, ours)
        value, target = src[s], dst[d]
        if rows is not None:
            value, target = (value[rows[0] : rows[1]], target) if to_hf else (value, target[rows[0] : rows[1]])
        if value.shape != target.shape:
            raise RuntimeError(f"interop map: {s} {tuple(value.shape)} does not fit {d} {tuple(target.shape)}")
        target.copy_(value)
        written.add(d)
    return written


def _check_covered(kind: str, names: set[str], written: set[str]) -> None:
    if names - written:
        raise RuntimeError(f"interop map misses {kind} parameters: {sorted(names - written)[:6]}")


def state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU, contiguous state dict of our model (``torch.compile`` wrappers removed)."""
    return {k.replace("_orig_mod.", ""): v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def to_transformers(model: PretrainingModel, cfg: ModelConfig) -> Any:
    """The equivalent transformers ``*ForPreTraining`` model, weights copied (ConfigError if not expressible).

    Without our sentence head, HF's pooler and NSP/SOP classifier keep HF's initialisation.
    """
    name = family(cfg)
    hf = _hf_class(name)(hf_config(cfg, name))
    hf.train(model.training)
    ours, theirs = dict(model.named_parameters()), dict(hf.named_parameters())
    ours = {k.replace("_orig_mod.", ""): v for k, v in ours.items()}
    mapping = pairs(name, cfg, model.sentence_head is not None)
    written = _copy(ours, theirs, mapping, to_hf=True)
    read = {p[1] for p in mapping}
    with torch.no_grad():
        if name == "albert" and cfg.embed_dim == cfg.hidden_dim:  # our "no projection" is HF's identity mapping
            mapping_in = hf.albert.encoder.embedding_hidden_mapping_in
            mapping_in.weight.copy_(torch.eye(cfg.hidden_dim))
            mapping_in.bias.zero_()
            written |= {f"albert.encoder.embedding_hidden_mapping_in.{n}" for n in ("weight", "bias")}
        if name == "mobilebert":
            E, head, t = cfg.embed_dim, model.mlm_head, hf.cls.predictions.transform
            exact = cfg.mlm_head == "mobilebert"  # same head: every tensor maps; else ours fills HF's first E rows
            if not exact:
                for param in (
                    t.dense.weight,
                    t.dense.bias,
                    t.LayerNorm.weight,
                    t.LayerNorm.bias,
                    hf.cls.predictions.dense.weight,
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
                hf.cls.predictions.dense.weight.copy_(head.extra.t())  # (H - E, V)
            written |= {n for n in theirs if n.startswith(_MLM)}
            read |= {n for n in ours if n.startswith(names.mlm_head() + ".")}
    untouched = {n for n in theirs if model.sentence_head is not None or not _is_sentence(n)}
    _check_covered("transformers", untouched, written)
    _check_covered("ablate", set(ours), read)
    return hf


def _is_sentence(hf_name: str) -> bool:
    return hf_name.startswith(
        ("bert.pooler", "cls.seq_relationship", "albert.pooler", "sop_classifier", "mobilebert.pooler")
    )


def from_transformers(hf: Any) -> tuple[ModelConfig, PretrainingModel]:
    """Our config and model for a transformers ``Bert|Albert|MobileBert ForPreTraining`` model.

    The sentence head is always built (``nsp`` for BERT and MobileBERT, ``sop`` for ALBERT).
    """
    name, cfg = model_config(hf.config)
    if not isinstance(hf, _hf_class(name)):
        raise ConfigError(f"{type(hf).__name__}: expected a {CLASSES[name]} (load it with that class)")
    theirs = dict(hf.named_parameters())
    if name == "albert" and cfg.embed_dim == cfg.hidden_dim:
        m = hf.albert.encoder.embedding_hidden_mapping_in
        if not (
            torch.equal(m.weight, torch.eye(cfg.hidden_dim, dtype=m.weight.dtype, device=m.weight.device))
            and not m.bias.any()
        ):
            raise ConfigError(
                "embedding_hidden_mapping_in: with embedding_size == hidden_size ours has no "
                "projection, so it must be the identity"
            )
    model = build_pretraining_model(cfg, ObjectiveConfig(sentence=SENTENCE[name]))
    model.train(hf.training)
    ours = dict(model.named_parameters())
    mapping = pairs(name, cfg, True)
    written = _copy(theirs, ours, mapping, to_hf=False)
    if name == "mobilebert":
        head, t = model.mlm_head, hf.cls.predictions.transform  # cfg.mlm_head is "mobilebert": exact
        with torch.no_grad():
            for param, value in (
                (head.transform.weight, t.dense.weight),
                (head.transform.bias, t.dense.bias),
                (head.norm.weight, t.LayerNorm.weight),
                (head.norm.bias, t.LayerNorm.bias),
            ):
                param.copy_(value)
            head.extra.copy_(hf.cls.predictions.dense.weight.t())  # (V, H - E)
        written |= {n for n in ours if n.startswith(names.mlm_head() + ".")}
    _check_covered("ablate", set(ours), written)
    return cfg, model


def expressible(cfg: ModelConfig) -> bool:
    """Whether ``cfg`` has a transformers equivalent."""
    try:
        family(cfg)
    except ConfigError:
        return False
    return True


def export(
    model: PretrainingModel,
    cfg: ExperimentConfig,
    out_dir: str | Path,
    format: Literal["auto", "transformers", "ablate"] = "auto",  # noqa: A002 - the CLI's word
    *,
    tokenizer: str | Path | None = None,
    metrics: Mapping[str, float] | None = None,
    source: str | None = None,
    repo: str | None = None,
) -> str:
    """Write ``model`` to a new folder ``out_dir``; return the format written.

    ``transformers``: ``save_pretrained`` (config.json + model.safetensors), loadable with the
    ``*ForPreTraining`` class and the ``Auto*`` classes; ``ablate``: ``model.safetensors`` of our
    state dict. Both add ``ablate.yaml`` (the resolved config), ``README.md`` (a model card with
    the parameter and FLOP counts and ``metrics``, the run's final values) and, given the run's
    ``tokenizer`` (its JSON file), that tokenizer as a transformers tokenizer (``save_pretrained``:
    ``tokenizer.json`` + ``tokenizer_config.json``). ``auto`` picks transformers when expressible.
    ``source`` (``runs:/RUN_ID``) and ``repo`` (the Hub repository it is meant for) go in the card.
    Written to a temporary sibling and renamed, so a failure leaves nothing behind.
    """
    out = Path(out_dir)
    if cfg.quant.enabled:  # its model/ artifacts hold the float weights: never hand those out as the model
        where = f"its source {cfg.quant.source}" if cfg.quant.source else "the same run without quant.method"
        raise ConfigError(
            f"quant.method: {cfg.quant.method}: a quantized model has no transformers (or ablate) export, and "
            f"writing its float weights would not be this model; export {where} instead"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: already exists and is not an empty folder")
    if format not in ("auto", "transformers", "ablate"):
        raise ConfigError(f"--format: {format!r} is not one of auto, transformers, ablate")
    why_not = None
    try:
        name = family(cfg.model)
    except ConfigError as exc:
        name, why_not = None, str(exc)
    if format == "auto":
        format = "transformers" if name is not None else "ablate"  # noqa: A001
    hf = to_transformers(model, cfg.model) if format == "transformers" else None  # ConfigError says why not
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tokens = None
        if tokenizer is not None:  # without transformers, an ablate export copies the tokenizer file
            tokens = save_tokenizer(tokenizer, tmp, cfg.data.lowercase, cfg.model.max_position, required=hf is not None)
            if tokens > cfg.model.vocab_size:
                raise ConfigError(
                    f"{tokenizer}: {tokens} tokens, more than model.vocab_size={cfg.model.vocab_size} "
                    "(not the tokenizer this model was trained with)"
                )
        if hf is not None:
            require("transformers.utils.logging", "hf").disable_progress_bar()  # no "Writing model shards" bar
            hf.save_pretrained(tmp)
        else:
            from safetensors.torch import save_file

            save_file(state_dict(model), str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / EXPORT_YAML).write_text(redact(to_yaml(cfg)), encoding="utf-8")
        card = model_card(
            model,
            cfg,
            hf_class=CLASSES[name] if hf is not None and name is not None else None,
            why_not=why_not,
            tokens=tokens,
            metrics=metrics,
            source=source,
            repo=repo,
        )
        (tmp / CARD).write_text(card, encoding="utf-8")
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return format


def load_pretrained(path: str | Path) -> tuple[ModelConfig, PretrainingModel]:
    """Our config and model (in eval mode) from a transformers checkpoint folder (``config.json``,
    read locally with the matching ``*ForPreTraining``) or an ablate folder (``model.safetensors``
    + ``ablate.yaml``, or ``config.yaml`` as in a run's ``model/`` artifacts)."""
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such checkpoint folder")
    if (folder / "config.json").is_file():
        try:
            model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{folder / 'config.json'}: unreadable ({exc})") from None
        if model_type not in CLASSES:
            raise ConfigError(
                f"{folder / 'config.json'}: model_type {model_type!r} is not supported ({', '.join(CLASSES)})"
            )
        from safetensors import SafetensorError

        hf_logging = require("transformers.utils.logging", "hf")

        hf_logging.disable_progress_bar()  # no "Loading weights" bar on stderr
        try:
            hf = _hf_class(model_type).from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, RuntimeError, SafetensorError) as exc:  # missing, truncated, mismatched
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"{folder}: cannot load the transformers checkpoint ({first})") from None
        cfg, model = from_transformers(hf)
        return cfg, model.eval()
    yaml_path = next((folder / n for n in (EXPORT_YAML, "config.yaml") if (folder / n).is_file()), None)
    if yaml_path is None or not (folder / WEIGHTS).is_file():
        raise ConfigError(
            f"{folder}: neither a transformers checkpoint (config.json) nor an ablate export "
            f"({WEIGHTS} + {EXPORT_YAML})"
        )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    exp = load_config(yaml_path)
    model = build_pretraining_model(exp.model, exp.objective)
    try:
        model.load_state_dict(load_file(str(folder / WEIGHTS)))
    except (RuntimeError, SafetensorError, OSError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"{folder / WEIGHTS}: does not match {yaml_path.name} ({first})") from None
    return exp.model, model.eval()


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
        value = yaml.safe_dump(b[key], default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
        out.append(f"model.{key}={value}")
    return out


def initial_model(cfg: ExperimentConfig, tokenizer: str | Path | None = None) -> PretrainingModel | None:
    """The model a run starts from: None without ``init_from``, else ``cfg``'s model with the
    checkpoint's weights.

    ``model`` must describe the checkpoint's architecture (``dropout`` and ``init_std`` may
    differ): otherwise ConfigError listing the ``model.key=value`` overrides that match it.
    Given the run's ``tokenizer`` (its JSON file) and a checkpoint with a ``tokenizer.json`` (an
    ``ablate export`` folder has one), both must have the same vocabulary: the embedding rows
    mean the checkpoint's tokens. The sentence head is dropped when ``objective.sentence`` is
    none and freshly initialised when the checkpoint has none.
    """
    if cfg.init_from is None:
        return None
    try:
        have, ckpt = load_pretrained(cfg.init_from)
    except ConfigError as exc:
        raise ConfigError(f"init_from: {exc}") from None
    differences = _arch_differences(cfg.model, have)
    if differences:
        raise ConfigError(
            f"init_from: {cfg.init_from} has a different architecture than model.*; set " + " ".join(differences)
        )
    theirs = folder_tokenizer(cfg.init_from)
    if tokenizer is not None and theirs is not None and not same_vocabulary(theirs, tokenizer):
        raise ConfigError(
            f"init_from: {theirs} is a different tokenizer than this run's (data.corpus, data.lowercase, "
            "data.tokenizer_docs and model.vocab_size must match those the checkpoint was trained with)"
        )
    model = build_pretraining_model(cfg.model, cfg.objective)
    state = state_dict(ckpt)
    if model.sentence_head is None:
        state = {k: v for k, v in state.items() if not k.startswith(names.sentence_head() + ".")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith(names.sentence_head() + ".") for k in missing):
        raise ConfigError(f"init_from: {cfg.init_from}: weights do not fit ({(unexpected or missing)[:3]})")
    return model
