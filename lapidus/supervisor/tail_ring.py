"""The last events of the backends the status page watches: the dispatcher's side of its tail.

Runs in the dispatcher process.  Events pass through the dispatcher, not the supervisor, so the
supervisor asks for them: it sends ``("watch", [backend, ...])`` over the dispatcher's status
pipe while a page shows a backend's tail, again every few seconds (a watch lapses
``WATCH_LAPSES`` seconds after the last one, so a page closed, a supervisor gone or a
dispatcher restarted leaves nothing behind).  Only a watched backend's pipeline has a
:class:`TailRing`; it keeps references to the last ``KEEP`` records it delivered.  An unwatched
pipeline pays one ``is None`` test per batch and keeps nothing.

:class:`TailWatch` sends what is new in the rings as ``("tail", {"backend", "events"})`` a few
times a second; an event larger than ``MAX_EVENT_BYTES`` goes as a stub naming its size.
"""

from __future__ import annotations

import collections
import time
from typing import Deque, Dict, Iterable, List, Optional, Tuple

from ..events import Record

KEEP = 20                    # events kept per watched backend
MAX_EVENT_BYTES = 16 << 10   # larger events are sent as a stub
WATCH_LAPSES = 6.0           # seconds after the last watch request


class TailRing:
    """The last ``keep`` records a pipeline delivered, numbered from 1 (``serial`` is the
    number of the newest)."""

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self.records: Deque[Record] = collections.deque(maxlen=keep)
        self.serial = 0

    def add(self, records: List[Record]) -> None:
        """A delivered batch (called once per batch, only while watched)."""
        self.serial += len(records)
        self.records.extend(records[-self.keep:])

    def since(self, serial: int) -> List[Tuple[int, bytes]]:
        """``(serial, event JSON)`` of the kept records newer than ``serial``, oldest first."""
        newest = self.serial
        kept = list(self.records)
        first = newest - len(kept) + 1
        return [(first + i, _payload(r)) for i, r in enumerate(kept) if first + i > serial]


def _payload(record: Record) -> bytes:
    if len(record.data) <= MAX_EVENT_BYTES:
        return record.data
    import orjson
    return orjson.dumps({"id": record.id, "type": record.type, "schema": record.schema,
                         "table": record.table, "position": record.position,
                         "too_large_to_show": len(record.data)})


class TailWatch:
    """Which backends are watched, until when; and how far each was sent."""

    def __init__(self):
        self.until: Dict[str, float] = {}
        self.sent: Dict[str, int] = {}

    def idle(self, pipelines: dict) -> bool:
        """No backend is watched and no pipeline keeps a ring: nothing to do until a watch
        request arrives."""
        return not self.until and all(p.tail is None for p in pipelines.values())

    def watch(self, backends: Iterable[str], now: Optional[float] = None) -> None:
        """A watch request: these backends for another ``WATCH_LAPSES`` seconds; the ones not
        named are no longer watched."""
        now = time.monotonic() if now is None else now
        self.until = {name: now + WATCH_LAPSES for name in backends}

    def apply(self, pipelines: dict, now: Optional[float] = None,
              send: bool = True) -> List[Tuple[str, list]]:
        """Give watched pipelines a ring, take it from the others; return
        ``[(backend, new events)]`` for the rings that have something not sent yet (nothing,
        and nothing counted as sent, with ``send=False``)."""
        now = time.monotonic() if now is None else now
        self.until = {name: t for name, t in self.until.items() if t > now}
        out: List[Tuple[str, list]] = []
        for name, pipeline in pipelines.items():
            if name not in self.until:
                pipeline.tail = None
                self.sent.pop(name, None)
                continue
            if pipeline.tail is None:
                pipeline.tail = TailRing()
                self.sent[name] = 0
            ring = pipeline.tail
            if ring.serial < self.sent.get(name, 0):
                self.sent[name] = 0   # a new pipeline (the sinks changed) counts anew
            if send and ring.serial > self.sent.get(name, 0):
                out.append((name, ring.since(self.sent.get(name, 0))))
                self.sent[name] = ring.serial
        return out
