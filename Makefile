# slurm-gpu-eff: the front door. `make demo` and `make test` work on a fresh Debian 12
# machine as root: each installs what it needs (apt packages, the .venv) first.
PY_BASE ?= /usr/bin/python3
VENV    := .venv
PY      := $(VENV)/bin/python
CLUSTER := bash scripts/cluster.sh
# The stand-in libnvidia-ml.so.1 the tests and the demo load below the real pynvml
STANDIN := build/nvml/current/libnvidia-ml.so.1

.PHONY: demo test cluster cluster-down cluster-env deps venv lint unit integration bench docs gpu-check

demo: cluster
	@$(PY) scripts/demo.py

test: venv lint
	$(CLUSTER) up
	GPUEFF_REQUIRE_CLUSTER=1 $(PY) -m pytest -q -p no:cacheprovider tests

cluster: venv
	$(CLUSTER) up

cluster-down:
	$(CLUSTER) down

cluster-env:
	@$(CLUSTER) env

deps:
	@bash scripts/install-deps.sh

venv: deps $(VENV)/.installed $(STANDIN)

# Debian's own Python, not a pyenv shim: the jobs of unprivileged users run it too.
$(VENV)/.installed: pyproject.toml
	$(PY_BASE) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,sim,postgres]'
	touch $@

# Compiled against NVIDIA's nvml.h (PyPI's nvidia-nvml-dev, pinned in the [sim] extra).
$(STANDIN): $(VENV)/.installed $(wildcard slurm_gpu_eff/sim/standin/*)
	bash slurm_gpu_eff/sim/standin/build.sh $(abspath $(PY)) build/nvml

lint: venv
	$(VENV)/bin/ruff check slurm_gpu_eff tests bench scripts
	$(VENV)/bin/mypy
	$(PY) scripts/gen_hints_doc.py --check

# docs/hints.md is generated from the rules themselves, so it cannot drift (lint checks).
docs: venv
	$(PY) scripts/gen_hints_doc.py

unit: venv
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

integration: cluster
	GPUEFF_REQUIRE_CLUSTER=1 $(PY) -m pytest -q -p no:cacheprovider tests/integration

bench: venv
	$(PY) bench/run.py

# On a machine with an NVIDIA GPU and PyTorch, without Slurm or a network: the real sampler
# on GPU 0 against nvidia-smi, the workload's own CUDA events and the driver's counters.
# Uses that machine's python3 (torch, nvidia-ml-py); nothing is installed.
gpu-check:
	PYTHONPATH=$(CURDIR) python3 scripts/gpu_check.py $(GPU_CHECK_ARGS)
