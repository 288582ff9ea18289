# Two commands on a fresh machine: `make run` (start the service) and `make test` (the suite).
# Both create the virtual environment first when it is missing or older than pyproject.toml.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2
# pyproject extras `make env` installs (the Docker image: `make env EXTRAS=service[,triton|,flydsl]`).
EXTRAS ?= dev

.PHONY: env run test test-gpu clean toolchain

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

env: $(STAMP)

# FlyDSL's gfx950 compile-only build links with $$ROCM_PATH/llvm/bin/ld.lld: LLVM 19's lld (Debian
# lld-19) behind a ROCM_PATH-shaped folder in the venv; the FlyDSL ISA tests use it.
ROCM_SHIM := $(VENV)/rocm/llvm/bin/ld.lld
toolchain: $(ROCM_SHIM)

$(ROCM_SHIM):
	test -x /usr/lib/llvm-19/bin/ld.lld || (apt-get update -qq && apt-get install -y -qq lld-19)
	mkdir -p $(@D)
	ln -sfn /usr/lib/llvm-19/bin/ld.lld $@

run: $(STAMP)
	$(BIN)/python -m litetopk.service

# Lint and format check of the whole tree first (pyproject [tool.ruff]; `ruff format .` fixes the format),
# then the suite (worksteal: a worker that runs out of tests takes some of the other's, so the slow ones do not
# leave one core idle at the end).
test: $(STAMP) $(ROCM_SHIM)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# The suite on a machine with a CUDA GPU: the same tests run the compiled kernels, and the `gpu`-marked ones
# (skipped elsewhere) run too; workers share the GPU.
GPU_WORKERS ?= 8
test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q -n $(GPU_WORKERS) tests/kernels tests/service/test_gpu.py

clean:
	rm -rf $(VENV) .pytest_cache
