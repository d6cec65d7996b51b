"""The model card (``README.md``) an ONNX export writes beside ``model.onnx``: what the model is, its
inputs, outputs and labels, the length its texts are cut at, how the export was checked, and a
``## Use`` snippet for the model's kind that runs as written with ``onnxruntime``, ``tokenizers`` and
``numpy`` on :data:`SENTENCES`, :data:`PAIRS` or :data:`QUESTION` over :data:`CONTEXT`
(docs/guides/interop.md, "The ONNX card"). Torch-free, so that a test can ask ablate's own model."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ablate.lightning_modules.config.experiment import ExperimentConfig
    from ablate.lightning_modules.interop.onnx_check import Check

SENTENCES = ("A gripping, moving film.", "A dull, lifeless script that goes nowhere.")
PAIRS = (("A man is playing a guitar.", "A person plays the guitar."), ("A dog runs in the park.", "Stocks fell."))
QUESTION = "Who wrote the novel?"
CONTEXT = "The novel was written by Ann Smith in 1901, and it was published in London two years later."
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the graph's (onnx_check.INPUTS)
PAD = "[PAD]"  # ablate's tokenizers' padding token (datamodules.tokenizer.SPECIAL_TOKENS)


def form(cfg: ExperimentConfig) -> str:
    """The snippet's form of a run: ``span``, ``pair`` (two text fields) or ``single``."""
    f = cfg.finetune
    return "span" if f.kind == "span" else "pair" if len(f.text_fields) == 2 else "single"


def max_length(cfg: ExperimentConfig) -> int:
    """The tokens a text (a pair, a question and its context) is cut at: ``finetune.max_length``, at most the
    position table's."""
    return min(cfg.finetune.max_length, cfg.model.max_position)


_HEAD = [
    "from pathlib import Path",
    "",
    "import numpy as np",
    "import onnxruntime as ort",
    "from tokenizers import Tokenizer",
    "",
    'folder = Path(".")  # this export\'s folder: run from inside it, or put its path here',
    'session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])',
    'tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))',
]
_RUN = [
    "",
    "",
    "def run(encodings):",
    '    """The graph\'s outputs for a batch of encodings (padded to one length)."""',
    "    feed = {",
    '        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),',
    '        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),',
    '        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),',
    "    }",
    "    return session.run(None, feed)",
    "",
    "",
]


def _sequences(pair: bool, regression: bool, labels: Sequence[str] | None, length: int) -> list[str]:
    """A classifier's (or regressor's) snippet body: batch, run, print one line per input."""
    cut = "the longer text first, " if pair else ""
    lines = [
        f"tokenizer.enable_truncation(max_length={length})  # {cut}as fine-tuning cut texts",
        f'tokenizer.enable_padding(pad_id=tokenizer.token_to_id("{PAD}"), pad_token="{PAD}")',
    ]
    if not regression:
        lines.append(f"labels = [{', '.join(map(_text, labels or []))}]  # output i is labels[i]")
    lines += _RUN
    if pair:
        pairs = (f"    ({_text(a)}, {_text(b)})," for a, b in PAIRS)
        lines += ["inputs = [  # sentence pairs: (text, text_pair)", *pairs, "]"]
    else:
        lines += ["inputs = [", *(f"    {_text(t)}," for t in SENTENCES), "]"]
    shown = "*pair" if pair else "text"
    loop = "for pair, " if pair else "for text, "
    if regression:
        lines += [
            "scores = run(tokenizer.encode_batch(inputs))[0][:, 0]  # one output: the predicted value",
            f"{loop}score in zip(inputs, scores):",
            f'    print(f"{{score:.4f}}", {shown}, sep="\\t")',
        ]
    else:
        lines += [
            "logits = run(tokenizer.encode_batch(inputs))[0]",
            "probs = np.exp(logits - logits.max(-1, keepdims=True))",
            "probs /= probs.sum(-1, keepdims=True)",
            f"{loop}p in zip(inputs, probs):",
            f'    print(labels[int(p.argmax())], f"{{p.max():.4f}}", {shown}, sep="\\t")',
        ]
    return lines


def _text(value: str) -> str:
    """A Python string literal in double quotes, as ruff's formatter writes it (the guide's snippets are formatted)."""
    return json.dumps(value, ensure_ascii=False)


def _span(length: int, max_answer: int) -> list[str]:
    """A span model's snippet body: one question over one context, the answer's text printed."""
    return [
        f'tokenizer.enable_truncation(max_length={length}, strategy="only_second")  # the first window of the context',
        *_RUN,
        f"question, context = {_text(QUESTION)}, {_text(CONTEXT)}",
        "enc = tokenizer.encode(question, context)  # [CLS] question [SEP] context [SEP]",
        "start, end = (logits[0] for logits in run([enc]))",
        "in_context = np.array([s == 1 for s in enc.sequence_ids])  # answers are context tokens",
        "start, end = np.where(in_context, start, -np.inf), np.where(in_context, end, -np.inf)",
        "i, j = np.indices((len(start), len(end)))",
        f"allowed = (j >= i) & (j - i < {max_answer})  # finetune.max_answer_length",
        "scores = np.where(allowed, start[:, None] + end[None, :], -np.inf)",
        "first, last = np.unravel_index(int(np.argmax(scores)), scores.shape)",
        "print(context[enc.offsets[first][0] : enc.offsets[last][1]])  # the answer's characters",
    ]


def snippet(cfg: ExperimentConfig, labels: Sequence[str] | None) -> list[str]:
    """The ``## Use`` code block, for the run's kind (``labels``: a classifier's names in order)."""
    f, length = cfg.finetune, max_length(cfg)
    if form(cfg) == "span":
        body = _span(length, f.max_answer_length)
    else:
        body = _sequences(form(cfg) == "pair", f.kind == "regression", labels, length)
    return ["```python", *_HEAD, *body, "```"]


def _io(cfg: ExperimentConfig, outputs: dict[str, list[str | int]], labels: Sequence[str] | None) -> list[str]:
    """The inputs and outputs table and what the outputs mean."""
    f = cfg.finetune
    rows = [
        "| | name | dtype | shape |",
        "|---|---|---|---|",
        *(f"| input | `{n}` | int64 | `(batch, sequence)` |" for n in _INPUTS),
        *(f"| output | `{n}` | float32 | `({', '.join(map(str, s))})` |" for n, s in outputs.items()),
    ]
    if f.kind == "span":
        meaning = (
            "`start_logits` and `end_logits` score each token as the answer's first and last; the answer is the "
            f"best span of context tokens (start <= end, at most {f.max_answer_length} tokens, "
            "`finetune.max_answer_length`)"
            + (", or none where [CLS]'s score (position 0) beats it (SQuAD 2.0)." if f.no_answer else ".")
        )
    elif f.kind == "regression":
        meaning = (
            f"`logits[:, 0]` is a score: the predicted value of the task's `{f.label_field}` column "
            "(trained with MSE: no softmax or sigmoid)."
        )
    else:
        named = ", ".join(f"{i} `{n}`" for i, n in enumerate(labels or []))
        meaning = (
            f"Output `i` of `logits` is label `i` of the task's `{f.label_field}` column: {named} "
            "(softmax: probabilities)."
        )
    segments = (
        "`token_type_ids` are 0 for `[CLS]` a `[SEP]` and 1 for b `[SEP]` (a pair's second text, a span task's "
        "context), as the tokenizer's pair encoding gives them; `attention_mask` is 1 on tokens, 0 on padding."
    )
    return [*rows, "", f"Both axes are dynamic. {meaning} {segments}"]


def _length(cfg: ExperimentConfig) -> str:
    f, length = cfg.finetune, max_length(cfg)
    if f.kind == "span":
        return (
            f"{length} tokens (`finetune.max_length`, `[CLS]` and `[SEP]`s included) hold a question and a window "
            f"of its context. ablate cuts questions at {f.max_query_length} tokens (`finetune.max_query_length`) "
            f"and reads a longer context in windows {f.doc_stride} tokens apart (`finetune.doc_stride`), keeping "
            "the best span of them all; the snippet reads the first window only."
        )
    cut = "a pair's longer text is cut first" if len(f.text_fields) == 2 else "longer texts are cut"
    return (
        f"{length} tokens (`finetune.max_length`, `[CLS]` and `[SEP]`s included): {cut}, as fine-tuning and "
        "ablate's dev scores cut them, and as the snippet's tokenizer does."
    )


def _checked(cfg: ExperimentConfig, parity: Check, quantized: Check | None, quantize: str | None, tol: float) -> str:
    f = cfg.finetune
    p = parity
    text = (
        f"On export, ONNX Runtime (CPU) ran the fp32 graph on the run's first {p.rows} dev rows "
        f"(`{f.validation or f.train}`, tokenized as the run read them) beside ablate's own PyTorch model: the largest "
        f"difference of any output was {p.max_abs_diff:.1e} (the export fails above {tol:g}); {p.metric_name} "
        f"{p.metric_torch:.2f} in PyTorch, {p.metric_onnx:.2f} in ONNX Runtime."
    )
    q = quantized
    if q is not None:
        text += (
            f" This graph is the fp32 one quantized `{quantize}` by `onnxruntime.quantization`: {q.metric_name} "
            f"{q.metric_onnx:.2f} on the same rows against fp32's {q.metric_torch:.2f} (the export fails more than "
            "1 point under)"
            + (f", {q.agreement:.1f}% of its predictions as fp32's" if q.agreement is not None else "")
            + (f", {q.agreement_ablate:.1f}% as {q.ablate_quantized}" if q.agreement_ablate is not None else "")
            + "."
        )
    return text + " The figures are in `onnx.json` (`checks`)."


def onnx_card(
    cfg: ExperimentConfig,
    outputs: dict[str, list[str | int]],
    labels: Sequence[str] | None,
    checks: tuple[Check, Check | None],
    *,
    quantize: str | None = None,
    source: str | None = None,
    tolerance: float,
    exits: bool = False,
) -> str:
    """The export's ``README.md`` (``outputs``: name -> shape, as in ``onnx.json``; ``labels``: a classifier's
    names in order; ``checks``: the parity check and the quantized graph's, if any)."""
    f = cfg.finetune
    what = {
        "span": "span-extraction (question answering) model",
        "pair": "sentence-pair " + ("regressor" if f.kind == "regression" else "classifier"),
        "single": "single-sentence " + ("regressor" if f.kind == "regression" else "classifier"),
    }[form(cfg)]
    graph = f"quantized `{quantize}`" if quantize else "fp32"
    lines = ["---", "library_name: onnx", "tags:", "- ablate", "- onnx", f"- {f.task}", "---", "", f"# {cfg.name}", ""]
    lines.append(
        f"A {what} fine-tuned with ablate on the task `{f.task}` (`finetune.kind`: {f.kind})"
        + (f" in {source}" if source else "")
        + f", exported as an ONNX graph (`model.onnx`, {graph}) for ONNX Runtime. Its encoder was pre-trained as "
        f"`{f.source}`."
        + (" Its FastBERT exits are not exported: every layer runs and the final classifier decides." if exits else "")
    )
    lines += ["", "## Inputs and outputs", "", *_io(cfg, outputs, labels)]
    lines += ["", "## Max length", "", _length(cfg)]
    lines += ["", "## How it was checked", "", _checked(cfg, checks[0], checks[1], quantize, tolerance)]
    lines += [
        "",
        "## Use",
        "",
        "With `pip install onnxruntime tokenizers numpy` (no torch, no transformers), from this folder:",
        "",
        *snippet(cfg, labels),
        "",
        "The folder also holds `onnx.json` (these facts as data) and `ablate.yaml` (the run's config).",
        "",
    ]
    return "\n".join(lines)
