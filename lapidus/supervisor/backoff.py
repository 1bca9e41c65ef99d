"""Restart policy: exponential backoff with jitter, and a crash budget per time window.

Stdlib only; pure functions of time so the state machine can be tested without processes.
"""

from __future__ import annotations

import collections
import random
from typing import Deque, Optional


class RestartPolicy:
    """``max_restarts`` crashes inside ``window`` seconds exhaust the budget (-> FATAL)."""

    def __init__(self, max_restarts: int = 5, window: float = 60.0, initial: float = 1.0,
                 maximum: float = 30.0, rng: Optional[random.Random] = None):
        self.max_restarts = max_restarts
        self.window = window
        self.initial = initial
        self.maximum = maximum
        self.crashes: Deque[float] = collections.deque()
        self.rng = rng or random.Random()

    def record_crash(self, now: float) -> None:
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > self.window:
            self.crashes.popleft()

    def exhausted(self) -> bool:
        return len(self.crashes) >= self.max_restarts

    def delay(self) -> float:
        """Seconds to wait before the next start: doubles per recent crash, +-20% jitter."""
        base = min(self.maximum, self.initial * (2 ** max(0, len(self.crashes) - 1)))
        return base * (0.8 + 0.4 * self.rng.random())

    def reset(self) -> None:
        self.crashes.clear()
