#!/usr/bin/env bash
# Install ablate with the test extras at the lowest versions tools/floors.txt names, into a venv of its
# own (VENV, default /tmp/ablate-floors), with the Makefile's install (PYTHON and TORCH as there), and run
# the suite there. Extra arguments go to pytest (default: the whole suite as make test runs it).
# CONSTRAINTS= (empty) installs the newest versions instead. Minutes to install, as long as make test's
# suite to run: not part of make test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-/tmp/ablate-floors}
CONSTRAINTS=${CONSTRAINTS-tools/floors.txt}
# -B: install again even where the venv's stamp is newer than pyproject.toml (the constraints may differ)
make -B install VENV="$VENV" CONSTRAINTS="$CONSTRAINTS" ${PYTHON:+PYTHON="$PYTHON"} ${TORCH:+TORCH="$TORCH"}
"$VENV/bin/pip" list 2>/dev/null | grep -iE '^(torch|lightning|mlflow|optuna|optuna-integration|torchmetrics|pandas|matplotlib|datasets) '
if [[ $# -eq 0 ]]; then
    set -- -q -p no:cacheprovider -n 2 --dist loadfile
fi
exec "$VENV/bin/python" -m pytest "$@"
