# pgqueue — run `make help` for the targets.
PYTHON ?= python3
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV ?= .venv/py$(PYVER)
BIN := $(VENV)/bin
PYTEST_ARGS ?=
PORT ?= 8000
DOCS_PORT ?= 8001
WORKER_PROCESSES ?= 2
WORKER_CONCURRENCY ?= 4

.DEFAULT_GOAL := help
.PHONY: help venv demo test lint format bench docs docs-serve clean

help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-18s %s\n", $$1, $$2}'

$(BIN)/.installed: pyproject.toml
	@test -n "$(PYVER)" || { echo "$(PYTHON) not found: set PYTHON=/path/to/python3.11+"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

venv: $(BIN)/.installed ## Create the virtual environment (.venv/pyX.Y) and install pgqueue with its dev tools

demo: venv ## Start the demo: PostgreSQL (embedded unless DATABASE_URL is set), the API on PORT, a worker, the admin
	$(BIN)/python scripts/demo.py --port $(PORT) --processes $(WORKER_PROCESSES) --concurrency $(WORKER_CONCURRENCY)

test: venv ## Run the whole test suite (starts an embedded PostgreSQL unless DATABASE_URL is set)
	$(BIN)/python scripts/with_db.py -- $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv ## Run every benchmark, one report (own database; embedded PostgreSQL unless DATABASE_URL is set); BENCH_ARGS=--quick for a smoke run
	$(BIN)/python scripts/with_db.py -- $(BIN)/python -m bench.run_all $(BENCH_ARGS)

docs: venv ## Build the documentation site into docs/_build/html (a warning, such as a broken link, fails it)
	$(BIN)/python scripts/gen_reference.py
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "The site is in docs/_build/html/ (index.html)."

docs-serve: docs ## Build the documentation site and serve it on DOCS_PORT (8001)
	$(BIN)/python -m http.server --directory docs/_build/html --bind 127.0.0.1 $(DOCS_PORT)

lint: venv ## ruff check and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv ## Format the code with ruff
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean: ## Remove virtual environments and caches
	rm -rf .venv .pytest_cache .ruff_cache docs/_build
