# gpupool: the two set-up commands are `make run` and `make test`; both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint fmt bench mutate clean help image

help:
	@echo "make run    - create .venv, install, start gpupool on the embedded defaults (simulated cluster, SQLite);"
	@echo "              starts from an empty lease store; make run RUN_FLAGS=--keep-state keeps the last run's leases"
	@echo "make test   - create .venv, install dev dependencies, run the whole test suite"
	@echo "make lint   - ruff, ruff format --check, mypy --strict on src/, import-linter layer contracts"
	@echo "make bench  - run the benchmarks recorded in BENCHMARKS.md"
	@echo "make clean  - remove .venv, tool caches and .gpupool/ (lease store, admin token, sim cache)"
	@echo "make image  - build the container image $(IMAGE) (docker with BuildKit)"
	@echo "make mutate - mutation testing (cosmic-ray) of the core modules; one module: make mutate MODULE=core/ledger.py"

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpupool needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

RUN_FLAGS ?=

run: $(STAMP)
	$(BIN)/gpupool run $(RUN_FLAGS)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: $(STAMP)
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

bench: $(STAMP)
	$(BIN)/gpupool bench allocator --json
	$(BIN)/gpupool bench agent --json

IMAGE ?= gpupool/gpupool:0.1.0
DOCKER ?= docker

image:
	DOCKER_BUILDKIT=1 $(DOCKER) build -t $(IMAGE) .

# Mutation testing (BENCHMARKS.md, section "mutation"); MODULE=core/ledger.py runs one module,
# MUTATE_ARGS="--mode rerun-survivors" runs only the survivors of the last run again.
MODULE ?=
MUTATE_ARGS ?=
mutate: $(STAMP)
	nice -n 19 $(BIN)/python tests/mutation/mutate.py $(if $(MODULE),--module $(MODULE)) $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .gpupool
