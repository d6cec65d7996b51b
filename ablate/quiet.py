"""The library notes the ``ablate`` command hides, each by an exact filter (:data:`HIDDEN`: a logger and the
message it drops; :data:`WARNINGS`: a warning's category and message), installed at the command's start unless
``--verbose`` (:func:`hide_library_notes`, called by :func:`ablate.process.prepare`); importing ablate installs
nothing. Which notes and why: docs/development.md, "Quiet by default, complete with --verbose"."""

from __future__ import annotations

import logging
import re
import warnings

LIGHTNING = (
    r"^(💡 Tip: For seamless cloud|[GTH]PU available: |`Trainer\(\w+=[\d.]+\)` was configured so "
    r"|\s*Detected KeyboardInterrupt, attempting graceful shutdown|`Trainer.fit` stopped: `max_steps=\d+` reached"
    r"|Restor(ing|ed all) states from the checkpoint (path )?at )"
)
"""Lightning's notes: its cloud tips, the accelerators it found, the batch limits it was given, and its
Ctrl-C line (ablate says which signal stopped a run, and what resumes it)."""
#: Logger name -> the message it stops showing (a regular expression searched in the message).
HIDDEN: dict[str, str] = {
    # on import, per CUDA kernel library a machine without that GPU cannot load; the others serve
    "torchao": r"^Failed to load \S*torchao[/\\]_C\w*\.\S*so\b",
    # on import: torchao registers an enum (a deprecation of torch's, nothing of ablate's)
    "torch.utils._pytree": r"is an Enum subclass and is now natively supported",
    # every Trainer: cloud tips, accelerators, batch limits ablate set, max_steps reached, restoring, Ctrl-C
    "lightning.pytorch.utilities.rank_zero": LIGHTNING,
    "lightning.fabric.utilities.rank_zero": LIGHTNING,
    "lightning_utilities.core.rank_zero": LIGHTNING,  # whichever Lightning set last
    # a CUDA fit's devices: the run logs measure.device
    "lightning.pytorch.accelerators.cuda": r"^LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES: ",
    # a signal: ablate says which signal stopped the run and what resumes it
    "lightning.pytorch.trainer.connectors.signal_connector": r"Received SIGTERM: ",
    # onnxruntime's quantizer, on every export --quantize: ablate checks the quantized model on dev rows
    "root": r"^Please consider (to run )?pre-processing before quantization",
}


class DropMessage(logging.Filter):
    """A logger filter that drops the records whose message matches ``pattern``."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.search(record.getMessage()) is None


WARNINGS: tuple[tuple[type[Warning], str], ...] = (
    # Lightning flattens batches with torch's deprecated LeafSpec: torch's note to Lightning, not to a user
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    # a run's frozen teacher stays in eval mode while the student trains (TrainModule.train)
    (UserWarning, r"Found \d+ module\(s\) in eval mode at the start of training"),
    # a resumed run (a retried trial) finds its own earlier checkpoints in its folder: what it resumes from
    (UserWarning, r"Checkpoint directory .* exists and is not empty\."),
)
"""Library warnings the command hides: (category, the start of the message); every other warning shows."""


def hide_library_notes() -> None:
    """Install the :data:`HIDDEN` filters on their loggers (once: calling again adds none) and the
    :data:`WARNINGS` filters."""
    for category, message in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name, pattern in HIDDEN.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessage) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(DropMessage(pattern))
