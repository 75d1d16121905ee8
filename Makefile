# pgfleet developer commands. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BENCH_DSN ?= $(or $(PGFLEET_BENCH_DSN),postgresql://postgres@127.0.0.1:5432/postgres)
BENCH_ARGS ?=
FLEET_ARGS ?=

SCENARIO ?= all
PROFILE ?= full
LOADTEST_ARGS ?=
CONSOLE_BENCH_ARGS ?=

API_FUZZ_ARGS ?=

.PHONY: help venv test test-fast test-asyncpg-range lint format docs docs-build docs-generate dist release-check bench bench-peers bench-producers bench-django fleet loadtest loadtest-smoke loadtest-soak-hour chaos clean screenshots console-bench lock audit advisories api-fuzz

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-14s %s\n", $$1, $$2}'

# Every install path installs a lock file (requirements/*.lock: exact versions and
# the hashes of their files; `make lock` regenerates them), then pgfleet itself
# without dependencies and with the locked setuptools (no build isolation, so no
# unpinned download either). --no-deps: the lock is the whole resolution, so pip
# resolves nothing (its resolver, asked for a locked package with an extra, may
# pick a newer release than the lock's and refuse it as unpinned); pip check then
# proves the lock complete.
$(VENV)/.installed: pyproject.toml requirements/dev.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements/dev.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $@ $(VENV)/.fleet-installed

# The native fleet needs only the service and embedded extras: a first `make fleet`
# does not wait for the test and load-test dependencies (a quarter of the download).
$(VENV)/.fleet-installed: pyproject.toml requirements/fleet.lock requirements/build.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements/fleet.lock -r requirements/build.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	touch $@

venv: $(VENV)/.installed ## create .venv with everything the tests need

test: venv ## run the test suite against a real PostgreSQL (CONTRIBUTING.md: Tests)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: venv ## unit and integration tests on one event loop (a few minutes): the loop to run while working
	PGFLEET_TEST_LOOPS=asyncio $(PY) -m pytest tests/unit tests/integration -q $(PYTEST_ARGS)

test-asyncpg-range: venv ## the tests of what touches asyncpg's internals, on the lowest and highest asyncpg pyproject allows
	$(PY) -m tools.asyncpg_range

lint: venv ## ruff (lint + format check) and mypy --strict on all Python in the repo
	$(VENV)/bin/ruff check pgfleet tests tools worker loadtest examples docs/snippets
	$(VENV)/bin/ruff format --check pgfleet tests tools worker loadtest examples docs/snippets
	$(VENV)/bin/mypy

format: venv ## apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff format pgfleet tests tools worker loadtest examples docs/snippets
	$(VENV)/bin/ruff check --fix pgfleet tests tools worker loadtest examples docs/snippets

docs: venv ## serve the documentation site at http://127.0.0.1:8001, rebuilding on change
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve -a 127.0.0.1:8001

docs-build: venv ## build the site strictly into site/ (a broken link or reference fails), after checking the generated pages
	$(PY) -m tools.docs --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-generate: venv ## regenerate docs/reference/ (options, CLI, HTTP API, metrics) from the code
	$(PY) -m tools.docs

dist: venv ## build the sdist and the wheel into dist/
	$(PY) -m build --no-isolation --outdir dist

release-check: venv ## build, install the wheel with its extras into a new venv, and run a migration and a job from it
	$(PY) -m tools.release_check

bench: venv ## throughput/latency benchmark vs raw SQL (BENCH_DSN=..., BENCH_ARGS=...)
	mkdir -p bench-results
	$(PY) -m tools.bench --dsn '$(BENCH_DSN)' --json bench-results/latest.json $(BENCH_ARGS)

bench-peers: venv ## pgfleet vs pgqueuer and graphile-worker (pinned; Node.js from npm into ~/.cache) vs raw SQL, interleaved (BENCH_DSN=..., BENCH_ARGS='--contenders pgfleet,graphile --phases drain')
	$(PY) -m pip install --quiet 'pgqueuer==1.6.0'
	mkdir -p bench-results
	$(PY) -m tools.bench.peers --dsn '$(BENCH_DSN)' --json bench-results/peers.json $(BENCH_ARGS)

bench-producers: venv ## single-enqueue throughput: Queue, the psycopg producers, a bare insert (BENCH_DSN=a database of your own)
	mkdir -p bench-results
	$(PY) -m tools.bench.producers --dsn '$(BENCH_DSN)' --json bench-results/producers.json $(BENCH_ARGS)

bench-django: venv ## 10,000 Django tasks: pgfleet's backend vs django-tasks-db (BENCH_DSN=a database of your own: its task tables are emptied)
	mkdir -p bench-results
	$(PY) -m tools.bench.django_tasks --dsn '$(BENCH_DSN)' --json bench-results/django-tasks.json $(BENCH_ARGS)

fleet: $(VENV)/.fleet-installed ## run the fleet without Docker until Ctrl-C (FLEET_ARGS='--processes 5 --rate 50')
	$(PY) -m tools.fleet $(FLEET_ARGS)

loadtest: venv ## Locust scenarios + capacity report: SCENARIO=contention|drain|steady|soak|all PROFILE=full|smoke
	$(PY) -m loadtest.run $(SCENARIO) --profile $(PROFILE) $(LOADTEST_ARGS)

loadtest-smoke: venv ## every load-test scenario for a few seconds, then the report (about a minute)
	$(PY) -m loadtest.run all --profile smoke $(LOADTEST_ARGS)

loadtest-soak-hour: venv ## the soak for an hour at 70% of the fleet's measured capacity, then the report
	$(PY) -m loadtest.run soak --profile full --set soak.seconds=3600 $(LOADTEST_ARGS)

chaos: venv ## chaos suite, long profile: 3000 jobs, 30 s partition (table in chaos-results/)
	PGFLEET_CHAOS_PROFILE=long $(PY) -m pytest tests/chaos $(PYTEST_ARGS)

screenshots: venv ## run the console's browser tests, writing their screenshots to docs/console/
	PGFLEET_UI_SCREENSHOTS=docs/console $(PY) -m pytest tests/acceptance/test_console.py -q

console-bench: venv ## console page render times on 1M retained jobs (BENCH_DSN=..., CONSOLE_BENCH_ARGS=...)
	$(PY) -m tools.console_bench --dsn '$(BENCH_DSN)' $(CONSOLE_BENCH_ARGS)

lock: venv ## regenerate requirements/*.lock from pyproject.toml (uv; every file's hash)
	$(PY) -m tools.supply lock

audit: venv ## report known-vulnerable pins in requirements/*.lock (pip-audit, else the snapshot)
	$(PY) -m tools.supply audit

advisories: venv ## refresh requirements/advisories.json, the audit's offline snapshot (OSV API)
	$(PY) -m tools.supply advisories --osv

api-fuzz: venv ## Schemathesis against a real pgfleet api, long profile (API_FUZZ_ARGS=...)
	PGFLEET_API_FUZZ_PROFILE=long $(PY) -m pytest tests/acceptance/test_api_fuzz.py $(API_FUZZ_ARGS)

clean: ## remove the virtualenv, caches, builds and the native fleet's state (.fleet: database, logs)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache bench-results .fleet site dist
