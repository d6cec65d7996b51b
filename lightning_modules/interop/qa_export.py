"""A span task's :class:`~ablate.lightning_modules.model.span.SpanModel` <-> transformers
``*ForQuestionAnswering``: the encoder maps as for pre-training, the head is ``qa_outputs`` on both
sides (Linear H -> 2: start, end). :func:`export_span` writes an export folder, :func:`load_span_model`
reads an export or a run's ``model/`` artifacts back (docs/guides/squad.md, "Export")."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.lightning_modules.config.errors import ConfigError, require
from ablate.lightning_modules.config.experiment import ExperimentConfig, to_yaml
from ablate.lightning_modules.config.jsonio import read_json
from ablate.lightning_modules.config.model import ModelConfig
from ablate.lightning_modules.interop.classifier import (
    EXPORT_YAML,
    WEIGHTS,
    ablate_checkpoint,
    built_empty,
    checkpoint_folder,
    load_weights,
    read_weights,
)
from ablate.lightning_modules.interop.hub import CARD, redact, save_tokenizer, staged
from ablate.lightning_modules.interop.maps import (
    Pair,
    albert_identity_in,
    check_albert_identity_in,
    check_covered,
    copy_pairs,
    encoder_pairs,
    family,
    hf_class,
    hf_config,
    model_config,
)
from ablate.lightning_modules.interop.pretrained import state_dict
from ablate.lightning_modules.model.encoder import build_encoder
from ablate.lightning_modules.model.span import SpanModel, new_span_head

if TYPE_CHECKING:  # transformers is imported when used (the hf extra)
    from transformers import PreTrainedModel

QA_CLASSES = {
    "bert": "BertForQuestionAnswering",
    "albert": "AlbertForQuestionAnswering",
    "mobilebert": "MobileBertForQuestionAnswering",
}
HEAD = "qa_outputs"


def qa_pairs(name: str, cfg: ModelConfig) -> list[Pair]:
    """Every HF ``*ForQuestionAnswering`` <-> :class:`SpanModel` parameter pair of family ``name``."""
    return [*encoder_pairs(name, cfg), *((f"{HEAD}.{p}", f"{HEAD}.{p}", None) for p in ("weight", "bias"))]


def to_transformers_qa(model: SpanModel, cfg: ModelConfig) -> PreTrainedModel:
    """The equivalent transformers ``*ForQuestionAnswering``, weights copied (ConfigError when ``cfg``
    has no transformers family)."""
    name = family(cfg)
    hf = hf_class(name, QA_CLASSES)(hf_config(cfg, name, num_labels=2))
    hf.train(model.training)
    ours = {k.replace("_orig_mod.", ""): v for k, v in model.named_parameters()}
    theirs = dict(hf.named_parameters())
    mapping = qa_pairs(name, cfg)
    written = copy_pairs(ours, theirs, mapping, to_hf=True)
    if name == "albert":
        written |= albert_identity_in(hf, cfg)
    check_covered("transformers", set(theirs), written)
    check_covered("ablate", set(ours), {pair[1] for pair in mapping})
    return hf


def from_transformers_qa(hf: PreTrainedModel) -> tuple[ModelConfig, SpanModel]:
    """Our config and :class:`SpanModel` for a transformers ``*ForQuestionAnswering``."""
    name, cfg = model_config(hf.config)
    if not isinstance(hf, hf_class(name, QA_CLASSES)):
        raise ConfigError(f"{type(hf).__name__}: expected a {QA_CLASSES[name]}")
    if name == "albert":
        check_albert_identity_in(hf, cfg)
    model = SpanModel(build_encoder(cfg), new_span_head(cfg.hidden_dim, cfg.init_std))
    model.train(hf.training)
    ours = dict(model.named_parameters())
    written = copy_pairs(dict(hf.named_parameters()), ours, qa_pairs(name, cfg), to_hf=False)
    check_covered("ablate", set(ours), written)
    return cfg, model


def load_span_model(path: str | Path) -> tuple[ModelConfig, SpanModel]:
    """Our config and span model (eval mode) from a transformers ``*ForQuestionAnswering`` checkpoint
    folder (``config.json``) or an ablate folder of a span fine-tuning run (``model.safetensors`` +
    ``ablate.yaml`` or a run's ``config.yaml``). ConfigError for anything else."""
    folder = checkpoint_folder(path)
    if (folder / "config.json").is_file():
        config = read_json(folder / "config.json")
        assert isinstance(config, dict)  # read_json's expect
        name, found = config.get("model_type"), config.get("architectures")
        architectures = [str(a) for a in found] if isinstance(found, list) else []
        if name not in QA_CLASSES or not any(a.endswith("ForQuestionAnswering") for a in architectures):
            raise ConfigError(f"{folder}: not a transformers question-answering checkpoint ({', '.join(QA_CLASSES)})")
        require("transformers.utils.logging", "hf").disable_progress_bar()
        hf = hf_class(name, QA_CLASSES).from_pretrained(str(folder), local_files_only=True)
        cfg, model = from_transformers_qa(hf)
        return cfg, model.eval()
    yaml_path, exp = ablate_checkpoint(folder)
    if exp.regime != "finetune" or exp.finetune.kind != "span":
        raise ConfigError(f"{folder}: not a span task's fine-tuned model (finetune.kind span)")
    m = exp.model
    model = built_empty(lambda: SpanModel(build_encoder(m), new_span_head(m.hidden_dim, m.init_std)))
    load_weights(model, folder, yaml_path, read_weights(folder))
    return m, model.eval()


def _card(cfg: ExperimentConfig, hf_name: str | None, metrics: Mapping[str, float], source: str | None) -> str:
    """The export's ``README.md``: the task, its dev scores and how to ask it questions."""
    f = cfg.finetune
    front = ["---", "library_name: transformers", "pipeline_tag: question-answering"] if hf_name else ["---"]
    lines = [*front, "tags:", "- ablate", "- question-answering", f"- {f.task}", "---", "", f"# {cfg.name}", ""]
    what = f"a transformers `{hf_name}`" if hf_name else "an ablate checkpoint (not a transformers model)"
    lines.append(
        f"A span-extraction model fine-tuned with ablate on `{f.task}` (`{f.validation or f.train}`)"
        + (f" in {source}" if source else "")
        + f", exported as {what}. Its encoder was pre-trained as `{f.source}`. "
        + ("Unanswerable questions (SQuAD 2.0) are answered with an empty string." if f.no_answer else "")
    )
    scores = (f"{f.task}/final_{f.metric}", *(f"{f.task}/best_{m}" for m in ("exact", "f1")))
    rows = [f"| `{k}` | {metrics[k]:.4g} |" for k in scores if k in metrics]
    if rows:
        lines += ["", "## Dev scores (official SQuAD EM and F1, as fractions)", "", "| metric | value |", "|---|---:|"]
        lines += rows
    if hf_name:
        lines += [
            "",
            "## Use",
            "",
            "transformers 5 has no question-answering pipeline; the model's start and end logits, read as ablate "
            "reads them (the best span of context tokens, at most `finetune.max_answer_length` long, mapped to "
            "its characters):",
            "",
            "```python",
            "import torch",
            "from transformers import AutoModelForQuestionAnswering, AutoTokenizer",
            "",
            'tokenizer = AutoTokenizer.from_pretrained("PATH/TO/THIS/FOLDER")',
            'model = AutoModelForQuestionAnswering.from_pretrained("PATH/TO/THIS/FOLDER")',
            'question, context = "Who wrote it?", "It was written by Ann."',
            'enc = tokenizer(question, context, truncation="only_second", return_offsets_mapping=True, '
            'return_tensors="pt")',
            'offsets = enc.pop("offset_mapping")[0]',
            "context_tokens = torch.tensor([s == 1 for s in enc.sequence_ids(0)])",
            "with torch.no_grad():",
            "    out = model(**enc)",
            "start = out.start_logits[0].masked_fill(~context_tokens, -1e4)",
            "end = out.end_logits[0].masked_fill(~context_tokens, -1e4)",
            f"spans = torch.ones(len(start), len(start), dtype=torch.bool).triu().tril({f.max_answer_length - 1})",
            "scores = (start[:, None] + end[None, :]).masked_fill(~spans, -1e9)",
            "i, j = divmod(int(scores.argmax()), scores.shape[1])",
            "print(context[offsets[i][0] : offsets[j][1]])",
            "```",
            "",
            f"Contexts longer than the tokenizer's `model_max_length` ({min(f.max_length, cfg.model.max_position)}) "
            f"are read by ablate in windows {f.doc_stride} tokens apart (`finetune.doc_stride`)"
            + (
                "; an unanswerable question (SQuAD 2.0) is one whose [CLS] score (start + end at position 0) "
                "beats the best span by more than the threshold chosen on dev (`<task>/f1_thresh`)."
                if f.no_answer
                else "."
            ),
        ]
    lines += ["", "## Configuration", "", "```yaml", redact(to_yaml(cfg)).rstrip(), "```", ""]
    return "\n".join(lines)


def export_span(
    model: SpanModel,
    cfg: ExperimentConfig,
    out_dir: str | Path,
    format: str = "auto",  # noqa: A002 - the CLI's word
    *,
    tokenizer: str | Path | None = None,
    metrics: Mapping[str, float] | None = None,
    source: str | None = None,
) -> str:
    """Write a span model to a new folder ``out_dir`` (``transformers``: ``*ForQuestionAnswering``;
    ``ablate``: our state dict; ``auto``: transformers when expressible), with ``ablate.yaml``, the
    card and the run's tokenizer (``model_max_length`` ``finetune.max_length``); the format written."""
    if format not in ("auto", "transformers", "ablate"):
        raise ConfigError(f"--format: {format!r} is not one of auto, transformers, ablate")
    if cfg.quant.enabled:
        raise ConfigError(
            f"quant.method: {cfg.quant.method}: a quantized model has no export (its artifacts hold float weights)"
        )
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: already exists and is not an empty folder")
    try:
        name: str | None = family(cfg.model)
    except ConfigError:
        if format == "transformers":
            raise
        name = None
    fmt = "transformers" if format == "auto" and name is not None else ("ablate" if format == "auto" else format)
    hf = to_transformers_qa(model, cfg.model) if fmt == "transformers" else None
    with staged(out) as tmp:
        if tokenizer is not None:
            length = min(cfg.finetune.max_length, cfg.model.max_position)
            save_tokenizer(tokenizer, tmp, cfg.data.lowercase, length, required=hf is not None)
        if hf is not None:
            require("transformers.utils.logging", "hf").disable_progress_bar()
            hf.save_pretrained(tmp)
        else:
            from safetensors.torch import save_file

            save_file(state_dict(model), str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / EXPORT_YAML).write_text(redact(to_yaml(cfg)), encoding="utf-8")
        hf_name = QA_CLASSES[name] if hf is not None and name is not None else None
        (tmp / CARD).write_text(_card(cfg, hf_name, metrics or {}, source), encoding="utf-8")
    return fmt
