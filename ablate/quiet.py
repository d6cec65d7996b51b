"""Lines libraries print that a user of the ``ablate`` command reads past, and the filters that drop
them, installed by the command at its start (:func:`hide_library_notes`, called by
:func:`ablate.process.prepare`); importing an ablate module installs nothing. Each filter drops only its
own message; everything else those loggers say still shows.

* torchao, on import, logs ``Failed to load .../torchao/_C_mxfp8...so`` (and ``_C_cutlass_90a``) for
  each CUDA kernel library a machine without that GPU cannot load: nothing is wrong, ablate's
  quantization runs on the kernels that do load.
* torch, when torchao registers an enum, logs that registering an Enum subclass is deprecated.
* Lightning, when a Trainer starts, logs ``💡 Tip: For seamless cloud uploads ...`` (and one for
  cloud logging): advertisements for its hosted services; ablate logs to MLflow.
* Lightning, for every Trainer (a run has one per phase: fine-tuning, exits, QAT ...), logs which
  accelerators exist (``GPU available: ...``, ``TPU available: ...``, ``HPU available: ...``), the
  devices a CUDA fit sees (``LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0]``) and that a limit of one
  batch or the whole set ``was configured so ...``: ablate chose those settings itself, and logs
  where each run trained (``measure.device``); that a fit ``stopped: `max_steps=N` reached`` (the
  status line of the run's next phase follows), that it is restoring a checkpoint (the phase's status
  line names it); and ``Detected KeyboardInterrupt, attempting graceful
  shutdown`` (or ``Received SIGTERM``) when a signal stops a fit: ablate says which signal it was and
  what resumes the run.
"""

from __future__ import annotations

import logging
import re

#: Logger name -> the message it stops showing (a regular expression searched in the message).
LIGHTNING = (
    r"^(💡 Tip: For seamless cloud|[GTH]PU available: |`Trainer\(\w+=[\d.]+\)` was configured so "
    r"|\s*Detected KeyboardInterrupt, attempting graceful shutdown|`Trainer.fit` stopped: `max_steps=\d+` reached"
    r"|Restor(ing|ed all) states from the checkpoint (path )?at )"
)
"""Lightning's notes: its cloud tips, the accelerators it found, the batch limits it was given, and its
Ctrl-C line (ablate says which signal stopped a run, and what resumes it)."""
HIDDEN: dict[str, str] = {
    "torchao": r"^Failed to load \S*torchao[/\\]_C\w*\.\S*so\b",
    "torch.utils._pytree": r"is an Enum subclass and is now natively supported",
    "lightning.pytorch.utilities.rank_zero": LIGHTNING,
    "lightning.fabric.utilities.rank_zero": LIGHTNING,
    "lightning_utilities.core.rank_zero": LIGHTNING,  # whichever Lightning set last
    "lightning.pytorch.accelerators.cuda": r"^LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES: ",
    "lightning.pytorch.trainer.connectors.signal_connector": r"Received SIGTERM: ",
    "root": r"^Please consider (to run )?pre-processing before quantization",  # onnxruntime's, on --quantize
}


class DropMessage(logging.Filter):
    """A logger filter that drops the records whose message matches ``pattern``."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return self.pattern.search(record.getMessage()) is None


def hide_library_notes() -> None:
    """Install the :data:`HIDDEN` filters on their loggers (once: calling again adds none)."""
    for name, pattern in HIDDEN.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessage) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(DropMessage(pattern))
