# Attention Atlas: `make book` builds the book, `make test` runs every check.
# Both create (or update) the project virtual environment .venv from requirements.lock, and
# fetch the book's pinned JavaScript (npm, sha256-checked) into book/_static/vendor/.

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
VENDOR_STAMP := book/_static/vendor/VERSIONS.json
export ATTENTION_ATLAS_DATA ?= $(abspath ../shared/data)
export PYTHONHASHSEED := 0

.PHONY: venv vendor test test-live lint typecheck pytest book book-check lab serve smoke clean

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# MathJax, require.js, the widget HTML manager and thebe, exact versions, sha256-checked (README)
vendor: $(VENDOR_STAMP)

$(VENDOR_STAMP): book/_ext/vendor_js.py | $(STAMP)
	$(BIN)/python book/_ext/vendor_js.py

lint: $(STAMP)
	$(BIN)/ruff check src tests notebooks benchmarks book/_ext examples
	$(BIN)/ruff format --check src tests notebooks benchmarks book/_ext examples

typecheck: $(STAMP)
	$(BIN)/mypy

# unit tests, a smoke run of every chapter, the book built from them, the browser test; as two
# pytest processes at once (tests/parallel.py: the smoke-chapter files, the rest), or one
# process when PYTEST_ARGS selects tests
pytest: $(STAMP) $(VENDOR_STAMP)
	$(BIN)/python tests/parallel.py -m "not live" $(PYTEST_ARGS)

test: lint typecheck pytest

# the live tests (CI runs them after make test): each chapter with a main control run with its
# SMOKE values in JupyterLab and in the live book (make serve), its control moved in Chromium;
# the two live files as two pytest processes at once (tests/parallel.py)
test-live: $(STAMP) $(VENDOR_STAMP)
	$(BIN)/python tests/parallel.py -m live $(PYTEST_ARGS)

# Jupyter Book's execution cache keys on each chapter's own source; a change to the library
# (src/) or to the lock must re-run the chapters too, so it empties the cache, and Sphinx's
# saved environment (without that, Sphinx re-reads only chapters whose own file changed).
CACHE_STAMP := _build/.cache-inputs-stamp
$(CACHE_STAMP): $(shell find src -name '*.py' 2>/dev/null) requirements.lock
	rm -rf _build/.jupyter_cache _build/.doctrees
	mkdir -p _build && touch $@

# every chapter executed with its book parameters (jupyter-cache: unchanged chapters are not
# re-run), then the HTML; any failed cell or Sphinx warning fails the build
book: $(STAMP) $(VENDOR_STAMP) $(CACHE_STAMP)
	ATTENTION_ATLAS_HEADLESS=1 $(BIN)/jupyter-book build . -W --keep-going
	@echo "The book: file://$(abspath _build/html/index.html)"

# the book and browser tests on make book's own output (_build/html)
book-check: $(STAMP)
	ATTENTION_ATLAS_BOOK_HTML=$(abspath _build/html) $(BIN)/python -m pytest -q \
	  tests/test_browser.py tests/test_book.py -k "not builds_without_warnings and not every_chapter"

# smoke-run every chapter (or NAME=00_attention_zoo) into _build/executed/smoke/
smoke: $(STAMP)
	$(BIN)/python -m attention_atlas notebooks run --smoke -j 2 $(NAME)

# JupyterLab on 127.0.0.1 with a token: the .py chapters open as notebooks (jupytext), widgets
# live. make lab NAME=00_attention_zoo opens one chapter; SMOKE=1 runs chapters with their SMOKE
# values; LAB_ARGS="--port 9999" and more (python -m attention_atlas lab --help)
lab: $(STAMP)
	$(BIN)/python -m attention_atlas lab $(NAME) $(if $(SMOKE),--smoke) $(LAB_ARGS)

# the built book (make book) on http://127.0.0.1:8000 and a local Jupyter server (127.0.0.1,
# token, the book's origin allowed): each chapter page's "Go live" button runs it there
serve: $(STAMP)
	$(BIN)/python -m attention_atlas serve $(if $(SMOKE),--smoke) $(SERVE_ARGS)

clean:
	rm -rf $(VENV) _build .jupyter_cache artifacts .pytest_cache .mypy_cache .ruff_cache book/_static/vendor
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
