# shmlab: two commands do everything.
#   make lab   - create .venv if needed, install shmlab with its pinned dependencies, open JupyterLab
#   make test  - the same set-up, then lint and the whole test suite (notebooks included)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.shmlab-installed
CONSTRAINTS := requirements/constraints.txt
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k reductions -x"`.
PYTEST_ARGS ?=
# Extra JupyterLab arguments, e.g. `make lab LAB_ARGS="--port 8899 --no-browser"`.
LAB_ARGS ?=

.PHONY: lab test lint setup bench clean release-labs

setup: $(STAMP)

# Re-installs only when the package metadata or the pins change, so a second `make` is fast.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "shmlab needs Python 3.10 or newer; set PYTHON=/path/to/python3.x")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e '.[test]'
	@touch $(STAMP)

# As root (a container, say) JupyterLab refuses to start without --allow-root.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)

# Rooted at the repository, so labs/ is in the file browser next to notebooks/; opens 00 first.
lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. \
		--LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb $(ROOT_ARGS) $(LAB_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) -m shmlab.bench handoff

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
