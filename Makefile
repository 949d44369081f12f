# Two commands for a fresh machine (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DB ?= turnkeeper.duckdb

.PHONY: install demo test lint typecheck reports clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# A normal (non-editable) install, so mypy checks the installed package.
install: $(BIN)/python
	$(BIN)/pip install -q '.[test]'
	$(BIN)/pip install -q --no-deps --force-reinstall .

demo: install
	$(BIN)/turnkeeper demo --db $(DB)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy -p turnkeeper

test: lint typecheck
	$(BIN)/python -m pytest

# Regenerates every file in reports/: the diagrams (deterministic) and the benchmark (measured).
reports: install
	$(BIN)/python reports/generate.py
	$(BIN)/python reports/bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
