#!/usr/bin/env bash
# Install ablate with the test extras at the lowest versions tools/floors.txt names, into a venv of its
# own (VENV, default /tmp/ablate-floors; TORCH as in the Makefile), and run the suite there. Extra
# arguments go to pytest (default: the whole suite as make test runs it). PYTHON picks the interpreter;
# CONSTRAINTS= (empty) installs the newest versions instead. Minutes to install, about 11 to run on two
# cores: not part of make test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-/tmp/ablate-floors}
TORCH=${TORCH:-torch==2.13.0}
PYTHON=${PYTHON:-python3}
CONSTRAINTS=${CONSTRAINTS-tools/floors.txt}
if [[ ! -x $VENV/bin/python ]]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
# shellcheck disable=SC2086  # TORCH holds pip arguments
"$VENV/bin/pip" install -q $TORCH
"$VENV/bin/pip" install -q ${CONSTRAINTS:+-c "$CONSTRAINTS"} -e '.[test]'
"$VENV/bin/pip" list 2>/dev/null | grep -iE '^(torch|lightning|mlflow|optuna|optuna-integration|torchmetrics|pandas|matplotlib|datasets) '
if [[ $# -eq 0 ]]; then
    set -- -q -p no:cacheprovider -n 2 --dist loadfile
fi
exec "$VENV/bin/python" -m pytest "$@"
