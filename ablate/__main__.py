"""``python -m ablate`` runs the ``ablate`` command."""

import sys

from ablate.cli import main

sys.exit(main())
