# Two commands for a fresh machine with Python 3.11+:
#   make demo   set up .venv and run the demo end to end
#   make test   set up .venv (with test tools) and run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# pytest on every core: a test file's tests run on one worker (they share its fixtures), the longest files first
# (tests/conftest.py); benchmarks/bench_suite.py runs pytest with these options too
PYTEST_OPTS := -n auto --dist loadfile --no-loadscope-reorder
# the share of each property test's examples `make test-fast` draws (tests/conftest.py: examples); `make test` and
# CI draw them all. WEKNORA_NB_EXAMPLES=1 make test-fast draws them all too
FAST_EXAMPLES := 0.25

.PHONY: demo test test-fast lint lab bench clean wheel-demo

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# the package with its sandbox extra (what the demo needs), at the versions requirements.txt pins; its bytecode
# compiled once, as pip does for a wheel (with PYTHONDONTWRITEBYTECODE set, as on CI machines, every process would
# compile the modules it imports again); then pgvector built for this CPU if the shipped one needs AVX-512 it lacks
# (weknora_nb/sandbox/pgvector.py)
$(VENV)/.runtime: $(BIN)/python requirements.txt pyproject.toml
	$(BIN)/python -m pip install --quiet -c requirements.txt -e '.[sandbox]'
	$(BIN)/python -m compileall -q weknora_nb
	$(BIN)/python -m weknora_nb.sandbox.pgvector
	touch $@

$(VENV)/.testtools: $(VENV)/.runtime requirements-test.txt
	$(BIN)/python -m pip install --quiet -c requirements.txt -r requirements-test.txt
	touch $@

demo: $(VENV)/.runtime
	$(BIN)/weknora-nb demo

test: lint
	WEKNORA_NB_EXAMPLES=1 $(BIN)/python -m pytest $(PYTEST_OPTS)

# everything but the slow tests (notebooks rendered, whole sandbox collections, large knowledge bases, the demos),
# the property tests on a share of their examples
test-fast: $(VENV)/.testtools
	WEKNORA_NB_EXAMPLES=$${WEKNORA_NB_EXAMPLES:-$(FAST_EXAMPLES)} $(BIN)/python -m pytest $(PYTEST_OPTS) -m "not slow"

lint: $(VENV)/.testtools
	$(BIN)/ruff check weknora_nb tests benchmarks tools
	$(BIN)/mypy

lab: $(VENV)/.runtime
	$(BIN)/python -m pip install --quiet -c requirements.txt -c requirements-test.txt -e '.[sandbox,lab]'
	$(BIN)/jupyter lab notebooks/

bench: $(VENV)/.testtools
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# the wheel, built from the sources and installed in a fresh venv outside the checkout, runs the
# full demo in an empty folder (what CI checks after `make test`; needs PyPI or a wheel index)
wheel-demo:
	PYTHON=$(PYTHON) bash .ci/wheel-demo

clean:
	rm -rf $(VENV)
