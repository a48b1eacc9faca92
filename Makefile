# The README's commands. Every target installs what it needs into .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all install test lint typecheck prometheus rules unit demo bench reliability e2e clean

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) prometheus
	$(BIN)/pytest -m "not slow"

# promtool checks of deploy/prometheus (needs Debian's `prometheus` package).
# Debian's `prometheus` package (prometheus and promtool) for the rule and
# dashboard tests: installed when missing where that can be done (root, apt).
prometheus:
	@command -v promtool >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's prometheus package (promtool)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "promtool missing: apt-get install prometheus (as root)"; exit 1; fi; }

rules: prometheus
	promtool check config deploy/prometheus/prometheus.yml
	promtool check rules deploy/prometheus/rules/*.yml
	promtool test rules deploy/prometheus/tests/*.yml

test: lint typecheck rules unit

demo: $(STAMP)
	$(BIN)/anarchon-sidecar demo

# Benchmarks against their baselines, measured side by side (about 6 minutes on
# 2 cores): bench/results/*.json, a table, bench/results/start-delay.png.
# Sidecars and baselines run in a runtime-only venv (bench/.runtime-venv:
# `pip install .` and nothing else, made by bench/runtime.py when the source
# changed). matplotlib draws the picture; a bench-only dependency.
bench: $(STAMP)
	$(BIN)/pip install --quiet 'matplotlib>=3.8'
	$(BIN)/python -m bench

# Every reliability scenario, the slow ones too (about 15 minutes on 2 cores);
# each prints and records its figures (docs/RELIABILITY.md).
reliability: $(STAMP)
	$(BIN)/pytest tests/reliability -m "slow or not slow" -s

# The image and the compose stack run for real with podman (tests/e2e; root on
# Debian): installs podman, runc, debootstrap and podman-compose if missing,
# builds the images offline, runs deploy/compose, removes all it started.
e2e: $(STAMP)
	sh deploy/e2e/install-deps.sh $(BIN)
	$(BIN)/pytest -p no:cacheprovider -s -v --timeout=900 tests/e2e

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
