"""The worker's wake-up pipe: a signal ends an idle wait at once.

Runs in a worker process.  An idle worker sleeps inside its source's wait (inotify on the
spool, the binlog socket) until its next status report is due, which may be many seconds
away.  What else needs the worker arrives as a signal: SIGTERM (stop) and ``WAKE_SIGNAL``
(the supervisor queued or cancelled a backfill, ``lapidusctl backfill``).  Python's wake-up
fd (:func:`signal.set_wakeup_fd`) writes a byte into this pipe for every signal that has a
Python handler; a source watches the read end (``Source.wake_fd``) in its wait and returns
when it becomes readable, and the worker loop empties it (:meth:`Wakeup.drain`) before it
looks at what is due.  A byte written after the drain makes the next wait return at once,
so no wake-up is lost.
"""

from __future__ import annotations

import os
import signal

#: what the supervisor sends a RUNNING worker to make it look at its backfill requests now
WAKE_SIGNAL = signal.SIGUSR1


def _ignore(_signum, _frame) -> None:
    """The handler of ``WAKE_SIGNAL``: the byte in the pipe is the whole message."""


class Wakeup:
    """One pipe per worker process; :meth:`install` once, after the worker's SIGTERM handler."""

    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def install(self) -> None:
        """Route signals into the pipe (the worker's own: the one inherited from the
        supervisor at fork would wake the supervisor instead) and handle ``WAKE_SIGNAL``
        (its default action would end the process)."""
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        signal.signal(WAKE_SIGNAL, _ignore)

    def drain(self) -> bool:
        """Empty the pipe; True when a signal had arrived since the last drain."""
        # one read: a byte per signal, and more than 4,096 signals between two drains only
        # leave some for the next one, which then returns at once
        try:
            return bool(os.read(self.fd, 4096))
        except BlockingIOError:
            return False
