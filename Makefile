# The one definition of how fairq is installed, run, tested and measured; CI uses it too.
# Everything goes into .venv, made on first use and refreshed when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run demo test lint format bench browser clean

run: $(STAMP)          ## fairq's main job: the server and its dashboard, http://127.0.0.1:8040
	$(BIN)/fairq serve

demo: $(STAMP)         ## the BoxOffice ticket-PDF demo with worker processes, on SQLite
	$(BIN)/fairq demo

test: $(STAMP) lint browser   ## the whole test suite (lint, types, tests, browser tests)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

browser:               ## Debian's chromium for the dashboard's browser tests, only if missing
	@[ -x /usr/bin/chromium ] || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's chromium for the browser tests"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
	      >/dev/null 2>&1 || echo "could not install chromium: the browser tests will skip"; \
	  else \
	    echo "chromium is missing and apt-get is not usable: the browser tests will skip"; \
	  fi; }

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

bench: $(STAMP)        ## every benchmark (~45 min); results in bench/results/, docs/benchmarks.md
	$(BIN)/python -m bench.queues
	$(BIN)/python -m bench.pubsub
	$(BIN)/python -m bench.attention
	$(BIN)/python -m bench.idempotency
	$(BIN)/python -m bench.http
	$(BIN)/python -m bench.waitingroom

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv is not available; trying to install it"; \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get install -y -q python3-venv >/dev/null && $(PYTHON) -m venv $(VENV); \
	  else \
	    $(PYTHON) -m pip install -q --user virtualenv && $(PYTHON) -m virtualenv -q $(VENV); \
	  fi; }
	@test -x $@ || { echo "could not create $(VENV); install python3-venv"; exit 1; }

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[demo,bench,push,room,server,redis,postgres,amqp]' --group dev
	@touch $@

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
