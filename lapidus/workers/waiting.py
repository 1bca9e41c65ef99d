"""Waiting for an unreachable database: the worker's one retry loop for transient errors.

Runs in a worker process (any backend type).  Sources only *classify* what went wrong
(:class:`lapidus.workers.base.BackendError`, ``fatal`` or not); this module decides what a
transient error costs: a wait taken from :class:`lapidus.backoff.Backoff`, capped by the
backend's ``reconnect_max_delay``, during which the supervisor is told at once and then about
every second that the worker is WAITING (``report("waiting", target=, since=, error=)``; the
repeats are also the worker's heartbeat).  A transient error is never a crash: the worker
process stays alive and the supervisor counts nothing.

Stopping: SIGTERM must end a waiting or connecting worker promptly.  The worker's signal
handler raises :class:`StopRequested` while the worker is inside :meth:`StopGate.blocking`
(connect attempts, the waits here), which breaks out of a blocking socket call or sleep at once;
elsewhere it only sets a flag, so no other code is ever interrupted half-way.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator, Optional

from ..backoff import Backoff
from .base import BackendError

#: Seconds between two "waiting" reports (the supervisor's heartbeat needs them regularly).
REPORT_EVERY = 1.0
#: First delay between two attempts; doubles up to the backend's reconnect_max_delay.
FIRST_DELAY = 0.5
#: Default of the backend setting reconnect_max_delay (seconds).
DEFAULT_MAX_DELAY = 30.0
#: A connection lost sooner than this (seconds) after it was made is not reopened at once:
#: the next backoff delay comes first, so a server (or a pg_recvlogical) that drops every
#: new connection at once is retried at a slowing pace, not in a tight loop.  (A worker sees
#: such a loss at once: the binlog socket, pg_recvlogical's pidfd.)
SHORT_LIVED = 2.0


class StopRequested(BaseException):
    """SIGTERM arrived while the worker was blocked connecting or waiting.

    A BaseException so that no ``except Exception`` in a database driver swallows it.
    """


class StopGate:
    """The worker's stop flag, and the sections in which a stop may interrupt the code."""

    def __init__(self) -> None:
        self.stopping = False
        self._blocking = 0

    def request(self, *_args) -> None:
        """The SIGTERM handler: set the flag; inside a blocking section, also break out."""
        self.stopping = True
        if self._blocking:
            self._blocking = 0          # raise once: the unwinding code must not be hit again
            raise StopRequested()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Code inside may be abandoned at any point by :class:`StopRequested`."""
        if self.stopping:
            raise StopRequested()
        self._blocking += 1
        try:
            yield
        finally:
            self._blocking = max(0, self._blocking - 1)


class Waiter:
    """The wait between two attempts at reaching the database, as one object per worker.

    ``report`` sends a message to the supervisor, ``log`` is the worker's logger.
    :meth:`wait` is called after each transient failure, :meth:`connected` once an attempt
    worked.  The backoff starts over only when the previous connection lasted longer than
    the cap: a server that accepts and then drops every connection is still retried slowly.
    """

    def __init__(self, *, maximum: float, report: Callable[..., None], log, gate: StopGate,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.backoff = Backoff(min(FIRST_DELAY, maximum), maximum)
        self.report = report
        self.log = log
        self.gate = gate
        self.clock = clock
        self.sleep = sleep
        self.since: Optional[float] = None       # time.time() when the current wait began
        self.connected_at: Optional[float] = None

    @property
    def waiting(self) -> bool:
        return self.since is not None

    def lost(self, error: BackendError, target: str) -> bool:
        """The connection broke after it had worked: the wait begins now (reported at once);
        the backoff starts over if the connection had lasted.  True when it was short-lived
        (``SHORT_LIVED``): then :meth:`wait` before the next attempt."""
        lasted = self.clock() - self.connected_at if self.connected_at is not None else None
        if lasted is not None and lasted > self.backoff.maximum:
            self.backoff.reset()
        self.connected_at = None
        self.since = time.time()
        self._report(target, error)
        return lasted is not None and lasted < SHORT_LIVED

    def connected(self) -> None:
        if self.since is not None:
            self.log.info("database reachable again; streaming resumes",
                          waited_seconds=round(time.time() - self.since, 1))
        self.since = None
        self.connected_at = self.clock()

    def heartbeat(self, target: str, error: BackendError) -> None:
        """Before a new attempt while waiting: the attempt itself may block for a while."""
        if self.since is not None:
            self._report(target, error)

    def wait(self, error: BackendError, target: str) -> bool:
        """Wait before the next attempt after ``error``; False when the worker must stop."""
        if error.fatal:
            raise error
        delay = self.backoff.next()
        if self.since is None:
            self.since = time.time()
        self.log.warning("cannot reach the database; waiting, then retrying", target=target,
                         error=str(error), retry_in=round(delay, 2))
        end = self.clock() + delay
        try:
            with self.gate.blocking():
                while True:
                    self._report(target, error)
                    remaining = end - self.clock()
                    if remaining <= 0:
                        return True
                    self.sleep(min(REPORT_EVERY, remaining))
        except StopRequested:
            return False

    def _report(self, target: str, error: BackendError) -> None:
        self.report("waiting", target=target, since=self.since, error=str(error))
