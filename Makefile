# Lockstep developer tasks.  `make help` lists them.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# What `make run` needs: the runtime dependencies only (no test extras, no agent, no torch).
RUN_STAMP := $(VENV)/.installed-runtime
LOCAL_ENV := var/local.env

# make run
PORT ?= 8000

# make test / test-fast: pytest-xdist workers. Most tests wait on other processes, so twice the cores (at least 3,
# at most 8) pays; TEST_WORKERS=0 runs in this process, one test at a time.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); n=$$((n * 2)); [ $$n -lt 3 ] && n=3; [ $$n -gt 8 ] && n=8; echo $$n)
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadgroup

.DEFAULT_GOAL := help
.PHONY: help install install-runtime run test test-fast lint clean slurm-demo

help:
	@echo "make install   create $(VENV) and install Lockstep with its test extras (quick when nothing changed)"
	@echo "make install-runtime  only what running needs (make run uses it; make install includes it)"
	@echo "make run       install-runtime, $(LOCAL_ENV), migrate, collectstatic, demo users and world, web + workers (faults, analytics) + beat (+ redis) on http://127.0.0.1:$(PORT)/"
	@echo "make slurm-demo  (with make run going) a local 3-node Slurm with a real training job that loses a node"
	@echo "make test      run the whole suite in parallel (TEST_WORKERS=$(TEST_WORKERS); PostgreSQL and Redis, see DATABASE_URL / REDIS_URL); PYTEST_ARGS=... passes through"
	@echo "make test-fast the tests that start no extra process (-m 'not slow'), in parallel: the inner loop"
	@echo "make lint      ruff check and ruff format --check"
	@echo "make clean     remove caches, collected static files and the beat schedule (keeps $(VENV) and the database)"

# --- install: redone only when pyproject.toml is newer than the stamp --------------------------------------
# install is complete (runtime + test extras + the agent with its extras: what .ci/run and make test need);
# install-runtime is what running needs, and a complete install satisfies it too.
install: $(STAMP)
install-runtime: $(RUN_STAMP)

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "Lockstep needs Python 3.11+; $(PYTHON) is $$($(PYTHON) --version 2>&1). Try: make install PYTHON=python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml agent/pyproject.toml | $(PY)
	$(PY) -m pip install -e '.[test]' -e './agent[redfish,test,protect,metrics]'
	@touch $@ $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -e .
	@touch $@

# --- the local run's settings (DEBUG, a generated SECRET_KEY, the database, demo retention), written once ----
$(LOCAL_ENV):
	@$(PYTHON) bin/local-env $@ >/dev/null

# --- run: the whole stack under honcho; Ctrl-C stops every process -----------------------------------------
run: export DEBUG ?= true
run: export WEB_PORT := $(PORT)
run: export PATH := $(abspath $(VENV))/bin:$(PATH)
run: install-runtime $(LOCAL_ENV)
	@$(PY) manage.py migrate --noinput -v 0
	@$(PY) manage.py collectstatic --noinput -v 0
	@answer=$$(bin/ensure-redis) || exit 1; \
	procs="web worker analytics beat simulator"; \
	if [ "$$(printf '%s\n' "$$answer" | tail -n 1)" = local ]; then \
	  procs="redis $$procs"; \
	  REDIS_PORT=$$(bin/ensure-redis --port); export REDIS_PORT; \
	fi; \
	echo "Starting $$procs on http://127.0.0.1:$(PORT)/; how to log in follows once it answers (Ctrl-C stops everything)"; \
	exec $(VENV)/bin/honcho start -f Procfile $$procs

# --- slurm-demo: a local Slurm (root, slurm-wlm, munge, torch) with a training job, beside `make run` -------
slurm-demo: export DEBUG ?= true
slurm-demo: install $(LOCAL_ENV)
	$(PY) manage.py slurm_demo --url http://127.0.0.1:$(PORT)

# --- test: against PostgreSQL and a real Redis (DB 14 keeps away from a dev stack on DB 0) ------------------
# Each xdist worker gwN gets test_<db>_gwN and Redis DB 14-N (controlplane/testing/settings.py). The wall time
# printed last is the whole run's, worker start-up included; --durations lists the slowest tests. test-fast keeps
# its test databases between runs (--reuse-db: migrate still applies new migrations); make test builds them anew.
test test-fast: export DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/lockstep
test test-fast: export REDIS_URL ?= redis://127.0.0.1:6379/14
test: install
	@start=$$(date +%s); status=0; \
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) --durations=25 $(PYTEST_ARGS) || status=$$?; \
	echo "make test: suite wall time $$(( $$(date +%s) - start )) s with TEST_WORKERS=$(TEST_WORKERS)"; \
	exit $$status

test-fast: install
	@start=$$(date +%s); status=0; \
	$(VENV)/bin/pytest $(PYTEST_PARALLEL) -m "not slow" --reuse-db --durations=10 $(PYTEST_ARGS) || status=$$?; \
	echo "make test-fast: wall time $$(( $$(date +%s) - start )) s with TEST_WORKERS=$(TEST_WORKERS)"; \
	exit $$status

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf staticfiles .pytest_cache .ruff_cache test-artifacts build *.egg-info var/celerybeat-schedule*
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
