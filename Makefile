# reclock: `make demo` sets everything up and runs the demo; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo up test test-fast soak bench clean

KINESIS := devtools/kinesis
# Test worker processes (pytest-xdist), a test file to each; 0 runs the tests in this process alone.
TEST_WORKERS ?= 2
# When make started: `make test` prints its wall time, set-up included (tests/conftest.py).
export RECLOCK_MAKE_STARTED := $(shell date +%s)

setup: $(STAMP) $(KINESIS)/node_modules/.installed
	bash jvm/fetch-jars.sh $(BIN)/python

# The Kinesis-compatible server for the tests and the demo (kinesis-local), exactly as locked.
$(KINESIS)/node_modules/.installed: $(KINESIS)/package.json $(KINESIS)/package-lock.json devtools/system-packages.sh
	bash devtools/system-packages.sh
	cd $(KINESIS) && npm ci --no-audit --no-fund
	touch $@

$(STAMP): requirements.txt requirements-runtime.txt pyproject.toml devtools/system-packages.sh
	bash devtools/system-packages.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt  # runtime (requirements-runtime.txt) and test tools
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: setup
	$(BIN)/python -m devtools.demo

# The local platform in the Airflow UI (devtools/up.py): servers, airflow standalone, the demo's sources every
# minute, records arriving; Ctrl-C stops it all.
up: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m devtools.up

test: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir var/site  # the docs site: any warning fails
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30

# The long repetitions, outside CI (devtools/soak.py): race rounds, kills per crash point, a long racing run.
soak: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m devtools.soak

test-fast: setup
	$(BIN)/pytest -m "not slow"

bench: setup
	$(BIN)/python -m bench.reclock_bench

clean:
	rm -rf var/demo var/bench spark-warehouse/
