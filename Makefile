# The two public commands (README.md):
#   make demo   set up, then triage the bundled real Flight Recorder dumps
#   make test   set up (Python venv and the system services the tests start), then run every test
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   ?= tests/fixtures/gloo/withheld_one

.PHONY: demo test setup system-deps typecheck clean

$(BIN)/denpex: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(BIN)/denpex

setup: $(BIN)/denpex

system-deps:
	bash scripts/install_system_deps.sh

demo: setup
	$(BIN)/denpex triage $(DEMO)

typecheck: setup
	$(BIN)/mypy

test: setup system-deps typecheck
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
