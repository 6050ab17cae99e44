# rankexp — the README's commands.  `make help` lists targets.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch/torchvision pinned to the versions the package registry serves this machine class
TORCH  := torch==2.14.1 torchvision==0.29.1

.PHONY: help setup test-deps demo sweep test test-slow loc bench gpu-check bench-services figures reproduce ui lint clean

help:  ## list targets (variables as this make sees them: make help REPRODUCE=out)
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed -e 's/:.*##/\t/' \
	  -e 's|$$(REPRODUCE)|$(REPRODUCE)|g' -e 's|$$(UI_PORT)|$(UI_PORT)|g' -e 's|$$(BEFORE)|$(BEFORE)|g'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[test,gpt2]'
	touch $(STAMP)

setup: $(STAMP)  ## create .venv and install rankexp with its dependencies

demo: setup  ## the main job on its defaults: the demo sweep, then its heatmap from MLflow
	$(PY) -m rankexp experiment=demo -m
	$(PY) -m analysis heatmap --experiment demo

sweep: setup  ## the README's first sweep: Post-Norm, α ∈ {1,2}, L ∈ {48,96} (4 runs), then its heatmap
	$(PY) -m rankexp norm=post alpha=1,2 depth=48,96 -m
	$(PY) -m analysis heatmap --experiment rankexp

test-deps:  ## system packages the end-to-end tests start: Slurm+MariaDB, PostgreSQL, Chromium (root)
	bash launchers/install-test-deps.sh

# one pytest-xdist worker per core (at most 4); a test file's tests run on one worker, so its
# module fixtures (a swept store, the docs site) are made once (xdist's loadgroup marks do not
# reach pytest 9's node ids)
TEST_WORKERS ?= auto
test: setup test-deps  ## the default test suite (no GPU, no network; real Slurm/PostgreSQL/browser)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses=4 --dist loadfile

test-slow: setup  ## long checks (full-size experiments, real services)
	$(PY) -m pytest -q -m slow

# main before issue 31: the commit `make loc` and `make bench` compare with (BEFORE=<rev> to change)
BEFORE ?= cd9a9b7
loc:  ## product lines (rankexp, analysis, hydra_plugins, benchmarks, launchers) per folder: $(BEFORE) → working tree
	$(PYTHON) -m benchmarks.loc --at $(BEFORE)

bench: setup  ## benchmarks, 1 torch thread, alternating rounds: the engine vs jacfwd/jacrev, the job and a sweep's per-job overhead vs $(BEFORE), train() vs a minimal loop
	$(PY) -m benchmarks.engine
	$(PY) -m benchmarks.job --rev $(BEFORE)
	$(PY) -m benchmarks.train

gpu-check: setup  ## GPU claims in one script (< 8 min on one GPU): CUDA vs CPU measure, training modes, grid wall times
	$(PY) -m benchmarks.gpu_check

bench-services: setup test-deps  ## a sweep's per-job overhead through the joblib and the Slurm launcher (a local Slurm cluster)
	launchers/slurm-cluster.sh start
	eval "$$(launchers/slurm-cluster.sh env)" && $(PY) -m benchmarks.job --rows sweep --launcher local \
	  && $(PY) -m benchmarks.job --rows sweep --launcher slurm; rc=$$?; launchers/slurm-cluster.sh stop; exit $$rc

figures: setup  ## every experiment at size=cpu into figures/cpu/, then every figure (CPU, < 1 h)
	$(PY) -m analysis.figures

REPRODUCE ?= figures/cpu
reproduce: setup  ## every experiment at size=cpu, then the report that checks the study's claims ($(REPRODUCE)/report/report.html)
	$(PY) -m analysis.figures --size cpu --out $(REPRODUCE) --sweeps-only; rc=$$?; \
	  $(PY) -m analysis report --uri sqlite:///$(abspath $(REPRODUCE))/mlflow.db --out $(REPRODUCE)/report \
	  && exit $$rc

UI_STORE ?= sqlite:///$(CURDIR)/mlflow.db
UI_PORT  ?= 5000
ui: setup  ## browse a store in the MLflow UI, http://127.0.0.1:$(UI_PORT) (UI_STORE=…, UI_PORT=…); job runner off, 1 worker
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(VENV)/bin/mlflow ui --backend-store-uri $(UI_STORE) \
	  --host 127.0.0.1 --port $(UI_PORT) --workers 1

lint: setup  ## ruff over rankexp, analysis and tests (the house config in pyproject.toml)
	$(VENV)/bin/ruff check rankexp analysis tests

clean:  ## remove outputs (keeps .venv and the MLflow store)
	rm -rf outputs multirun figures .pytest_cache
