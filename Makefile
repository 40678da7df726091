# Two entry points, both self-installing on a fresh machine with Python 3.11+:
#   make demo   the main job: an offline run against the sandbox (no GCP account, no Hugging Face)
#   make test   the test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# The demo's run history lives in the repo folder, so `make ui` shows it.
DEMO_PREFECT = PREFECT_HOME=$(CURDIR)/.prefect PREFECT_SERVER_ANALYTICS_ENABLED=false

.PHONY: demo test lint sandbox ui clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(BIN)/.installed
	$(DEMO_PREFECT) $(BIN)/python -m sandbox demo

ui: $(BIN)/.installed
	$(DEMO_PREFECT) $(BIN)/prefect server start

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q

lint: $(BIN)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

sandbox: $(BIN)/.installed
	$(BIN)/python -m sandbox up --state-dir .sandbox/dev

clean:
	rm -rf $(VENV) .sandbox .prefect .pytest_cache .ruff_cache
