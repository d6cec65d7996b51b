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
"""

from __future__ import annotations

import logging
import re

#: Logger name -> the message it stops showing (a regular expression searched in the message).
HIDDEN: dict[str, str] = {
    "torchao": r"^Failed to load \S*torchao[/\\]_C\w*\.\S*so\b",
    "torch.utils._pytree": r"is an Enum subclass and is now natively supported",
    "lightning.pytorch.utilities.rank_zero": r"^💡 Tip: For seamless cloud",
    "lightning.fabric.utilities.rank_zero": r"^💡 Tip: For seamless cloud",
    "lightning_utilities.core.rank_zero": r"^💡 Tip: For seamless cloud",  # whichever Lightning set last
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
