"""Exponential backoff with jitter, and the supervisor's crash budget built on it.

Stdlib only, no processes, no clock of its own (callers pass ``now``): every retry loop of
Lapidus (restarts, connection retries, sink retries) takes its delays from :class:`Backoff`,
and the state machine can be tested without waiting.
"""

from __future__ import annotations

import collections
import os
import random
from typing import Deque, Optional

#: the jitter's source when none is given: one per process, because seeding a new
#: ``random.Random`` reads the OS's entropy and costs more than a delivery of one event (the
#: dispatcher makes two backoffs per delivery and sink, for the retries it rarely needs).
#: Seeded again in every forked child, so that processes do not retry in step.
_SHARED_RNG = random.Random()
os.register_at_fork(after_in_child=_SHARED_RNG.seed)


class Backoff:
    """Delays that double from ``initial`` up to ``maximum``, each with +-``jitter`` (a fraction).

    :meth:`next` returns the delay to wait now and doubles the following one; :meth:`reset`
    starts over (call it once the retried thing worked).
    """

    def __init__(self, initial: float = 1.0, maximum: float = 30.0, jitter: float = 0.2,
                 rng: Optional[random.Random] = None):
        if initial <= 0 or maximum < initial:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {initial}, {maximum}")
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self.rng = rng or _SHARED_RNG
        self.attempts = 0

    def peek(self) -> float:
        """The delay :meth:`next` would return, before jitter."""
        return min(self.maximum, self.initial * (2 ** self.attempts))

    def next(self) -> float:
        base = self.peek()
        self.attempts += 1
        return base * (1.0 - self.jitter + 2 * self.jitter * self.rng.random())

    def reset(self) -> None:
        self.attempts = 0


class RestartPolicy:
    """``max_restarts`` crashes inside ``window`` seconds exhaust the budget (-> FATAL); the
    delay before a restart doubles per crash still inside the window."""

    def __init__(self, max_restarts: int = 5, window: float = 60.0, initial: float = 1.0,
                 maximum: float = 30.0, rng: Optional[random.Random] = None):
        self.max_restarts = max_restarts
        self.window = window
        self.backoff = Backoff(initial, maximum, rng=rng)
        self.crashes: Deque[float] = collections.deque()

    @property
    def initial(self) -> float:
        return self.backoff.initial

    @property
    def maximum(self) -> float:
        return self.backoff.maximum

    def record_crash(self, now: float) -> None:
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > self.window:
            self.crashes.popleft()

    def exhausted(self) -> bool:
        return len(self.crashes) >= self.max_restarts

    def delay(self) -> float:
        """Seconds to wait before the next start: doubles per recent crash, +-20% jitter."""
        self.backoff.attempts = max(0, len(self.crashes) - 1)
        return self.backoff.next()

    def reset(self) -> None:
        self.crashes.clear()
        self.backoff.reset()
