# Two commands on a fresh machine: `make run` (start the service) and `make test` (the suite).
# Both create the virtual environment first when it is missing or older than pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2

.PHONY: env run test test-gpu bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

env: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m litetopk.service

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS)

clean:
	rm -rf $(VENV) .pytest_cache
