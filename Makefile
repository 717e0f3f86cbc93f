# The two set-up commands of the README:  `make run`  and  `make test`.
# Both create/reuse .venv and install what they need first (scripts/setup_env.py: uv with pinned versions, pip as
# the fallback; INSTALLER=pip forces pip, VENV=/path installs elsewhere).
VENV ?= .venv
INSTALLER ?= auto
PYTHON ?= python3
ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` and `make test-fast`, one per core of a 2-core VM (0: no workers, one process);
# each test file runs whole in one worker, so its module and session fixtures are made once per worker
TEST_WORKERS ?= 2

.PHONY: setup run test test-long test-fast test-gpu gpu-check lint bench

setup:
	@$(PYTHON) scripts/setup_env.py --venv $(VENV) --installer $(INSTALLER)

run:  ## the main job: `sr1 run` on the embedded tiny default (ARGS="learner.max_staleness=0" ...)
	@$(PYTHON) scripts/setup_env.py --venv $(VENV) --installer $(INSTALLER) --world '$(ARGS)'  # a fresh install builds the world meanwhile
	$(VENV)/bin/sr1 run $(ARGS)

test:  ## ruff, then every test but the long tier: unit and integration, slow ones included (what CI runs)
	@$(PYTHON) scripts/setup_env.py --venv $(VENV) --installer $(INSTALLER) --world ''
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -m "not long" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-long: setup  ## the long tier (marked long): chaos rehearsals, the soak, full rebuilds, minutes each
	$(VENV)/bin/python -m pytest -m long $(PYTEST_ARGS)

test-fast: setup  ## every test not marked slow: the unit tests and the faster integration tests
	$(VENV)/bin/python -m pytest -m "not slow and not gpu" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-gpu: setup  ## the GPU tier (tests/gpu, marked gpu): needs a CUDA GPU, skipped with the reason without one
	$(VENV)/bin/python -m pytest -m gpu tests/gpu $(PYTEST_ARGS)

gpu-check: setup  ## the one prepared GPU call (scripts/gpu_check.sh, docs/learner-gpu.md); DRY=1: its stages on CPU
	DRY=$(DRY) PYTHON=$(VENV)/bin/python bash scripts/gpu_check.sh

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
