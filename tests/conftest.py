"""Shared test helpers: waiting on conditions (never fixed sleeps)."""

from __future__ import annotations

import time

import pytest


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
