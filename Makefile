# Attention Atlas: `make book` builds the book, `make test` runs every check.
# Both create (or update) the project virtual environment .venv from requirements.lock.

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export ATTENTION_ATLAS_DATA ?= $(abspath ../shared/data)
export PYTHONHASHSEED := 0

.PHONY: venv test lint typecheck book lab clean

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check src tests notebooks benchmarks
	$(BIN)/ruff format --check src tests notebooks benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) _build .jupyter_cache artifacts .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
