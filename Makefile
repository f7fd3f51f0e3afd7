# The two commands: `make bench` (or `make lab`) and `make test`. Each bootstraps .venv itself.
# `make dashboard` serves the all-knobs panel as an app for workshops.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: lab bench dashboard test test-gpu-dry test-cpu-kinds lint overhead gpu-check gpu-wheels gpu-notebooks clean

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

test: lint  ## ruff, unit tests, the browser test (tests/test_browser.py), nbval over notebooks/ (smoke and gpu-dry)
	FASTLAB_PROFILE=smoke FASTLAB_SOLUTION=1 MPLBACKEND=Agg $(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env tests notebooks

# Every notebook under the gpu-dry profile (the gpu profile's ResNet-18, device loader and paths at a quarter of
# smoke's batch, on this CPU), each in a fresh process, whole (also in make test) and with its budget spent (only
# here: tests/test_budget_spent.py says why).
test-gpu-dry: $(STAMP)
	FASTLAB_GPU_DRY_NOTEBOOKS=1 FASTLAB_SOLUTION=1 MPLBACKEND=Agg $(PY) -m pytest -p no:cacheprovider tests/test_gpu_dry.py \
		tests/test_budget_spent.py -k "gpu-dry or gpu_dry"

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
	@PYTHONPATH=. $(GPU_PY) tests/gpu_check.py

# Before lending a GPU machine (Python 3.12, torch 2.11, no Jupyter, no network): the wheels that `make gpu-notebooks`
# installs there, for Python 3.12 on x86-64 Linux, into gpu-wheels/ (ignored). What that machine already has (torch
# and its needs, numpy, onnx, onnxruntime, psutil, matplotlib's needs) is left out: installed beside it, a second copy
# would shadow the one torch was built with.
GPU_WHEELS := gpu-wheels
GPU_PYTHON_VERSION := 3.12  # the lent machine's; 3.11 (with GPU_WHEELS=gpu-wheels-311) for a rehearsal here
GPU_WHEEL_PACKAGES := nbval nbclient ipykernel ipywidgets libcst onnxscript
GPU_HAS := torch numpy onnx onnxruntime protobuf ml_dtypes sympy mpmath psutil packaging typing_extensions \
	python_dateutil six pillow filelock fsspec jinja2 markupsafe networkx setuptools
gpu-wheels:
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(GPU_PY) -m pip download --quiet --dest $(GPU_WHEELS) --only-binary=:all: --python-version $(GPU_PYTHON_VERSION) \
		--implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
		--platform manylinux_2_28_x86_64 $(GPU_WHEEL_PACKAGES)
	@for p in $(GPU_HAS); do rm -f $(GPU_WHEELS)/$$p-*.whl; done
	@echo "fastlab gpu-wheels: $$(ls $(GPU_WHEELS)/*.whl | wc -l) wheels, $$(du -sh $(GPU_WHEELS) | cut -f1) in $(GPU_WHEELS)/"

# On a lent CUDA machine: every notebook's fast version executed (saved with its time under $$OUT as it goes), both
# ladders (2 interleaved repeats), then each registered comparison's reference run, each part capped, all within
# 9 minutes (tests/gpu_notebooks.py). Prints one line and exits 0 without CUDA; GPU_NOTEBOOKS_ARGS="--rehearse
# smoke" runs the same parts on this CPU.
gpu-notebooks:
	@PYTHONPATH=. $(GPU_PY) tests/gpu_notebooks.py $(GPU_NOTEBOOKS_ARGS)

clean:
	rm -rf $(VENV) bench-results
