# The two commands: `make bench` (or `make lab`) and `make test`. Each bootstraps .venv itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: lab bench test lint overhead clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev,export]'
	touch $(STAMP)

lab: $(STAMP)  ## JupyterLab on notebooks/
	$(VENV)/bin/jupyter lab notebooks/

bench: $(STAMP)  ## the technique ladder on this machine: results.json, bench.png, bench.md
	$(PY) -m fastlab bench

lint: $(STAMP)
	$(VENV)/bin/ruff check fastlab tests

test: lint  ## ruff, unit tests, nbval over notebooks/ (smoke profile)
	FASTLAB_PROFILE=smoke MPLBACKEND=Agg $(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env tests notebooks

overhead: $(STAMP)  ## the harness against a bare hand-written loop
	$(PY) tests/benchmark_overhead.py

clean:
	rm -rf $(VENV) bench-results
