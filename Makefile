# ablate: `make quickstart` (install + the quickstart study + its report), `make test`, `make docs`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch first, so that no other requirement pulls a build you did not choose. The pin installs
# whatever build pip finds for it: PyPI's default (CUDA on Linux x86-64, CPU on macOS/Windows),
# or a local wheel that pip's configuration points at (the CPU wheel on the development machine).
# TORCH takes any pip arguments; on a CPU-only Linux machine take the CPU wheel:
#   make TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH  ?= torch==2.13.0
# CONSTRAINTS: a pip constraints file for the rest (tools/floors.sh: the lowest versions, tools/floors.txt)
CONSTRAINTS ?=

.PHONY: install quickstart lint test test-fast docs serve-docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test]'
	touch $(STAMP)

quickstart: install
	$(VENV)/bin/ablate sweep sweeps/studies/quickstart.yaml
	$(VENV)/bin/ablate report sweeps/studies/quickstart.yaml

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PY=$(PY) tools/typecheck.sh

test: install lint
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

# the quick subset (minutes): ruff, and the suite without the tests marked slow or e2e (tests/markers.py)
test-fast: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -m "not slow and not e2e"

# the documentation site (mkdocs.yml, docs/) into site/; the tools come with the test extras
docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir site

serve-docs: install
	$(VENV)/bin/mkdocs serve

clean:
	rm -rf ablate-runs .pytest_cache
