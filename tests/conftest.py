"""Shared test helpers: waiting on conditions (never fixed sleeps); a guard against stale
compiled modules."""

from __future__ import annotations

import time

import pytest

# The helpers of tests/integration (fixtures, writers, checks) get pytest's assertion messages
# too.  Registered here, before any test module imports one: a registration in a test module
# comes too late for a helper another module already imported.
pytest.register_assert_rewrite("tests.integration")


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = ""):
    """Call ``predicate`` until it returns a truthy value; fail with ``message`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message or predicate}")
        time.sleep(interval)


def pytest_sessionstart(session):
    """A compiled module older than its source would test the previous code: refuse."""
    from lapidus.buildinfo import stale_builds

    stale = stale_builds()
    if stale:
        pytest.exit(f"compiled module(s) {', '.join(stale)} are older than their source: run "
                    f"`make venv` to rebuild them (or `LAPIDUS_COMPILE=0 make clean venv` for the "
                    f"plain-Python modules)", returncode=2)
