"""The stdout sink: line-delimited JSON, one event per line, flushed per batch.

Runs in the dispatcher process. One instance per file descriptor serves every backend that
writes there, and its lock keeps one batch's lines together. The write itself runs in a thread:
a slow reader of standard output (a pipe into a slow consumer) must hold back only what goes to
standard output, not the dispatcher's loop and with it every other sink.  A small batch that
fits the room the descriptor has now (the usual one-transaction batch) is written in the loop
itself: such a write cannot block, and a thread's hand-off costs more than the write.
A closed pipe (``lapidus --stdout | head -3``) raises :class:`OutputClosed`: Lapidus stops
cleanly, and the batch that could not be written is not confirmed, so its position is not saved.

Whole lines: when the descriptor is a pipe (or FIFO), a batch is written in pieces of whole
lines of at most ``PIPE_BUF`` bytes each.  POSIX makes such a write to a pipe atomic: the
reader gets all of it or none, so a dispatcher killed in the middle of a batch (SIGKILL, the
OOM killer) leaves only whole lines in the pipe, and the next dispatcher's first line starts a
line of its own.  A single line longer than ``PIPE_BUF`` cannot be written atomically; it goes
in one ``write()`` of its own and a kill during it can leave its head in the pipe (documented
in docs/sinks.md).  Files, terminals and sockets keep one large write per batch: a file holds
what was written whatever the writer's fate, and their writes have no such atomicity to use.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import stat
from typing import Iterator, Sequence, Tuple

from ..events import Record
from .base import OutputClosed, Sink

#: POSIX's atomic pipe write size (4096 on Linux); os.pathconf would ask the kernel per fd,
#: but every Linux pipe has this value.
PIPE_BUF = getattr(select, "PIPE_BUF", 4096)


def is_pipe(fd: int) -> bool:
    """Whether ``fd`` is a pipe or FIFO (False for a closed descriptor: writing will say so)."""
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def polls_room_for_a_line_run(fd: int) -> bool:
    """Whether poll's "writable" on ``fd`` guarantees that a write of at most ``PIPE_BUF``
    bytes does not block: true of a pipe (writable means a free page buffer), a regular file
    and /dev/null; not of a terminal or a socket, whose room can be smaller."""
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISREG(st.st_mode):
        return True
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)    # /dev/null


def line_pieces(data: bytes, limit: int) -> Iterator[Tuple[int, int]]:
    """``(start, end)`` offsets that cut ``data`` (lines, each ending with a newline) into
    runs of whole lines of at most ``limit`` bytes; a line longer than ``limit`` is a run of
    its own."""
    size = len(data)
    start = 0
    while start < size:
        end = start + limit
        if end >= size:
            yield start, size
            return
        # the last newline inside the limit ends the piece
        cut = data.rfind(b"\n", start, end) + 1
        if cut <= start:
            # one line longer than the limit: the whole of it, alone
            cut = data.find(b"\n", start) + 1 or size
        yield start, cut
        start = cut


class StdoutSink(Sink):
    shared = True

    def __init__(self, options, backend):
        super().__init__(options, backend)
        self.fd = int(self.options.get("fd", 1))
        self._lock = asyncio.Lock()
        # Checked once: what a descriptor refers to does not change under a running process.
        self.piece_limit = PIPE_BUF if is_pipe(self.fd) else 0
        self.inline_when_room = polls_room_for_a_line_run(self.fd)

    @classmethod
    def share_key(cls, options):
        """One instance, and so one lock, per file descriptor."""
        return str(int(options.get("fd", 1)))

    @classmethod
    def validate(cls, options):
        unknown = set(options) - {"fd"}
        return [(key, "unknown option for the stdout plugin") for key in sorted(unknown)]

    async def send(self, records: Sequence[Record]) -> None:
        data = b"\n".join([r.data for r in records]) + b"\n"
        async with self._lock:
            if len(data) <= PIPE_BUF and self.inline_when_room and self._has_room():
                self._write(data)
            else:
                await asyncio.get_running_loop().run_in_executor(None, self._write, data)

    def _has_room(self) -> bool:
        """Whether a write of at most PIPE_BUF bytes cannot block now (poll says writable;
        see :func:`polls_room_for_a_line_run` for which descriptors that holds of)."""
        try:
            _, writable, _ = select.select([], [self.fd], [], 0)
        except (OSError, ValueError):
            return False        # the thread's write reports it
        return bool(writable)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            if not self.piece_limit:
                self._write_all(view)
                return
            for start, end in line_pieces(data, self.piece_limit):
                self._write_all(view[start:end])
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.EBADF):
                raise OutputClosed("standard output was closed") from None
            raise

    def _write_all(self, view: memoryview) -> None:
        # A blocking write of at most PIPE_BUF bytes to a pipe writes all or nothing; the loop
        # is for longer pieces (files, and a single line over PIPE_BUF).
        while view:
            try:
                written = os.write(self.fd, view)
            except BlockingIOError:
                # Someone sharing the descriptor made it non-blocking: wait for room.  (A
                # non-blocking write of at most PIPE_BUF is still all or nothing.)
                select.select([], [self.fd], [])
                continue
            view = view[written:]
