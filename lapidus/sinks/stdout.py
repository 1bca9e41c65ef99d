"""The stdout sink: line-delimited JSON, one event per line, flushed per batch.

Runs in the dispatcher process. One instance per file descriptor serves every backend that
writes there, and its lock keeps one batch's lines together. The write itself runs in a thread:
a slow reader of standard output (a pipe into a slow consumer) must hold back only what goes to
standard output, not the dispatcher's loop and with it every other sink.
A closed pipe (``lapidus --stdout | head -3``) raises :class:`OutputClosed`: Lapidus stops
cleanly, and the batch that could not be written is not confirmed, so its position is not saved.
"""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Sequence

from ..events import Record
from .base import OutputClosed, Sink


class StdoutSink(Sink):
    shared = True

    def __init__(self, options, backend):
        super().__init__(options, backend)
        self.fd = int(self.options.get("fd", 1))
        self._lock = asyncio.Lock()

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
            await asyncio.get_running_loop().run_in_executor(None, self._write_all, data)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.EBADF):
                raise OutputClosed("standard output was closed") from None
            raise
