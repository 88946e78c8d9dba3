# Quick start:  make lab   (set up .venv, open JupyterLab on notebooks/)   |   make test   (set up if needed, run everything)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch's CPU build, by name: `.ci/cpu_torch.py` takes torch==$(TORCH_VERSION)+cpu from PyTorch's CPU wheel index
# (TORCH_CPU_INDEX), or, where that index is unreachable, torch==$(TORCH_VERSION) from pip's configured index after a
# dry run shows no CUDA package in the plan (tests/runtime/test_packaging.py runs the same check on the whole set-up).
TORCH_VERSION := 2.13.0
export TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
STAMP := $(VENV)/.installed
EXTRAS ?= dev,deepspeed
# optimum-habana's tests run in their own environment layered on $(VENV) (.ci/layered_venv.py): it brings transformers,
# which every Lightning process would otherwise import at start-up (through torchmetrics, ~2 s of CPU each).
OPTIMUM_VENV := .venv-optimum
OPTIMUM_STAMP := $(OPTIMUM_VENV)/.installed
export HPU_NB_OPTIMUM_PYTHON := $(CURDIR)/$(OPTIMUM_VENV)/bin/python
# transformers 5 / accelerate as Gaudi users have them now (no optimum-habana, which pins transformers 4.55): a second
# layer over $(VENV), for tests/third_party/test_transformers_on_hpu.py.
TRANSFORMERS_VENV := .venv-transformers
TRANSFORMERS_STAMP := $(TRANSFORMERS_VENV)/.installed
export HPU_NB_TRANSFORMERS_PYTHON := $(CURDIR)/$(TRANSFORMERS_VENV)/bin/python
# Beyond one machine: mpi4py and Ray Train (the `cluster` extra) in a third layer over $(VENV), which stays free of ray;
# Open MPI, SLURM and munge from the system's packages (.ci/install_cluster.sh). For tests/cluster: `make test-cluster`.
CLUSTER_VENV := .venv-cluster
CLUSTER_STAMP := $(CLUSTER_VENV)/.installed
JUPYTER_PORT ?= 8888
# DeepSpeed's C++ ops are compiled by torch into TORCH_EXTENSIONS_DIR (default: one folder per user, shared by every
# checkout and venv, so each one rebuilds the others' ops). Ours live in the venv: built once by `make setup`, found by
# the tests, by `make lab` and by any kernel of this venv (its kernel spec sets the same variable).
export TORCH_EXTENSIONS_DIR := $(CURDIR)/$(VENV)/torch_extensions

# Asks whether Habana's own habana_frameworks is installed: with hpu_nb installed, `import habana_frameworks` finds the
# emulated Gaudi's everywhere else (hpu_nb-habana.pth), unless HPU_NB_AUTOLOAD=0.
REAL_HABANA := HPU_NB_AUTOLOAD=0

.PHONY: setup notebook-filter optimum-env transformers-env lab test test-fast test-torch-builds test-cluster lint bench browser screenshots clean

setup: $(STAMP)

# On a Gaudi (habana_frameworks importable) the venv sees Habana's torch through --system-site-packages and we
# install nothing over it; elsewhere we install the CPU build of torch first, so nothing pulls a CUDA build.
$(STAMP): pyproject.toml Makefile
	@if $(REAL_HABANA) $(PYTHON) -c "import habana_frameworks" 2>/dev/null; then \
		echo "Gaudi software found: building $(VENV) on top of Habana's torch"; \
		$(PYTHON) -m venv --system-site-packages $(VENV); \
		$(PY) -c "import torch; print(f'torch=={torch.__version__}')" > $(VENV)/constraints.txt; \
	else \
		$(PYTHON) -m venv $(VENV); \
		echo "torch==$(TORCH_VERSION)" > $(VENV)/constraints.txt; \
	fi
	$(PIP) install -q --upgrade pip
	@if ! $(REAL_HABANA) $(PY) -c "import habana_frameworks" 2>/dev/null; then \
		$(PY) .ci/cpu_torch.py $(TORCH_VERSION) -q -c $(VENV)/constraints.txt || exit 1; fi
	@# On a Gaudi, Habana's DeepSpeed fork (e.g. 0.14.4+hpu.synapse.v1.18.0) is outside the deepspeed extra's range:
	@# keep it rather than let pip replace it with upstream DeepSpeed.
	@extras="$(EXTRAS)"; \
	if $(REAL_HABANA) $(PY) -c "import habana_frameworks, deepspeed" 2>/dev/null; then \
		echo "Habana's DeepSpeed $$($(PY) -c 'import deepspeed; print(deepspeed.__version__)') is installed: kept"; \
		extras=$$(echo "$$extras" | tr ',' '\n' | grep -vx deepspeed | paste -sd, -); \
	fi; \
	$(PIP) install -q -c $(VENV)/constraints.txt -e ".[$$extras]"
	@# The emulated Gaudi's hpu device is a small C++ library built for this torch (~20 s, cached in ~/.cache/hpu_nb).
	@if ! $(REAL_HABANA) $(PY) -c "import habana_frameworks" 2>/dev/null; then $(PY) -m hpu_nb.emulator.hpu_device; fi
	@# Kernels started from this venv (JupyterLab, nbmake) find the ops where setup built them.
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (hpu_nb)" \
		--env TORCH_EXTENSIONS_DIR "$(TORCH_EXTENSIONS_DIR)" --env PATH '$(CURDIR)/$(VENV)/bin:$${PATH}' >/dev/null
	@# DeepSpeed probes libaio by linking a test program; without libaio-dev the linker's errors reach notebooks.
	@bash .ci/install_system_libs.sh
	@# DeepSpeed runs through its HPU accelerator (on the emulated Gaudi too); ZeRO-Offload's DeepSpeedCPUAdam is a C++
	@# op DeepSpeed compiles on first use (~1-2 min here). Build it once now, with the environment hpu_nb gives
	@# DeepSpeed, not inside a notebook.
	@if $(PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)"; then \
		echo "building DeepSpeed's CPU Adam op into $(TORCH_EXTENSIONS_DIR) (once, a minute or two)"; \
		$(PY) -m hpu_nb.core.strategies.deepspeed_ops >/dev/null; \
	fi
	@$(MAKE) --no-print-directory notebook-filter
	@touch $(STAMP)

# Outputs never reach git: `git add` runs the tutorials in notebooks/ through nbstripout (.gitattributes names the
# filter; this defines it for this clone), keeping cell ids, so running and saving a tutorial leaves it unchanged for
# git. `git diff` shows notebooks without their outputs too. Outside a git clone, or without nbstripout, nothing.
notebook-filter:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && $(PY) -c "import nbstripout" 2>/dev/null; then \
		git config filter.nbstripout.clean '"$(abspath $(PY))" -m nbstripout --keep-id'; \
		git config filter.nbstripout.smudge cat; \
		git config diff.ipynb.textconv '"$(abspath $(PY))" -m nbstripout --keep-id -t'; \
	fi

# transformers and optimum-habana (the `optimum` extra) over $(VENV), which they leave unchanged.
optimum-env: $(OPTIMUM_STAMP)

$(OPTIMUM_STAMP): $(STAMP)
	@echo "setting up $(OPTIMUM_VENV): the optimum extra over $(VENV), for optimum-habana's tests"
	$(PY) .ci/layered_venv.py $(PY) $(OPTIMUM_VENV) optimum
	@touch $(OPTIMUM_STAMP)

# transformers 5 and accelerate (the `transformers` extra) over $(VENV), which they leave unchanged.
transformers-env: $(TRANSFORMERS_STAMP)

$(TRANSFORMERS_STAMP): $(STAMP)
	@echo "setting up $(TRANSFORMERS_VENV): the transformers extra over $(VENV), for the transformers / accelerate tests"
	$(PY) .ci/layered_venv.py $(PY) $(TRANSFORMERS_VENV) transformers
	@touch $(TRANSFORMERS_STAMP)

# JupyterLab's (and Notebook 7's) settings for this venv, as on Binder (binder/overrides.json): widget state saved with
# the notebook (reopened with no kernel, widgets render from it, no "model not found"), no news pop-up, widget messages
# on the kernel's main shell (JupyterLab took a comm subshell's "idle" for the kernel's, mid-cell).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_OVERRIDES): binder/overrides.json $(STAMP)
	install -D -m 644 $< $@

lab: setup $(LAB_OVERRIDES)
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --ip=127.0.0.1 --port=$(JUPYTER_PORT) --no-browser $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

browser: setup $(LAB_OVERRIDES)
	@bash .ci/install_browser.sh || true

# Two pytest-xdist workers: much of the suite waits (ranks in collectives and timeouts, kernels, a browser): run alone,
# the slow tests used 3.5 min of CPU in 7.6 min. A module's tests stay on one worker, in order, the browser tests share
# one, the longest units start first (tests/work_units.py). TEST_WORKERS=0 runs everything in one process. A notebook
# cell that runs past 200 s fails naming itself, before pytest-timeout's 300 s stops the test with no cell named.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup

test: setup optimum-env transformers-env browser lint
	$(PY) -m pytest tests --nbmake notebooks --nbmake-timeout=200 -q --durations=15 $(XDIST)

lint: setup
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports  # the import contracts in .importlinter (which layer may import which)
	$(PY) -m mypy  # [tool.mypy] in pyproject.toml: strict on hpu_nb/core and hpu_nb/runtime

# The developer's loop: no browser, nothing slow (listed in tests/suite_marks.py: processes
# started, compiles; more than ~5 s each). `make test` runs those too.
test-fast: setup
	$(PY) -m pytest tests -q -m "not browser and not slow" --durations=10 $(XDIST)

# The emulated Gaudi on the torch builds users have, besides the pinned CPU build: a CUDA build (pip's torch==2.14.1,
# from this machine's disk where it lies there) and PyPI's newest torch, each in its own environment cached in
# ~/.cache/hpu_nb/torch-builds, with hpu_nb installed non-editable from this checkout; the fast suite and
# tests/runtime/test_torch_builds.py run in each (.ci/torch_builds.py). `make test-torch-builds TORCH_BUILDS="2.9.1"` for others.
# Python 3.12 (Intel's Ubuntu 24.04 images): PyPI's newest torch again under it, where a python3.12 is on the PATH.
TORCH_BUILDS ?= 2.14.1 latest
# The first python3.12 that runs: on the PATH, else pyenv's (whose shim answers only for its selected versions).
PYTHON312 ?= $(shell for p in $$(which -a python3.12 2>/dev/null) $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3.12; \
	do "$$p" -c "import venv, ensurepip" 2>/dev/null && echo "$$p" && break; done)
test-torch-builds: setup
	$(PY) .ci/torch_builds.py $(TORCH_BUILDS) -- $(XDIST)
	@if [ -n "$(PYTHON312)" ]; then $(PYTHON312) .ci/torch_builds.py latest -- $(XDIST); \
	else echo "test-torch-builds: no python3.12 here: Python 3.12 not checked"; fi

# mpirun (Lightning and Habana's plain-torch pattern), srun under a single-node SLURM the tests start on 127.0.0.1, and
# Ray Train, each training 2 emulated cards (tests/cluster: the README's "Clusters" commands). Not part of `make test`.
$(CLUSTER_STAMP): $(STAMP)
	bash .ci/install_cluster.sh
	@echo "setting up $(CLUSTER_VENV): the cluster extra over $(VENV), for tests/cluster"
	$(PY) .ci/layered_venv.py $(PY) $(CLUSTER_VENV) cluster
	@touch $(CLUSTER_STAMP)

test-cluster: $(CLUSTER_STAMP)
	@bash .ci/install_cluster.sh  # again: a checkout kept on a new machine has the venv but not the packages
	$(CLUSTER_VENV)/bin/python -m pytest tests/cluster -m cluster -q --durations=10

# Refresh docs/screenshots/ from the real-browser tests.
screenshots: setup browser
	HPU_NB_UPDATE_SCREENSHOTS=1 $(PY) -m pytest tests/browser -q

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(OPTIMUM_VENV) $(TRANSFORMERS_VENV) build *.egg-info .pytest_cache
