"""Wait until a directory's files change, without polling (Linux inotify through ctypes).

Runs in the PostgreSQL worker process: the spool reader sleeps here until pg_recvlogical writes,
so an idle worker costs no CPU and a new change is read within a millisecond.  The same wait
also ends when one of a few other file descriptors becomes readable (the worker's wake-up
pipe, a pidfd of pg_recvlogical).  Where inotify is not available the wait degrades to a short
sleep.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
from typing import List, Sequence

IN_MODIFY = 0x00000002
IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000


class DirectoryWatch:
    """``wait(timeout)`` returns when a file in ``directory`` was written or created."""

    def __init__(self, directory: str):
        self._fd = -1
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd >= 0 and libc.inotify_add_watch(
                    fd, os.fsencode(directory), IN_MODIFY | IN_CREATE | IN_MOVED_TO) >= 0:
                self._fd = fd
            elif fd >= 0:
                os.close(fd)
        except (OSError, AttributeError):
            self._fd = -1

    @property
    def watching(self) -> bool:
        """False where inotify is not available (the wait is then a short sleep)."""
        return self._fd >= 0

    def wait(self, timeout: float, others: Sequence[int] = ()) -> List[int]:
        """Sleep until a file changed, one of ``others`` is readable or ``timeout`` passed;
        returns the readable ones of ``others`` (left as they are, for their owners)."""
        if self._fd < 0:
            ready, _, _ = select.select(others, [], [], min(timeout, 0.005))
            return ready
        ready, _, _ = select.select([self._fd, *others], [], [], timeout)
        if self._fd in ready:
            self.drain()
            ready.remove(self._fd)
        return ready

    def drain(self) -> None:
        """Forget pending notifications (called before re-reading the files)."""
        if self._fd < 0:
            return
        # One read takes every queued notification that fits (about 2,000): a notification
        # that arrives after it only ends the next wait early, which reads the files again.
        try:
            os.read(self._fd, 65536)
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
