"""Waiting on conditions with a deadline (never a fixed sleep for correctness)."""

from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


class ChaosTimeout(Exception):
    """A condition did not hold within its deadline; the message names the condition."""


def wait_for(predicate: Callable[[], Optional[T]], timeout: float, what: str,
             interval: float = 0.05) -> T:
    """Call ``predicate`` until it returns a truthy value (returned); ChaosTimeout after
    ``timeout`` seconds.  An exception of the predicate counts as "not yet"."""
    deadline = time.monotonic() + timeout
    last_error: Optional[BaseException] = None
    while True:
        try:
            value = predicate()
        except Exception as exc:      # a server that is still coming up, for instance
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise ChaosTimeout(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(interval)


def hold(seconds: float, stop: Optional[Callable[[], bool]] = None) -> None:
    """Let time pass: the length of an outage or the pace of a load, not a wait for a
    condition.  Returns early when ``stop()`` becomes true."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop is not None and stop():
            return
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
