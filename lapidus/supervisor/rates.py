"""A backend's events per second over the last minutes: the status page's chart.

Runs in the supervisor process.  Fed by the worker's stats (its cumulative event count, about
once a second, :meth:`ChildHandle.receive`); keeps one point every ``step`` seconds for
``span`` seconds, so its memory is fixed (150 points by default) whether a page looks or not.
"""

from __future__ import annotations

import collections
from typing import Deque, List, Optional, Tuple


class RateHistory:
    def __init__(self, step: float = 2.0, span: float = 300.0):
        self.step = step
        self.points: Deque[Tuple[float, float]] = collections.deque(maxlen=int(span / step))
        self._last: Optional[Tuple[float, int]] = None   # (wall time, count) of the last point

    def add(self, wall: float, events: int) -> None:
        """The worker's count at ``wall`` (unix time).  A count below the last one is a new
        worker process counting from zero again: its events are those since it started."""
        if self._last is None:
            self._last = (wall, events)
            return
        then, before = self._last
        elapsed = wall - then
        if elapsed < self.step:
            return
        done = events - before if events >= before else events
        self.points.append((round(wall, 3), round(done / elapsed, 1)))
        self._last = (wall, events)

    def since(self, wall: float) -> List[Tuple[float, float]]:
        """The points after ``wall`` (all of them for 0), oldest first."""
        return [p for p in self.points if p[0] > wall]
