# accrot — `make help` lists every target. The first run of any target creates .venv and installs
# the pinned dependencies (torch==2.13.0 first, then the rest under constraints.txt). A node without network that
# brings its own torch installs from `make wheelhouse`'s folder instead (README, GPU).
.DEFAULT_GOAL := help
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# tests and demos never touch the network or the user's caches
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
PYTEST_ARGS ?=
# sweeps: make sweep SWEEP=smoke WORKERS=2 [STORAGE=url]; make dashboard STUDY=smoke [STORAGE=url] [PORT=8080]
SWEEP ?= smoke
WORKERS ?= 1
STUDY ?= $(SWEEP)
STORAGE ?=
PORT ?= 8080
# the trials' files (curves, diagnostics, configs) the dashboard shows: a spec's `artifacts`, by default beside the study
ARTIFACTS ?= runs/sweeps/$(STUDY)/artifacts
# the study in one command: make ablation [SIZE=study|decide|tiny|small|paper] [SEEDS=N] [ABLATION_WORKERS=2] [STORAGE=url]
SIZE ?= study
SEEDS ?=
ABLATION_WORKERS ?= 2
# make wheelhouse PY=3.12 PLATFORM=manylinux_2_28_x86_64 [WHEELHOUSE=wheelhouse] [HAVE=node-packages.json]: the
# node's Python and newest manylinux tag (glibc 2.N: `ldd --version` there); unset, this machine's. HAVE: the node's
# `python -m pip list --format=json`, for the minimal carry (only what a run imports and the node lacks)
HAVE ?=
PY ?=
PLATFORM ?=
WHEELHOUSE ?= wheelhouse
# demo, sweep, ablation: QUIET=1 prints one line per finished run instead of the live display
QUIET ?=

.PHONY: help install wheelhouse test test-slow test-all faults breakages demo ablation lint bench bench-storage sweep dashboard clean gpu-check

help: ## show this help (colour on a terminal only; NO_COLOR=1 turns it off)
	@if [ -t 1 ] && [ -z "$$NO_COLOR" ]; then on=$$'\033[36m'; off=$$'\033[0m'; else on=; off=; fi; \
	grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | \
	awk -v on="$$on" -v off="$$off" 'BEGIN {FS = ":.*?## "}; {printf "  %s%-14s%s %s\n", on, $$1, off, $$2}'

$(STAMP): pyproject.toml constraints.txt $(wildcard accrot/ops/csrc/*.cpp accrot/ops/csrc/*.h) accrot/ops/cpu_kernels.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,peers]'
	$(BIN)/python -m accrot.ops.cpu_kernels
	@touch $@

install: $(STAMP) ## create .venv and install pinned dependencies (idempotent)

# needs only python3 with pip >= 22.2 and network; installs nothing here
wheelhouse: ## every wheel but the node's torch/triton/CUDA for an offline node -> WHEELHOUSE (PY=3.12 PLATFORM=manylinux_2_28_x86_64; HAVE=node-packages.json: only what a run imports that the node lacks)
	$(PYTHON) .ci/wheelhouse.py $(if $(PY),--python-version $(PY)) $(if $(PLATFORM),--platform $(PLATFORM)) --dest '$(WHEELHOUSE)' $(if $(HAVE),--have '$(HAVE)')

# `make test` stays under 15 minutes on 2 cores: the long tests (marked slow, about 5 minutes together) are their own
# target, which CI runs right after it; `make test-all` is both in one pytest run
test: $(STAMP) ## the test suite without the long (slow-marked) tests, offline: under 15 min on 2 cores
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP) ## only the long tests (a real interrupted ablation, sweeps under faults, the quick bench, ...)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-all: $(STAMP) ## every test in one run (test + test-slow)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

faults: $(STAMP) ## kill and resume runs, kill a sweep worker, try every bad input; print the figures
	$(BIN)/python tests/helpers/fault_injection.py

breakages: $(STAMP) ## apply each deliberate breakage of tests/helpers/breakages.py to a scratch copy: its tests must fail
	$(BIN)/python tests/helpers/breakages.py

demo: $(STAMP) ## train tiny models under several schemes on the embedded corpus and compare extrapolation
	$(BIN)/accrot demo $(if $(QUIET),--quiet)

ablation: $(STAMP) ## the ablation: the default variants x the corpus and the local task x seeds -> results/ablation-SIZE/REPORT.md (SIZE=study|decide|tiny|small|paper; resumable)
	$(BIN)/accrot ablation --size $(SIZE) --workers $(ABLATION_WORKERS) $(if $(SEEDS),--seeds $(SEEDS)) $(if $(STORAGE),--storage '$(STORAGE)') $(if $(QUIET),--quiet)

bench: $(STAMP) ## print side-by-side benchmark ratios (schemes, PaTH, eval memory, Lightning loop overhead)
	$(BIN)/accrot bench all

bench-storage: $(STAMP) ## a sweep's storage under load: PostgreSQL directly vs through the storage proxy, kills included (minutes)
	$(BIN)/accrot bench storage

gpu-check: $(STAMP) ## on a GPU: pytest -m gpu, bench schemes/path on CUDA, 200 small steps per variant -> results/gpu-check/REPORT.md (<10 min; without CUDA: one line, exit 0; DRY_RUN=1: the plan and its time, anywhere)
	$(BIN)/python tests/helpers/gpu_check.py $(if $(DRY_RUN),--dry-run)

sweep: $(STAMP) ## run a study spec of sweeps/ with parallel workers (SWEEP=smoke WORKERS=2 [STORAGE=url])
	$(BIN)/accrot sweep $(SWEEP) --workers $(WORKERS) $(if $(STORAGE),--storage '$(STORAGE)') $(if $(QUIET),--quiet)

dashboard: $(STAMP) ## optuna-dashboard for a study on 127.0.0.1:PORT (STUDY=smoke [STORAGE=url] [ARTIFACTS=dir] [PORT=8080])
	@if [[ '$(STORAGE)' == grpc://* ]]; then echo "make dashboard: STORAGE='$(STORAGE)' is a storage proxy, which optuna-dashboard cannot read through; pass the proxy's database (STORAGE=postgresql://...)" >&2; exit 2; fi
	@if [ -z '$(STORAGE)' ] && [ ! -f 'runs/sweeps/$(STUDY)/study.db' ]; then s=$$(ls runs/sweeps 2>/dev/null | xargs); echo "make dashboard: no study '$(STUDY)' here (no runs/sweeps/$(STUDY)/study.db; studies here: $${s:-none}); run make sweep SWEEP=$(STUDY) first, or pass STORAGE=url" >&2; exit 2; fi
	$(BIN)/optuna-dashboard '$(or $(patsubst journal://%,%,$(STORAGE)),sqlite:///runs/sweeps/$(STUDY)/study.db)' --artifact-dir '$(ARTIFACTS)' --host 127.0.0.1 --port $(PORT)

# SLURM: make slurm-train NODES=2 TASKS=4 [PARTITION=p] [TIME=04:00:00] [ACCOUNT=a] [MASTER_ADDR=ip] [DRY_RUN=1] ARGS='--config small'
#        make slurm-sweep SWEEP=lr STORAGE=postgresql://... WORKERS=4 NODES=2 TASKS=4 [...]
NODES ?= 1
TASKS ?= 1
TIME ?= 01:00:00
ARGS ?= --config tiny
SLURM_OPTS = --nodes $(NODES) --tasks_per_node $(TASKS) --time $(TIME) $(if $(PARTITION),--partition $(PARTITION)) \
	$(if $(ACCOUNT),--account $(ACCOUNT)) $(if $(MASTER_ADDR),--master_addr $(MASTER_ADDR)) $(if $(DRY_RUN),--dry-run)
.PHONY: slurm-train slurm-sweep

slurm-train: $(STAMP) ## sbatch one DDP run on NODES x TASKS ranks (ARGS='--config small ...'; DRY_RUN=1 prints it)
	$(BIN)/accrot slurm train $(SLURM_OPTS) -- $(ARGS)

slurm-sweep: $(STAMP) ## sbatch WORKERS multi-node sweep workers as a job array (SWEEP=lr STORAGE=url NODES= TASKS=)
	$(BIN)/accrot slurm sweep $(SWEEP) --workers $(WORKERS) $(if $(STORAGE),--storage '$(STORAGE)') $(SLURM_OPTS)

lint: $(STAMP) ## ruff over the code and tests; import-linter: imports flow one way (pyproject.toml)
	$(BIN)/ruff check accrot data_modules callbacks tests
	$(BIN)/lint-imports

clean: ## remove the virtual environment, caches and run outputs
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info runs/demo
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
