"""Everything the ``ablate`` command changes in its own process, in one place, done once at its
start (:func:`prepare`). Importing an ablate module changes nothing process-wide; a library user
who wants the same calls :func:`prepare` too.
"""

from __future__ import annotations

import logging
import os

from ablate.quiet import hide_library_notes
from ablate.sweeps.engine import forksafe, interrupt, tracking


def prepare(*, signals: bool = True, verbose: bool = False) -> None:
    """Set up this process for ablate's commands:

    * SIGINT and SIGTERM end the working run KILLED, with the signal as its reason, and the command
      with status 128 + the signal's number (:mod:`ablate.sweeps.engine.interrupt`); ``signals`` False
      leaves the process's handlers alone (a test runner's process, which handles Ctrl-C itself);

    * database pools refuse connections another process opened (DDP ranks are forked with the
      worker's pools; SQLAlchemy's recipe, :mod:`ablate.sweeps.engine.forksafe`);
    * MLflow's HTTP retries and timeout short unless the user set them (a dead server fails fast), and
      its background logging batched by the second (a run ends without waiting on its idle poll);
    * INFO lines of database migrations and MLflow's tracking-URI notices hidden;
    * the library notes and warnings a user reads past hidden, each by an exact filter (:mod:`ablate.quiet`:
      torchao's kernel libraries, Lightning's tips and its accelerator lines, torch's deprecation notes to
      Lightning); every other warning shows.

    ``verbose`` (``--verbose``) leaves the last two out: every library line shows.
    """
    if signals:
        interrupt.install()
    forksafe.install()
    for key, value in tracking.MLFLOW_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if verbose:
        return
    for name in tracking.QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    hide_library_notes()
