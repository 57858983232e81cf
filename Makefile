# The two public commands (README.md):
#   make demo   set up, then run the incident workflow on the bundled incident: a local Prefect
#               server, moto S3, a local Slurm; the run pauses for approval (Ctrl-C tears down).
#               DEMO_APPROVE=1 approves unattended and drains the culprit's node; DEMO=folder
#               runs another incident folder; DEMO_STORE=folder keeps evidence in a folder.
#   make test   set up (Python venv and the system services the tests start), then run every test
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   ?= examples/incident-xid79
DEMO_APPROVE ?=
DEMO_STORE ?= s3

.PHONY: demo test setup system-deps typecheck layers clean

$(BIN)/denpex: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	@# pip compiles every installed module in one process: 45 s of an 85 s install here. compileall
	@# does the same on every core (31 s on two). As with pip, a package's deliberately broken
	@# file (a test fixture, a Python 2 example) does not fail the setup.
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib > /dev/null || true
	touch $(BIN)/denpex

setup: $(BIN)/denpex

system-deps:
	bash scripts/install_system_deps.sh

demo: setup system-deps
	$(BIN)/python scripts/demo.py $(DEMO) --store $(DEMO_STORE) $(if $(filter 1 yes true,$(DEMO_APPROVE)),--approve)

typecheck: setup
	$(BIN)/mypy

# The import contract in pyproject.toml ([tool.importlinter]): the layers of denpex, and what the
# core never imports. No cache: the graph takes under a second, and no folder is left behind.
layers: setup
	$(BIN)/lint-imports --no-cache

# Four xdist workers on two cores: the real-service tests mostly wait, so they overlap the
# CPU-bound ones; tests that share a server stay on one worker (tests/plugins/distribution.py).
TEST_WORKERS ?= 4

# The tests run with bytecode caching on even where the machine's environment turns it off
# (PYTHONDONTWRITEBYTECODE=1 on these machines): otherwise each of the suite's hundreds of Python
# processes (workers, servers, flow runs, CLI calls) compiles the repository's modules from
# source again, and every worker rewrites every test module's asserts again. The setup compiled
# the venv's packages; this covers the checkout (its __pycache__ is git-ignored).
# mypy and the import contract (lint-imports) run beside the tests (their output printed after
# theirs): on two cores their minute of one core fits into the tests' waits. Any of the three
# failing fails `make test`.
test: setup system-deps
	@$(BIN)/mypy > .mypy.out 2>&1 & types=$$!; \
	$(BIN)/lint-imports --no-cache > .layers.out 2>&1 & layers=$$!; \
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=30; tests=$$?; \
	wait $$types; typed=$$?; echo "$(BIN)/mypy"; cat .mypy.out; rm -f .mypy.out; \
	wait $$layers; layered=$$?; echo "$(BIN)/lint-imports"; cat .layers.out; rm -f .layers.out; \
	test $$tests -eq 0 -a $$typed -eq 0 -a $$layered -eq 0

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
