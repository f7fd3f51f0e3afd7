# The two commands: `make bench` (or `make lab`) and `make test`. Each bootstraps .venv itself.
# `make dashboard` serves the all-knobs panel as an app for workshops.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: lab bench dashboard test test-cpu-kinds lint overhead gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev,export]'
	touch $(STAMP)

lab: $(STAMP)  ## JupyterLab on notebooks/
	$(VENV)/bin/jupyter lab notebooks/

# Serving a room (docs/dashboard.md): a kernel with no tab connected (Voila 0.5 leaves a closed tab's kernel
# running: voila issue 1458) is shut down after 60 s idle; one kernel waits preheated, the notebook already run, so
# a page is ready at once (fastlab.tools.dashboard_server keeps it from being culled before the page connects); the
# fastlab template (share/jupyter) fetches nothing from the network.
DASHBOARD_ROOM := --template=fastlab --preheat_kernel=True --pool_size=1 --VoilaConfiguration.multi_kernel_manager_class=fastlab.tools.dashboard_server.RoomKernelManager --MappingKernelManager.cull_interval=10 --MappingKernelManager.cull_idle_timeout=60
dashboard: $(STAMP)  ## notebooks/dashboard.ipynb as an app (Voila): code hidden, widgets live; DASHBOARD_ARGS="--port=8867"
	JUPYTER_PATH=$(CURDIR)/share/jupyter $(VENV)/bin/voila $(DASHBOARD_ROOM) $(DASHBOARD_ARGS) notebooks/dashboard.ipynb

bench: $(STAMP)  ## the technique ladder on this machine: results.json, bench.png, bench.md
	$(PY) -m fastlab bench

lint: $(STAMP)
	$(VENV)/bin/ruff check fastlab tests

test: lint  ## ruff, unit tests, the browser test (tests/test_browser.py), nbval over notebooks/ (smoke profile)
	FASTLAB_PROFILE=smoke FASTLAB_SOLUTION=1 MPLBACKEND=Agg $(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env tests notebooks

# The suite as each kind of CPU these machines bring (fastlab/cpu_kind.py: torch's and oneDNN's instruction sets
# capped, fastlab reading that kind's flags), one after another on this machine; CPU_KINDS="avx2" for one kind.
CPU_KINDS ?= avx2 avx512 avx512_bf16 amx
test-cpu-kinds: lint
	@for kind in $(CPU_KINDS); do \
		echo "== make test as FASTLAB_CPU_KIND=$$kind"; \
		FASTLAB_CPU_KIND=$$kind $(MAKE) --no-print-directory test || exit 1; \
	done

overhead: $(STAMP)  ## the harness against a bare hand-written loop
	$(PY) tests/benchmark_overhead.py

# On a CUDA machine: every CUDA-only path checked with assertions, then both ladders (240 s on an H200,
# measured 2026-12-04). Needs torch 2.11+ with the torchvision of the same release, numpy,
# Pillow and nvidia-ml-py (it names what is missing in one line); prints one line and exits 0 without a CUDA GPU.
GPU_PY := $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	@$(GPU_PY) -c "import torch" 2>/dev/null || { echo "fastlab gpu-check: missing torch (2.11 or newer, with the torchvision of the same release) for $(GPU_PY) (exit 1)."; exit 1; }
	@PYTHONPATH=. $(GPU_PY) -m fastlab.tools.gpu_check

clean:
	rm -rf $(VENV) bench-results
