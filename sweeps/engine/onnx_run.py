"""``ablate export RUN OUT --format onnx``: a fine-tuning run's model as ONNX, checked on the run's own data.

The run's ``model/`` artifacts give the model, its tokenizer artifact the tokenizer and its config's ``finetune``
section the rows the checks read; :func:`~ablate.lightning_modules.interop.onnx_export.export_onnx` writes it."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from ablate.lightning_modules.config.errors import ConfigError
from ablate.lightning_modules.config.quant import WEIGHT_BITS
from ablate.lightning_modules.interop.onnx_check import CALIBRATION_ROWS, require_onnx, task_rows
from ablate.lightning_modules.interop.onnx_export import OnnxExport, export_onnx
from ablate.lightning_modules.interop.onnx_quant import parse, run_form
from ablate.lightning_modules.model.classifier import Classifier
from ablate.lightning_modules.model.span import SpanModel
from ablate.sweeps.engine import tracking
from ablate.sweeps.engine.weights import (
    RUNS,
    finetune_run_params,
    load_quantized,
    load_run_classifier,
    load_run_span,
    run_tokenizer,
    store,
)


def check_onnx_request(format: str, quantize: str | None) -> None:  # noqa: A002 - the CLI's word
    """What ``ablate export`` checks before reading anything: ``--quantize`` only with ``--format onnx`` and one
    ONNX Runtime holds; the onnx extra installed. ConfigError otherwise."""
    if quantize is not None and format != "onnx":
        raise ConfigError(
            f"--quantize {quantize}: the {format} format holds float weights; a quantized export is --format onnx"
        )
    if format == "onnx":
        require_onnx()
        if quantize is not None:
            parse(quantize)


def export_run_onnx(
    uri: str, run_id: str, out_dir: Path, quantize: str | None = None, labels: Sequence[str] | None = None
) -> OnnxExport:
    """Run ``run_id``'s fine-tuned classifier or span model as an ONNX folder ``out_dir`` (see the module).

    Raises:
        ConfigError: the run is not a fine-tuning run, is quantized in a form ONNX Runtime cannot hold (or
            ``quantize`` is not its form), logged no tokenizer, or a check fails.
        DataError: the run's task data cannot be read.
    """
    params = finetune_run_params(
        uri, run_id, "run ", ("--format onnx: ", "ONNX exports a fine-tuned classifier or span model")
    )
    client = store(uri)
    with tracking.quiet_downloads(), tempfile.TemporaryDirectory(prefix="ablate-onnx-") as tmp:
        model: Classifier | SpanModel
        span = params.get("finetune.kind") == "span"
        cfg, model = load_run_span(uri, run_id) if span else load_run_classifier(uri, run_id)
        own = None
        if cfg.quant.enabled:  # written in its own form, checked against the model it scored
            quantize, own = _quantized_form(uri, run_id, cfg.quant.method, quantize)
        tok = run_tokenizer(client, run_id, Path(tmp))
        if tok is None:
            raise ConfigError(f"--format onnx: run {run_id} logged no tokenizer, and the checks read its dev rows")
        static = quantize is not None and parse(quantize) is parse("static-int8")
        rows = task_rows(cfg.finetune, tok, train_rows=CALIBRATION_ROWS if static else 0)
        return export_onnx(
            model,
            cfg,
            Path(out_dir),
            rows,
            quantize=quantize,
            tokenizer=tok,
            labels=labels,
            own=own,
            source=f"{RUNS}{run_id}",
        )


def _quantized_form(uri: str, run_id: str, method: str, asked: str | None) -> tuple[str, tuple[nn.Module, str]]:
    """A quantized run's ``--quantize`` (:func:`~ablate.lightning_modules.interop.onnx_quant.run_form`: the
    one asked must be it) and its own quantized model as it scored it (``model/quantized.safetensors``)."""
    stored = load_quantized(uri, run_id)
    try:
        form = run_form(method, stored.plan if method == "weight-mixed" else {"": WEIGHT_BITS.get(method, 8)})
    except ConfigError:  # widths ONNX Runtime cannot hold as planned: at the one width asked for
        if asked is None or parse(asked).run is not parse("int4").run:
            raise
        form = asked
    if asked is not None and parse(asked) is not parse(form):
        raise ConfigError(
            f"--quantize {asked}: run {run_id} is quantized (quant.method {method}); its ONNX form is "
            f"--quantize {form} (or export its float source with any --quantize)"
        )
    return form, (stored.model, f"the run's own {method} model (model/quantized.safetensors)")
