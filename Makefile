# Two commands for a fresh machine (see README): `make demo` and `make test`.
# Every recipe runs in bash with -e and pipefail, so a failing command in a
# pipeline (pip piped through the warning filter below) still fails the target.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DB ?= turnkeeper-demo.duckdb

# The install is redone only when the project metadata or a source file of the
# package changed since the last one, or a source file was added or removed
# (the list is kept in $(SOURCE_LIST), rewritten only when it differs). Sources:
# the files git tracks or would track (ignored files such as __pycache__ left
# out), or every file when this is not a git checkout.
SOURCES := $(sort $(wildcard $(shell git ls-files --cached --others --exclude-standard \
	spec machines storage api fuzz 2>/dev/null || find spec machines storage api fuzz -type f)))
STAMP := $(VENV)/.installed
# The exact versions installed (constraints/venv.txt, and the setuptools that builds
# the wheel, constraints/build.txt): `make lock` writes them afresh.
PIN := -c constraints/venv.txt
BUILD_PIN := --build-constraint constraints/build.txt
SOURCE_LIST := $(VENV)/.sources
comma := ,

# pip -q still prints this machine's "WARNING: Location … is ignored" lines
# (a find-links folder that does not exist); drop those, keep everything else.
PIP_FILTER := 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }

.PHONY: install lock demo test test-pgbouncer lint typecheck modelcheck mutants mutation-net crosshair reports bench clean FORCE

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(PIN) --upgrade pip $(PIP_FILTER)

# (A file of its own per make process: .ci/run runs two targets at once.)
$(SOURCE_LIST): FORCE | $(BIN)/python
	@new=$@.new.$$$$; printf '%s\n' $(SOURCES) > $$new; \
	if cmp -s $$new $@; then rm $$new; else mv $$new $@; fi

# A normal (non-editable) install, so mypy checks the installed package.
# setuptools' build/lib and build/bdist.* are removed first so a deleted module
# cannot linger in the wheel (build/__editable__.* is an editable install's).
# The stamp carries the time the install started: a file saved meanwhile is
# newer, so the next run installs again.
$(STAMP): $(BIN)/python pyproject.toml README.md constraints/venv.txt constraints/build.txt \
		$(SOURCES) $(SOURCE_LIST)
	touch $@.new
	rm -rf build/lib build/bdist.*
	$(BIN)/pip install -q $(PIN) --upgrade pip $(PIP_FILTER)
	$(BIN)/pip install -q $(PIN) $(BUILD_PIN) '.[test]' $(PIP_FILTER)
	$(BIN)/pip install -q --no-deps --force-reinstall $(BUILD_PIN) . $(PIP_FILTER)
	mv $@.new $@

install: $(STAMP)

# constraints/venv.txt and constraints/build.txt resolved afresh from pyproject.toml's
# ranges (a new virtual environment, a few minutes); run `make test` after it.
lock:
	$(PYTHON) constraints/lock.py

demo: install
	$(BIN)/turnkeeper demo --db $(DEMO_DB)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy -p turnkeeper

# The suite runs over both backends: with_postgres.py starts a throwaway
# PostgreSQL server for it (or says in one line why the PostgreSQL tests skip).
# in_shards.py runs it as TEST_SHARDS processes side by side, each on a share of
# the test files with a server of its own (TEST_SHARDS=1: one process).
TEST_SHARDS ?= 2
test: lint typecheck
	$(BIN)/python model_tests/in_shards.py $(TEST_SHARDS) \
		$(BIN)/python model_tests/with_postgres.py $(BIN)/python -m pytest

# The PostgreSQL part of the suite again, through PgBouncer in transaction mode in
# front of the throwaway server (each test schema gets a role of its own; the tests
# that need the server itself get its URL). Needs pgbouncer (.ci/run installs it).
test-pgbouncer: install
	$(BIN)/python model_tests/with_postgres.py --through-pgbouncer $(BIN)/python -m pytest

# The conformance suite and the stateful machines again with encryption at rest on
# (the store configurations duckdb+enc and postgres+enc; the tests that run over
# them alone), in TEST_SHARDS shares side by side as `make test` runs (in CI it
# runs last, after the pooler pass: its two shares keep both cores busy once
# make test's have ended).
test-encrypted: install
	TURNKEEPER_TEST_ENCRYPTED=only $(BIN)/python model_tests/in_shards.py $(TEST_SHARDS) \
		$(BIN)/python model_tests/with_postgres.py $(BIN)/python -m pytest

# The bounded model checker (model_tests/model_check/) at its larger bound: at least
# 3 actors x 2 targets x lease expiry per model (the CI bound runs in
# model_tests/checking/test_model_check.py). Prints states, transitions, depth and time per
# model; fails with the counterexample as a replay script if an invariant breaks.
modelcheck: install
	cd model_tests && ../$(BIN)/python -m model_check --bound large

# The fence-mutant catalog (model_tests/mutants/catalog.py): each entry's one source
# replacement applied in turn to a temporary copy of the installed package (nothing
# shipped changes), its fixed killing tests run against that copy on both backends (a
# throwaway PostgreSQL server) and required to fail, after passing once on an unmutated
# copy. Prints mutant, killed, killing test and seconds; fails if a mutant survives.
# model_tests/checking/test_mutants.py is its CI part. `make mutants ONLY=id,id` runs those.
mutants: install
	cd model_tests && ../$(BIN)/python -m mutants $(if $(ONLY),--only $(ONLY))

# The second mutation net (model_tests/mutation_net/): cosmic-ray over spec/ and the
# fence-bearing storage/ modules, in a temporary copy of the installed package (nothing
# shipped changes), each area's mutants judged by its fixed tests (DuckDB only, -x), 240 s
# per mutant at most, JOBS of them at once (default: one per core). Folds the outcome into
# reports/MUTATION_NET.md and .json; fails when a survivor is not classified in
# mutation_net/survivors.py. `make mutation-net AREAS=spec-fork,storage-forks` runs those
# areas (hours for all on 2 cores).
JOBS ?= $(shell nproc)
mutation-net: install
	cd model_tests && ../$(BIN)/python -m mutation_net --jobs $(JOBS) $(foreach a,$(subst $(comma), ,$(AREAS)),--area $(a))

# CrossHair over the contracts of spec/ (model_tests/checking/test_crosshair.py: no counterexample,
# every condition checked, each module's control caught) at a larger bound: 10 CPU
# seconds per condition and 3 per path (CI's bound: 0.5 and 0.25).
crosshair: install
	TURNKEEPER_CROSSHAIR_CONDITION_S=10 TURNKEEPER_CROSSHAIR_PATH_S=3 \
		$(BIN)/python -m pytest model_tests/checking/test_crosshair.py -q

# Regenerates every file in reports/: the diagrams (deterministic) and the benchmark (measured).
reports: install bench
	$(BIN)/python reports/generate.py

# reports/bench.json and reports/BENCH.md: DuckDB on a durable file, and PostgreSQL on a
# throwaway server with PostgreSQL's durable defaults (a few minutes on 2 cores).
bench: install
	$(BIN)/python model_tests/with_postgres.py --durable $(BIN)/python reports/bench.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
