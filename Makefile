# Lapidus developer and CI entry points. `make` alone lists the targets.
#
# Variables:
#   PYTHON       interpreter that creates the virtualenv (default: python3)
#   PYTEST_ARGS  extra pytest arguments, e.g. make test PYTEST_ARGS='-k checkpoint -x'
#   TEST_JOBS    (environment) pytest-xdist workers for the tests that run side by side (4)

PYTHON      ?= python3
PYTEST_ARGS ?=
VENV        := .venv
# Touched after a successful install: pip runs again only when pyproject.toml, setup.py or a
# module compiled by setup.py (lapidus/buildinfo.py lists them) is newer, so a repeated
# `make test` spends no time in pip and an edited compiled module is always rebuilt.
VENV_STAMP  := $(VENV)/.lapidus-installed
COMPILED    := $(shell $(PYTHON) -c "import runpy; print(' '.join(runpy.run_path('lapidus/buildinfo.py')['COMPILED']))")

.DEFAULT_GOAL := help
.PHONY: help setup venv test demo check-config clean

help:
	@echo 'Lapidus make targets:'
	@echo '  setup         configure the local PostgreSQL, MariaDB and NATS for CDC (scripts/setup-local; root)'
	@echo '  venv          create $(VENV) and install lapidus[dev] into it, pgoutput compiled (plain: LAPIDUS_COMPILE=0 make clean venv)'
	@echo '  test          setup + venv, then run pytest (extra arguments: PYTEST_ARGS=...)'
	@echo '  demo          setup + venv, then stream the local PostgreSQL to stdout (lapidus demo)'
	@echo '  check-config  validate conf/lapidus.toml (lapidus -t)'
	@echo '  clean         remove $(VENV), build output and caches'

# Run through bash so a lost executable bit (a copy, an odd checkout) cannot break CI.
# PYTHON goes along so setup-local checks that the interpreter `make venv` uses can make a venv.
setup:
	PYTHON='$(PYTHON)' bash scripts/setup-local

# Byte-compiled like an installed package: the editable install leaves that to the first
# import, which never writes it where PYTHONDONTWRITEBYTECODE is set (as on our machines), and
# then every Lapidus process compiles its modules again at start (20-40 ms each). Only changed
# files are compiled again.
venv: $(VENV_STAMP)
	@$(VENV)/bin/python -m compileall -q lapidus

# The venv's interpreter marks that it exists: an existing venv is never recreated, only
# brought up to date by the stamp rule below.
$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV_STAMP): pyproject.toml setup.py lapidus/buildinfo.py $(COMPILED) | $(VENV)/bin/python
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

# setup before venv: with `make -j` the two could run side by side, but pip does not need
# the servers and setup-local does not need the venv, so either order is correct.
# scripts/run-tests: the tests side by side (pytest-xdist, TEST_JOBS workers), then the `serial`
# ones alone; --durations in both, so a suite that grows slow says where.
test: setup venv
	PYTHON=$(VENV)/bin/python bash scripts/run-tests $(PYTEST_ARGS)

demo: setup venv
	$(VENV)/bin/lapidus demo

check-config: venv
	$(VENV)/bin/lapidus -t -c conf/lapidus.toml

# Leaves the servers' configuration alone: undoing it would only cost restarts later.
clean:
	rm -rf $(VENV) build dist .pytest_cache *.egg-info
	find lapidus -name '*.so' -delete
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
