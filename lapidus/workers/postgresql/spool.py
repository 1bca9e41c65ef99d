"""The durable spool between ``pg_recvlogical`` and the PostgreSQL worker.

Runs in the PostgreSQL worker process.  Layout of ``<state>/spool/``::

    active -> 000000000007.seg     symlink that pg_recvlogical writes through (-f .../active)
    000000000006.seg               sealed: fully written, waiting to be delivered
    000000000007.seg               being written

``pg_recvlogical`` fsyncs what it wrote before it confirms a position to the server, so the slot
only advances past changes that are on this host's disk.  Rotation points the symlink at the next
segment and sends SIGHUP: pg_recvlogical fsyncs, closes and reopens ``active``, creating the new
file.  Once the next segment exists the previous one will never grow again.  Segments entirely
before the delivered checkpoint are deleted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional, Tuple

from ...checkpoint import fsync_dir

ACTIVE = "active"
SUFFIX = ".seg"


def segment_name(number: int) -> str:
    return f"{number:012d}{SUFFIX}"


class Spool:
    """The segment files of one backend."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.active_link = self.directory / ACTIVE

    def path(self, number: int) -> Path:
        return self.directory / segment_name(number)

    def segments(self) -> List[int]:
        """Numbers of the segment files present, ascending."""
        out = []
        for entry in os.scandir(self.directory):
            name = entry.name
            if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit():
                out.append(int(name[:-len(SUFFIX)]))
        return sorted(out)

    def active_segment(self) -> int:
        """The segment pg_recvlogical writes to (the symlink's target)."""
        return int(os.readlink(self.active_link)[:-len(SUFFIX)])

    def prepare(self, first_segment: int = 1) -> None:
        """Create the directory and point ``active`` at the newest segment (or
        ``first_segment``)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        existing = self.segments()
        newest = max(existing[-1] if existing else first_segment, first_segment)
        if not self.active_link.is_symlink() or self.active_segment() != newest:
            self._point_active_at(newest)

    def rotate(self, create: bool = False) -> int:
        """Point ``active`` at the next segment; the caller then sends SIGHUP to pg_recvlogical,
        which creates the file when it reopens ``active``.  Only then is the old segment final,
        which is why the file is not created here while pg_recvlogical runs.  ``create=True``
        is for a stopped pg_recvlogical (spool full): the new file makes the reader move past the
        old segment, so that it can be deleted once delivered."""
        number = self.active_segment() + 1
        if create:
            with open(self.path(number), "ab"):
                pass
        self._point_active_at(number)
        return number

    def _point_active_at(self, number: int) -> None:
        tmp = self.directory / (ACTIVE + ".tmp")
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        os.symlink(segment_name(number), tmp)
        os.replace(tmp, self.active_link)
        fsync_dir(self.directory)

    def delete_before(self, number: int) -> int:
        """Delete segments older than ``number`` (they are delivered).  Returns how many."""
        deleted = 0
        for seg in self.segments():
            if seg >= number:
                break
            self.path(seg).unlink()
            deleted += 1
        if deleted:
            fsync_dir(self.directory)
        return deleted

    def size_bytes(self) -> int:
        total = 0
        for seg in self.segments():
            try:
                total += self.path(seg).stat().st_size
            except FileNotFoundError:
                pass
        return total

    def truncate_partial_tail(self, number: int, from_offset: int, decoder) -> Optional[int]:
        """Cut an incomplete last frame off segment ``number`` (pg_recvlogical died mid-write).

        ``from_offset`` must be a frame boundary.  The server resends the cut transaction because
        it was never fsynced and confirmed.  Returns the new size, or None if nothing was cut.
        """
        path = self.path(number)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        if size <= from_offset:
            return None
        with open(path, "rb") as f:
            f.seek(from_offset)
            data = f.read()
        _, used = decoder.split(data)
        if from_offset + used == size:
            return None
        os.truncate(path, from_offset + used)
        return from_offset + used


class SpoolReader:
    """Reads the spool's messages in order, across segment rotations.

    ``segment``/``offset`` is the position after the last message consumed; it is what the
    worker checkpoints.  Messages are decoded a run at a time (see :meth:`read_messages`)
    straight from the bytes read, which stay in one buffer until all its messages are out.
    """

    CHUNK = 4 << 20

    def __init__(self, spool: Spool, segment: int, offset: int):
        self.spool = spool
        self.segment = segment
        self.offset = offset            # end of the last message consumed
        self._read_offset = offset      # bytes of the segment read from disk so far
        self._buffer = b""              # read from the segment, from _buffer_offset on
        self._buffer_offset = offset
        self._pos = 0                   # in _buffer: the first byte not yet decoded
        self._fd: Optional[int] = None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> bool:
        if self._fd is None:
            try:
                self._fd = os.open(self.spool.path(self.segment), os.O_RDONLY)
            except FileNotFoundError:
                return False
        return True

    def read_messages(self, decoder, limit: int) -> List[Tuple[Any, int]]:
        """Up to ``limit`` complete messages available now (possibly none), each decoded and
        with the spool bytes it used: ``consumed(size)`` once it is processed."""
        while True:
            if self._pos < len(self._buffer):
                messages, self._pos = decoder.decode_run(
                    self._buffer, self._pos, limit,
                    (self.segment, self._buffer_offset))
                if messages:
                    return messages
            if not self._open():
                if not self._advance_if_sealed():
                    return []
                continue
            data = os.pread(self._fd, self.CHUNK, self._read_offset)
            if data:
                self._read_offset += len(data)
                # Keep only the incomplete tail of the old buffer (at most one message).
                rest = self._buffer[self._pos:]
                self._buffer_offset += self._pos
                self._buffer = rest + data if rest else data
                self._pos = 0
                continue
            if not self._advance_if_sealed():
                return []

    def consumed(self, size: int) -> None:
        """Mark one message returned by :meth:`read_messages` (``size`` bytes) processed."""
        self.offset += size

    def _advance_if_sealed(self) -> bool:
        """At the end of the current segment: move on when a later segment exists."""
        try:
            if self.spool.active_segment() <= self.segment:
                # ``active`` points at the newest segment (rotation moves it first): nothing
                # later can exist, and this one readlink is what the reader costs at the end of
                # every run of messages, where listing the directory cost ten times more
                return False
        except (OSError, ValueError):
            pass        # no readable link (a spool being set up): the listing decides
        later = [s for s in self.spool.segments() if s > self.segment]
        if not later:
            return False
        if self._fd is not None:
            # The next segment exists, so this one is final: read its last bytes first.
            if os.pread(self._fd, 1, self._read_offset):
                return True
        if self._pos < len(self._buffer):
            raise RuntimeError(
                f"spool segment {self.spool.path(self.segment)} ends in an incomplete frame")
        self.close()
        self.segment, self.offset, self._read_offset = later[0], 0, 0
        self._buffer, self._buffer_offset, self._pos = b"", 0, 0
        return True

    def after_truncate(self, new_size: int) -> None:
        """The current segment was cut to ``new_size``: drop buffered bytes past it (only
        an incomplete message, never one already decoded)."""
        if self._read_offset > new_size:
            self._buffer = self._buffer[:max(0, new_size - self._buffer_offset)]
            self._read_offset = new_size
