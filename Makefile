# `make run` and `make test` each work on a fresh machine: they create .venv and
# install the project first when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast test-slow bench bench-smoke data traces results install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,cluster]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/evolve run --generations 500
	$(BIN)/evolve benchmark

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python benchmarks/speed.py

bench-smoke: $(STAMP)
	$(BIN)/python benchmarks/speed.py --smoke

data: $(STAMP)
	$(BIN)/evolve data generate --force

traces: $(STAMP)
	$(BIN)/evolve data trace

results: $(STAMP)
	$(BIN)/python benchmarks/trace_results.py --readme

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
	find . -name __pycache__ -prune -exec rm -rf {} +
