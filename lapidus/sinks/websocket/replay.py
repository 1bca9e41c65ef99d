"""The replay window of one backend: its recent events as ready websocket frames.

Runs in the dispatcher process, inside its asyncio loop (no locking: one thread).  Every event
gets a sequence number, counting from 0 in this dispatcher process; a client's place in the
stream is such a number (its cursor), so a client that resumes with ``after=<id>`` continues at
the number after that id's, and one that falls behind reads from here instead of holding a
queue of its own.  Bounded by ``replay_events`` and ``replay_bytes``: the oldest go first.

Each event is kept as its whole websocket frame (a text frame, unmasked as a server sends it),
encoded once for every client.  An id already here is a replay (the worker restarted and sent
again from its checkpoint) and is not added again: clients never see it twice.
"""

from __future__ import annotations

import struct
from typing import Dict, List, Optional, Tuple

#: (subject, frame): one kept event
Entry = Tuple[str, bytes]

_SHORT = struct.Struct("!BB")
_MEDIUM = struct.Struct("!BBH")
_LONG = struct.Struct("!BBQ")
_FIN_TEXT = 0x81


def text_frame(payload: bytes) -> bytes:
    """A final, unmasked text frame carrying ``payload`` (RFC 6455 5.2)."""
    size = len(payload)
    if size < 126:
        return _SHORT.pack(_FIN_TEXT, size) + payload
    if size < 1 << 16:
        return _MEDIUM.pack(_FIN_TEXT, 126, size) + payload
    return _LONG.pack(_FIN_TEXT, 127, size) + payload


class ReplayBuffer:
    def __init__(self, max_events: int, max_bytes: int):
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._entries: List[Entry] = []
        self._ids: List[str] = []
        self._skip = 0               # entries at the front of the lists already evicted
        self.base = 0                # the sequence number of the oldest kept event
        self.head = 0                # the sequence number the next event gets
        self.bytes = 0
        self._seq: Dict[str, int] = {}
        self.evicted = 0             # events dropped from the window so far

    def __len__(self) -> int:
        return self.head - self.base

    def add(self, event_id: str, subject: str, frame: bytes) -> bool:
        """Keep one event; False (and nothing kept) when its id is already here."""
        if event_id in self._seq:
            return False
        self._seq[event_id] = self.head
        self._entries.append((subject, frame))
        self._ids.append(event_id)
        self.head += 1
        self.bytes += len(frame)
        return True

    def trim(self) -> None:
        """Drop the oldest events beyond the bounds (called once per batch)."""
        entries, ids = self._entries, self._ids
        while self.head - self.base > self.max_events or (
                self.bytes > self.max_bytes and self.head - self.base > 1):
            index = self._skip
            self.bytes -= len(entries[index][1])
            del self._seq[ids[index]]
            self._skip += 1
            self.base += 1
            self.evicted += 1
        if self._skip > 4096 and self._skip * 2 > len(entries):
            # compact now and then: amortised O(1) per event, random access stays O(1)
            del entries[:self._skip]
            del ids[:self._skip]
            self._skip = 0

    def after(self, event_id: str) -> Optional[int]:
        """The sequence number following ``event_id``'s, or None when it is not kept."""
        seq = self._seq.get(event_id)
        return None if seq is None else seq + 1

    def entries(self, start: int, end: int) -> List[Entry]:
        """The kept events with sequence numbers ``start`` <= n < ``end`` (``start`` >= base)."""
        offset = self._skip - self.base
        return self._entries[start + offset:end + offset]

    def oldest_id(self) -> Optional[str]:
        return self._ids[self._skip] if self.head > self.base else None

    def newest_id(self) -> Optional[str]:
        return self._ids[-1] if self.head > self.base else None
