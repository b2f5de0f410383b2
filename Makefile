# shmlab: two commands do everything.
#   make lab   - create .venv if needed, install shmlab with its pinned dependencies, open JupyterLab
#                (make lab LANG=zh: the Chinese edition, 中文版)
#   make test  - the same set-up, then lint and the whole test suite (notebooks included)
#   make test-fast - the same set-up, lint, and the core and manager tests (minutes)
# The Python minor versions shmlab is tested on; requirements/ holds one constraints file each.
PYTHONS := 3.10 3.11 3.12 3.13
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.shmlab-installed
# The interpreter: the venv's own once it exists; else PYTHON=... if given; else the newest
# python3 / python3.N on PATH among $(PYTHONS). Its minor version picks the constraints file.
PICKED := $(shell sh requirements/find-python '$(PY)' '$(PYTHON)' $(PYTHONS))
ifeq ($(firstword $(PICKED)),ok)
PYTHON ?= $(word 2,$(PICKED))
CONSTRAINTS := requirements/constraints-py$(word 3,$(PICKED)).txt
else
PYTHON_ERROR := $(or $(wordlist 2,1000,$(PICKED)),requirements/find-python failed)
endif
# Extra pip arguments for the install, e.g. `make setup PIP_ARGS="--find-links ~/wheels"`.
PIP_ARGS ?=
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k reductions -x"`.
PYTEST_ARGS ?=
# pytest-xdist workers. Most tests start processes and wait on them (I/O, sleeps, timeouts), so
# more workers than cores pay: 4 on the 2-core CI machine. WORKERS=0 runs in this process, one
# test at a time. --dist loadgroup keeps each xdist_group on one worker (tests sharing one
# expensive run); --no-loadscope-reorder keeps conftest.py's longest-first order.
WORKERS ?= 4
XDIST   := -n $(WORKERS) $(if $(filter 0,$(WORKERS)),,--dist loadgroup --no-loadscope-reorder)
# The fast set: the mirror of torch's sharing and the manager, everything a change to shmlab's
# core must keep passing, less the tests marked `slow` (no notebooks, labs, browser or Python
# installs; the upstream port under fork only; no fork race). `make test` runs them all.
FAST_TESTS := tests/core tests/manager -m "not slow"
# Extra JupyterLab arguments, e.g. `make lab LAB_ARGS="--port 8899 --no-browser"`.
LAB_ARGS ?=

.PHONY: lab test test-fast test-pythons lint setup bench clean release-labs lock FORCE

setup: $(STAMP)

# Re-installs only when the package metadata or the pins change, so a second `make` is fast.
# With no usable interpreter it stops with one line saying why (found, needed, PYTHON=...).
$(STAMP): pyproject.toml $(CONSTRAINTS) $(if $(PYTHON_ERROR),FORCE)
	$(if $(PYTHON_ERROR),$(error $(PYTHON_ERROR)))
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(PIP_ARGS) -c $(CONSTRAINTS) -e '.[test]'
	@touch $(STAMP)

# As root (a container, say) JupyterLab refuses to start without --allow-root.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)

# The Chinese edition: `make lab LANG=zh` opens notebooks/zh/00_start_here.ipynb, with
# JupyterLab's own interface in Chinese (jupyterlab-language-pack-zh-cn, a dependency); shmlab's
# messages are Chinese in any kernel started in a zh folder. LANG is also the shell's locale
# variable, so only a LANG given on make's command line counts (a Chinese locale alone does not
# switch the edition), only `zh` or `zh_*` means Chinese, and JupyterLab gets a valid locale
# (C.UTF-8) in place of a bare `zh`. The interface language is a user setting: the Chinese sessions keep theirs in
# $(ZH_SETTINGS), so the English sessions' settings stay as they are.
ZH          := $(if $(filter command line,$(origin LANG)),$(filter zh zh_%,$(LANG)))
ZH_SETTINGS := $(VENV)/share/shmlab/lab-settings-zh
START       := notebooks/$(if $(ZH),zh/)00_start_here.ipynb
LAB_ENV     := $(if $(ZH),env LANG=C.UTF-8)
ZH_ARGS     := $(if $(ZH),--LabApp.user_settings_dir=$(ZH_SETTINGS))

$(ZH_SETTINGS)/@jupyterlab/translation-extension/plugin.jupyterlab-settings:
	@mkdir -p $(dir $@)
	@echo '{"locale": "zh_CN"}' > $@

# Rooted at the repository, so labs/ is in the file browser next to notebooks/; opens 00 first.
lab: setup $(if $(ZH),$(ZH_SETTINGS)/@jupyterlab/translation-extension/plugin.jupyterlab-settings)
	$(LAB_ENV) $(VENV)/bin/jupyter lab --ServerApp.root_dir=. \
		--LabApp.default_url=/lab/tree/$(START) $(ZH_ARGS) $(ROOT_ARGS) $(LAB_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: setup lint
	$(PY) -m pytest $(XDIST) $(FAST_TESTS) $(PYTEST_ARGS)

# `make test` installs and smoke-tests on three other Pythons (the oldest and newest supported
# minor found, and /usr/bin/python3: tests/pythons/test_pythons.py); this does it on every one
# found, side by side on the workers (long).
test-pythons: setup
	SHMLAB_PYTHONS=all $(PY) -m pytest $(XDIST) tests/pythons/test_pythons.py $(PYTEST_ARGS)

bench: setup
	$(PY) -m shmlab bench handoff --plot docs/benchmarks.png

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# Re-resolve every constraints file from pyproject.toml (network: PyPI), each as close to the
# reference set as its Python allows: requirements/lock.py says how. `make lock LOCK_ARGS=--upgrade`
# moves to the newest releases up to LOCK_DATE (raise it to take newer ones).
LOCK_REF   := 3.11
LOCK_DATE  ?= 2026-12-01
LOCK_ARGS  ?=
LOCK_VENV  ?= .lock-venv
UV_VERSION := 0.13.9

$(LOCK_VENV)/.installed: Makefile
	$(if $(PYTHON_ERROR),$(error $(PYTHON_ERROR)))
	@test -x $(LOCK_VENV)/bin/python || $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet uv==$(UV_VERSION) packaging==26.4
	@touch $@

lock: $(LOCK_VENV)/.installed
	$(LOCK_VENV)/bin/python requirements/lock.py --uv $(LOCK_VENV)/bin/uv \
	  --reference $(LOCK_REF) --exclude-newer $(LOCK_DATE) $(LOCK_ARGS) $(PYTHONS)
