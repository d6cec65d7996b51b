# ablate: `make quickstart` (install + the quickstart study + its report), `make test`, `make docs`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch first, pinned to the CPU wheel, so no other requirement pulls a CUDA build
TORCH  ?= torch==2.13.0

.PHONY: install quickstart lint test docs serve-docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

quickstart: install
	$(VENV)/bin/ablate sweep sweeps/studies/quickstart.yaml
	$(VENV)/bin/ablate report sweeps/studies/quickstart.yaml

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PY=$(PY) tools/typecheck.sh

test: install lint
	$(PY) -m pytest -q -p no:cacheprovider

# the documentation site (mkdocs.yml, docs/) into site/; the tools come with the test extras
docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir site

serve-docs: install
	$(VENV)/bin/mkdocs serve

clean:
	rm -rf ablate-runs .pytest_cache
