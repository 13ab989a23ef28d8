# Two commands for a fresh machine: `make run` and `make test`. Everything else is their plumbing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.deps-installed
# `make run`: the end-to-end demo (`faultcast demo`). Four twin nodes at 240x real time push to the
# service, HBM, firmware, NVLink and PCIe failures come on cue over four simulated hours, and a console
# trainer acknowledges each alert's snapshot before the service drains the node (no-op actuator). About
# a minute, the first run too: it serves the shipped model (model/shipped_model/) and trains nothing.

.PHONY: run test fast install system-deps lint typecheck unit proto docs bench clean

run: install
	$(BIN)/faultcast demo

test: install system-deps lint typecheck unit

# The edit-run loop, about two minutes on two cores: lint, types (mypy's cache makes a rerun quick) and
# the tests not marked slow (tests/conftest.py marks them, and says why), with fewer fuzz examples
# (hypothesis profile "fast"). `make test` is the test command. More pytest options through
# PYTEST_ARGS, e.g. `make fast PYTEST_ARGS="-x -k spool"`; see docs/testing.md.
fast: install lint typecheck
	FAULTCAST_HYPOTHESIS_PROFILE=$${FAULTCAST_HYPOTHESIS_PROFILE:-fast} $(BIN)/pytest -m "not slow" $(PYTEST_ARGS)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=23.2" "setuptools>=69" wheel

$(DEPS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]' --config-settings editable_mode=strict
	touch $@

# A strict editable install links each module file; re-link on every run so new modules are seen.
install: $(DEPS_STAMP)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=strict

system-deps:
	./scripts/install-system-deps.sh

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy

unit:
	$(BIN)/pytest

proto: install
	$(BIN)/python proto/generate.py

# docs/metrics.md: its prose above the table, then the table from the catalogue.
docs: install
	{ sed '/^| name |/,$$d' docs/metrics.md; $(BIN)/faultcast metrics; } > docs/metrics.md.new
	mv docs/metrics.md.new docs/metrics.md

bench: install
	$(BIN)/python bench/collector.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
