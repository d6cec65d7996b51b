"""What makes an export folder (:func:`ablate.lightning_modules.interop.export.export`) a Hugging Face
model a user can load: the run's tokenizer as a transformers fast tokenizer (:func:`hf_tokenizer`,
:func:`save_tokenizer`), the model card (:func:`model_card`), and the Hub upload (:func:`hub_api`,
:func:`push_to_hub`, ``huggingface_hub`` imported only when asked for). docs/guides/interop.md, "Export"."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.lightning_modules.config.errors import AblateError, ConfigError, StorageError, require
from ablate.lightning_modules.config.experiment import ExperimentConfig, to_yaml
from ablate.lightning_modules.interop.classifier_card import classifier_use, tokenizer_length

if TYPE_CHECKING:  # torch, tokenizers and transformers are imported when used: Hub checks answer without them
    from huggingface_hub import HfApi
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from ablate.lightning_modules.model.classifier import Classifier
    from ablate.lightning_modules.model.heads import PretrainingModel

TOKENIZER_FILE = "tokenizer.json"
CARD = "README.md"
SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
# text whose encoding must be the same through the transformers tokenizer as through the run's
_PROBE = ("Héllo WORLD, naïve Café: 東京 don't re-run it 1,234.5 times [MASK]!", "Second\tsegment  ÀÉÎ [SEP] ok")
# learning rates and counts (the card's own table counts the exported model) are not shown as metrics
_SKIPPED_METRICS = ("lr-", "epoch", "params.", "flops_per_token")
_FAMILY_NAMES = {"bert": "BERT", "albert": "ALBERT", "mobilebert": "MobileBERT"}


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A ``tokenizers`` tokenizer from its JSON file; ConfigError naming the file when unreadable."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - missing, truncated, not a tokenizer
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"{path}: cannot load the tokenizer ({first})") from None


def folder_tokenizer(folder: str | Path) -> Path | None:
    """The ``tokenizer.json`` of a checkpoint folder, or None when it has none."""
    path = Path(folder) / TOKENIZER_FILE
    return path if path.is_file() else None


def same_vocabulary(a: str | Path, b: str | Path) -> bool:
    """Whether two tokenizer files map the same tokens to the same ids."""
    return load_tokenizer(a).get_vocab() == load_tokenizer(b).get_vocab()


def _ids(tok: Tokenizer, text: tuple[str, str]) -> tuple[list[int], list[int]]:
    return tok.encode(text[0]).ids, tok.encode(*text).ids


def hf_tokenizer(tokenizer: str | Path | Tokenizer, lowercase: bool, max_length: int) -> PreTrainedTokenizerFast:
    """The transformers fast tokenizer (a ``PreTrainedTokenizerFast``) of a run's WordPiece tokenizer.

    A ``BertTokenizer`` over the run's vocabulary (BERT's normalizer, pre-tokenizer, ``##``
    pieces and ``[CLS] A [SEP] B [SEP]`` template, as ablate trains them); if it does not encode
    a probe text exactly as the run's tokenizer does, the run's tokenizer itself is wrapped
    instead. ConfigError when the file is unreadable or lacks a special token; AblateError when
    transformers (the ``hf`` extra) is not installed.
    """
    transformers = require("transformers", "hf")
    tok = tokenizer if not isinstance(tokenizer, str | Path) else load_tokenizer(tokenizer)
    where = tokenizer if isinstance(tokenizer, str | Path) else "tokenizer"
    missing = [t for t in SPECIAL_TOKENS.values() if tok.token_to_id(t) is None]
    if missing:
        raise ConfigError(f"{where}: lacks the special tokens {' '.join(missing)}")
    vocab = tok.get_vocab()
    hf: PreTrainedTokenizerFast = transformers.BertTokenizer(
        vocab=vocab, do_lower_case=lowercase, model_max_length=max_length, **SPECIAL_TOKENS
    )
    if _ids(hf.backend_tokenizer, _PROBE) != _ids(tok, _PROBE):  # not BERT's recipe: keep the run's own
        hf = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok,
            model_max_length=max_length,
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],
            **SPECIAL_TOKENS,
        )
    return hf


def save_tokenizer(
    tokenizer: str | Path, folder: str | Path, lowercase: bool, max_length: int, required: bool = True
) -> int:
    """Write :func:`hf_tokenizer` into ``folder`` with ``save_pretrained``; its size in tokens.

    Not ``required`` and transformers not installed: the run's tokenizer file is copied as
    ``tokenizer.json`` instead (what ablate itself reads; ``AutoTokenizer`` needs the hf extra anyway).
    """
    try:
        hf = hf_tokenizer(tokenizer, lowercase, max_length)
    except ConfigError:
        raise
    except AblateError:
        if required:
            raise
        size = load_tokenizer(tokenizer).get_vocab_size()
        shutil.copyfile(tokenizer, Path(folder) / TOKENIZER_FILE)
        return size
    hf.save_pretrained(str(folder))
    return len(hf)


_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+):[^/\s@]+@")


def redact(text: str) -> str:
    """``text`` with the passwords of URLs (``postgresql://user:secret@host``) masked."""
    return _PASSWORD.sub(r"\g<scheme>:***@", text)


def _metric_rows(metrics: Mapping[str, float]) -> list[str]:
    rows = []
    for key in sorted(metrics):
        if key.startswith(_SKIPPED_METRICS):
            continue
        value = metrics[key]
        shown = f"{value:,.0f}" if float(value).is_integer() and abs(value) >= 1000 else f"{value:.4g}"
        rows.append(f"| `{key}` | {shown} |")
    return rows


def model_card(
    model: PretrainingModel | Classifier,
    cfg: ExperimentConfig,
    *,
    hf_class: str | None,
    why_not: str | None = None,
    tokens: int | None = None,
    metrics: Mapping[str, float] | None = None,
    source: str | None = None,
    repo: str | None = None,
    labels: Sequence[str] | None = None,
) -> str:
    """The ``README.md`` of an export folder.

    Args:
        model: the exported model (counted with :func:`accounting.param_report`), or a fine-tuned
            :class:`Classifier` (its card names the task, labels and dev metric, and says that
            FastBERT's exits are not exported).
        cfg: its resolved config (shown as YAML, URL passwords masked).
        hf_class: the transformers ``*ForPreTraining`` (``*ForSequenceClassification``) class
            written, or None for an ablate export.
        why_not: why an ablate export has no transformers equivalent.
        tokens: the size of the tokenizer saved beside the weights; None when there is none.
        metrics: the run's final metrics (learning rates, ``epoch`` and the counts left out).
        source: where the weights come from (``runs:/RUN_ID``).
        repo: the name to load it by in the usage example (a Hub repository), else the folder.
        labels: a classifier's class names, as written in its ``id2label`` (None: ``LABEL_i``).
    """
    from ablate.lightning_modules.model.classifier import Classifier

    classifier = isinstance(model, Classifier)
    where = repo or "PATH/TO/THIS/FOLDER"
    family = (
        hf_class.removesuffix("ForSequenceClassification").removesuffix("ForPreTraining").lower() if hf_class else None
    )
    title = repo.rsplit("/", 1)[-1] if repo else cfg.tracking.run_name or cfg.name
    what = f"a transformers `{hf_class}` checkpoint" if hf_class else "an ablate checkpoint (not a transformers model)"
    name = f"{'An' if family == 'albert' else 'A'} {_FAMILY_NAMES.get(family or '', 'BERT-family')}"
    lines = [*_front_matter(cfg, hf_class, family, classifier), f"# {title}", ""]
    if isinstance(model, Classifier):
        lines += classifier_use(model, cfg, name, what, hf_class, metrics or {}, source, where, labels)
    else:
        lines += _pretrained_use(cfg, name, what, hf_class, family, source, where)
    if not hf_class:
        loader = "classifier.load_classifier" if classifier else "pretrained.load_pretrained"
        lines += [
            (f"No transformers class fits this model ({why_not}). " if why_not else "Saved in ablate's own format. ")
            + f"Load it with `ablate.lightning_modules.interop.{loader}(folder)`"
            + ("" if classifier else ", or name the folder as `finetune.source` or `init_from` in an ablate config")
            + (" (`AutoTokenizer.from_pretrained(folder)` loads its tokenizer)." if tokens is not None else "."),
        ]
    lines += ["", "## Tokenizer", "", _tokenizer_line(cfg, tokens, classifier)]
    lines += ["", *_size_section(model, cfg)]
    rows = _metric_rows(metrics or {})
    if rows:
        lines += ["", "## Metrics", "", f"Final values logged by {source or 'the run'}.", ""]
        lines += ["| metric | value |", "|---|---:|", *rows]
    lines += ["", "## Configuration", "", "```yaml", redact(to_yaml(cfg)).rstrip(), "```", ""]
    return "\n".join(lines)


def _front_matter(cfg: ExperimentConfig, hf_class: str | None, family: str | None, classifier: bool) -> list[str]:
    """The card's YAML front matter: its library and pipeline (a transformers export) and its tags."""
    task = ["text-classification", cfg.finetune.task] if classifier else ["masked-lm"]
    tags = ["ablate", *task, *([family] if family else [])]
    pipeline_tag = "text-classification" if classifier else "fill-mask"
    front = ["---", *(["library_name: transformers", f"pipeline_tag: {pipeline_tag}"] if hf_class else [])]
    return [*front, "tags:", *(f"- {t}" for t in tags), "---", ""]


def _pretrained_use(
    cfg: ExperimentConfig,
    name: str,
    what: str,
    hf_class: str | None,
    family: str | None,
    source: str | None,
    where: str,
) -> list[str]:
    """What a pre-trained encoder's card says it is, and how to use it (with transformers, and in ablate)."""
    lines = [
        f"{name} encoder trained with ablate (regime `{cfg.regime}`)"
        + (f" in {source}" if source else "")
        + f", exported as {what}.",
        "",
        "## Use",
        "",
    ]
    if not hf_class:
        return lines
    lines += [
        "```python",
        "from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{where}")',
        f'model = AutoModelForMaskedLM.from_pretrained("{where}")',
        f'fill = pipeline("fill-mask", model="{where}")',
        'print(fill("The capital of France is [MASK]."))',
        "```",
        "",
        f"`{hf_class}` loads the sentence head ({'SOP' if family == 'albert' else 'NSP'}) too; "
        "`AutoModelForSequenceClassification` starts a classifier from the same weights. "
        "In ablate, a local copy of this folder is a `finetune.source` (fine-tuned with this folder's "
        "tokenizer) and an `init_from` (pre-training continues; the run's data settings must give "
        "the same tokenizer).",
    ]
    if family == "mobilebert" and cfg.model.mlm_head != "mobilebert":
        lines += [
            "",
            "Its MLM head is ablate's `factorized` one, approximated in transformers (the encoder is exact).",
        ]
    return lines


def _tokenizer_line(cfg: ExperimentConfig, tokens: int | None, classifier: bool) -> str:
    """The card's line on the tokenizer saved beside the weights (``tokens``: its size; None: none saved)."""
    if tokens is None:
        return "None saved: use the tokenizer the model was trained with."
    origin = (
        f"the tokenizer of its pre-trained model (`{cfg.finetune.source}`)"
        if classifier
        else f"trained on `{cfg.data.corpus}` (first {cfg.data.tokenizer_docs:,} documents)"
    )
    return (
        f"WordPiece, {tokens:,} tokens, {'lowercased' if cfg.data.lowercase else 'cased'}, "
        f"`model_max_length` {tokenizer_length(cfg, classifier)}; {origin}."
    )


def _size_section(model: PretrainingModel | Classifier, cfg: ExperimentConfig) -> list[str]:
    """The card's size section: the architecture and the counts, as ``ablate params`` counts them."""
    m = cfg.model
    return [
        "## Size",
        "",
        "Counted as `ablate params` counts them (backbone = embeddings + encoder; shared layers once).",
        "",
        "| | |",
        "|---|---:|",
        f"| architecture | V={m.vocab_size} E={m.embed_dim} H={m.hidden_dim} L={m.num_layers} A={m.num_heads} "
        f"ffn={m.ffn_dim} F={m.num_ffn} sharing={m.sharing} |",
        *_size_rows(model, cfg),
    ]


def _size_rows(model: PretrainingModel | Classifier, cfg: ExperimentConfig) -> list[str]:
    from ablate.lightning_modules.measure.accounting import count, flops_per_token, param_report
    from ablate.lightning_modules.model.classifier import Classifier

    if isinstance(model, Classifier):
        backbone, embedding, T = count(model.encoder), count(model.encoder.embeddings), cfg.finetune.max_length
        return [
            f"| backbone parameters | {backbone:,} |",
            f"| embedding parameters | {embedding:,} |",
            f"| encoder parameters | {backbone - embedding:,} |",
            f"| head parameters (pooler + classifier) | {count(model.head):,} |",
            f"| forward FLOPs per token (T={T}) | {flops_per_token(model.encoder, T):,} |",
        ]
    report = param_report(model, cfg.model, cfg.data.max_length)
    return [
        f"| backbone parameters | {report.backbone:,} |",
        f"| embedding parameters | {report.embedding:,} |",
        f"| encoder parameters | {report.encoder:,} |",
        f"| head parameters (MLM + sentence) | {report.heads:,} |",
        f"| backbone + pooler (ALBERT paper / HF rule) | {report.paper_count:,} |",
        f"| forward FLOPs per token (T={report.seq_len}) | {report.flops_per_token:,} |",
    ]


def hub_api(repo: str) -> HfApi:
    """A ``huggingface_hub.HfApi`` able to push to ``repo``, checked before anything is exported.

    ConfigError when ``huggingface_hub`` (the ``hf`` extra) is not installed, ``repo`` is not a repository id
    or no token is configured (``HF_TOKEN`` or ``hf auth login``).
    """
    try:
        huggingface_hub = require("huggingface_hub", "hf")
    except AblateError as exc:
        raise ConfigError(f"--push-to-hub: {exc}") from None
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # a lazy, unmarked re-export

    try:
        validate_repo_id(repo)
    except HFValidationError:
        raise ConfigError(f"--push-to-hub: {repo!r} is not a Hub repository id (NAMESPACE/NAME)") from None
    if "/" not in repo:
        raise ConfigError(f"--push-to-hub: {repo!r} needs its namespace (NAMESPACE/NAME)")
    token = huggingface_hub.get_token()
    if not token:
        raise ConfigError("--push-to-hub: no Hugging Face token (set HF_TOKEN or run `hf auth login`)")
    api: HfApi = huggingface_hub.HfApi(token=token)
    return api


def push_to_hub(api: HfApi, folder: str | Path, repo: str, private: bool = False) -> str:
    """Create ``repo`` (if new) and upload ``folder`` to it; the repository's URL.

    StorageError (one line) when the Hub refuses or cannot be reached; the folder stays.
    """
    try:
        api.create_repo(repo_id=repo, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(
            folder_path=str(folder), repo_id=repo, repo_type="model", commit_message="Upload ablate export"
        )
    except Exception as exc:  # noqa: BLE001 - HTTP, auth, connection errors of every kind
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise StorageError(f"--push-to-hub {repo}: upload failed ({first}); the export is in {folder}") from None
    return f"https://huggingface.co/{repo}"


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` to write an export into; renamed to ``out`` (an empty folder
    or none) once the block ends, removed if it raises: nothing half-written is left at ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
