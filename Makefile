# slurm-gpu-eff: the front door. `make demo` and `make test` work on a fresh Debian 12
# machine as root: each installs what it needs (apt packages, the .venv) first.
PY_BASE ?= /usr/bin/python3
VENV    := .venv
PY      := $(VENV)/bin/python
CLUSTER := bash scripts/cluster.sh
PYTEST  := $(PY) -m pytest -q -p no:cacheprovider
export PYTEST
# The dev cluster's store engine for `make cluster` and `make integration`: sqlite or
# postgresql (a private server under the cluster's directory, scripts/pg.sh).
STORE   ?= sqlite
# Its Slurm release and cgroup version for `make cluster`, `make demo`, `make integration`:
# SLURM=22.05 (Debian 12's own packages; cgroup v1), 24.11 or 26.05 (in Debian roots,
# scripts/slurm-root.sh; cgroup v2, 26.05 with SLUID cgroup paths); CGROUP=v1|v2 on the
# latter two. Unset: the running cluster's, else 22.05. Another one replaces the cluster.
SLURM   ?=
CGROUP  ?=
# `make test`: the whole suite on 22.05 (cgroup v1), then the tests that touch Slurm
# (marker cluster) on each of these, each RELEASE/CGROUP
OTHER_SLURMS := 24.11/v2 26.05/v2
# The stand-in libnvidia-ml.so.1 the tests and the demo load below the real pynvml
STANDIN := build/nvml/current/libnvidia-ml.so.1
# Where `make test` keeps each part's JUnit XML for its closing total
RESULTS := build/test-results
TEST_PARTS = $(shell bash scripts/test-pass.sh --parts)

.PHONY: demo test cluster cluster-down cluster-env deps venv pyslurm lint unit integration soak bench docs gpu-check

demo: cluster
	@$(PY) scripts/demo.py

# Every test on both store engines: all of them with the cluster on SQLite (a test with a
# store of its own runs once per engine), then the cluster is switched to PostgreSQL and
# the tests of its store (marker cluster_store) run again; it is switched back either way.
# Each pass runs its tests side by side where they can share the cluster and alone where
# they cannot (scripts/test-pass.sh); TEST_WORKERS processes at once (default 4).
# It ends with one line for the whole run (scripts/test-total.py, from each part's JUnit XML).
test: venv lint
	GPUEFF_STORE=sqlite GPUEFF_SLURM=22.05 GPUEFF_CGROUP=v1 $(CLUSTER) up
	@rm -rf $(RESULTS) && mkdir -p $(RESULTS)
	start=$$(date +%s); status=0; export GPUEFF_REQUIRE_CLUSTER=1 TEST_RESULTS=$(RESULTS); \
	bash scripts/test-pass.sh "" tests || status=1; \
	{ $(CLUSTER) store postgresql && bash scripts/test-pass.sh cluster_store tests/integration; } || status=1; \
	$(CLUSTER) store sqlite || status=1; \
	for flavour in $(OTHER_SLURMS); do \
	  echo "--- Slurm $${flavour%/*} on cgroup $${flavour#*/}: the tests that touch Slurm"; \
	  { GPUEFF_STORE=sqlite GPUEFF_SLURM=$${flavour%/*} GPUEFF_CGROUP=$${flavour#*/} $(CLUSTER) up && \
	    TEST_PASS_NAME=slurm-$${flavour%/*} bash scripts/test-pass.sh cluster tests/integration; } || status=1; \
	done; \
	$(PY) scripts/test-total.py $(RESULTS) $$start \
	  $(foreach pass,all cluster_store $(foreach f,$(OTHER_SLURMS),slurm-$(firstword $(subst /, ,$(f)))),$(foreach part,$(TEST_PARTS),$(pass)-$(part))) \
	  || status=1; exit $$status

cluster: venv
	GPUEFF_STORE=$(STORE) GPUEFF_SLURM=$(SLURM) GPUEFF_CGROUP=$(CGROUP) $(CLUSTER) up

cluster-down:
	$(CLUSTER) down

cluster-env:
	@$(CLUSTER) env

deps:
	@bash scripts/install-deps.sh

venv: deps $(VENV)/.installed $(STANDIN) pyslurm

# Debian's own Python, not a pyenv shim: the jobs of unprivileged users run it too.
# (the venv's bin/gpueff and hooks are copies of these, made at install time)
$(VENV)/.installed: pyproject.toml bin/gpueff prolog/gpueff-prolog epilog/gpueff-epilog
	$(PY_BASE) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test,sim,postgres]'
	$(PY) -c 'from slurm_gpu_eff.report.render import precompile; precompile()'
	touch $@

# pyslurm for the host's Slurm (22.05), from ../shared/vendor (or $PYSLURM_SRC): compiled
# once per source and Python (about 3 minutes), kept in /var/cache/gpueff/wheels, installed
# into the venv. Without the sources it says so and gpueff asks Slurm through its commands.
# The 24.11 root's is built by scripts/cluster.sh when it makes that root's venv.
pyslurm: $(VENV)/.installed
	@bash scripts/build-pyslurm.sh host $(VENV)

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
	$(PYTEST) -n $(or $(TEST_WORKERS),4) tests/unit

integration: cluster
	GPUEFF_REQUIRE_CLUSTER=1 bash scripts/test-pass.sh "" tests/integration

# The fault-injection soak (issue 20): SOAK_JOBS jobs of mixed shapes with the idle policy
# on, while faults are injected from SOAK_SEED; about 15 minutes for 200. Not in `make test`.
SOAK_JOBS ?= 200
SOAK_SEED ?= 20261126
# The default release (22.05 on cgroup v1) unless SLURM= names another: a bare `make
# cluster` keeps the release of the cluster that ran last.
soak: venv
	GPUEFF_STORE=$(STORE) GPUEFF_SLURM=$(or $(SLURM),22.05) GPUEFF_CGROUP=$(CGROUP) $(CLUSTER) up
	GPUEFF_REQUIRE_CLUSTER=1 GPUEFF_SOAK_JOBS=$(SOAK_JOBS) GPUEFF_SOAK_SEED=$(SOAK_SEED) \
	  $(PYTEST) -s tests/integration/test_soak.py

bench: venv
	$(PY) bench/run.py

# On a machine with an NVIDIA GPU and PyTorch, without Slurm or a network: the real sampler
# on GPU 0 against nvidia-smi, the workload's own CUDA events and the driver's counters.
# Uses that machine's python3 (torch, nvidia-ml-py); nothing is installed.
gpu-check:
	PYTHONPATH=$(CURDIR) python3 scripts/gpu_check.py $(GPU_CHECK_ARGS)
