"""Skipping what a stream provably has already: no duplicate entries after a crash or a lost
connection.

Runs in the dispatcher process, inside its asyncio loop; pure (no redis-py), unit-tested.

Why: a batch whose replies did not all come back (the dispatcher was killed, the connection
dropped mid-pipeline) is sent again, whole, and the worker replays everything after its
checkpoint; the head of it may already be in the streams.  Redis has no idempotent ``XADD``, so
at start and after every failure the sink reads, for each stream it is about to write, the
newest entry of its own backend (:data:`SCAN_BACK` entries at most) and skips, per stream, the
records up to that one:

* the record whose ``id`` is that entry's: skipped, and so is everything before it in the batch
  (one connection, one writer per backend, a pipeline executed in order: what a stream holds of
  this backend is a prefix of the backend's order);
* a record that comes *before* it in the backend's order although the entry is not in this batch
  (the checkpoint lagged behind what was delivered): skipped only when the two positions can be
  compared for sure (:func:`compare`: PostgreSQL LSNs; MariaDB GTIDs of one domain; MySQL GTIDs
  of one server uuid; binlog ``file:pos`` of one file name; the index inside a transaction from
  the event id);
* the first record that is not provably before it ends the skipping for that stream.

What cannot be proved is sent (at-least-once): a consumer drops repeats by the ``id`` field.
Positions are taken to grow along a backend's history; after an operator resets it (RESET
MASTER, a new PostgreSQL cluster under the same backend name), start a new stream.
"""

from __future__ import annotations

import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ...events import Record

#: entries read back per stream at most, looking for this backend's newest one
SCAN_BACK = 32

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_MARIADB_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_MYSQL_GTID = re.compile(r"^([0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-"
                         r"[0-9A-Fa-f]{12}):(\d+)$")
_BINLOG = re.compile(r"^(.+)\.(\d+):(\d+)$")


def order_key(position: Optional[str]) -> Optional[Tuple[tuple, tuple]]:
    """``(family, value)``: two positions compare by ``value`` when their families are equal;
    None for a position of unknown form (a MongoDB resume token, say)."""
    if not position:
        return None
    m = _LSN.match(position)
    if m:
        return ("lsn",), (int(m.group(1), 16) << 32 | int(m.group(2), 16),)
    m = _MARIADB_GTID.match(position)
    if m:
        return ("mariadb", int(m.group(1))), (int(m.group(3)),)
    m = _MYSQL_GTID.match(position)
    if m:
        return ("mysql", m.group(1).lower()), (int(m.group(2)),)
    m = _BINLOG.match(position)
    if m:
        return ("binlog", m.group(1), len(m.group(2))), (int(m.group(2)), int(m.group(3)))
    return None


def index_in_transaction(event_id: str, backend: str, position: str) -> Optional[int]:
    """The ``n`` of an id ``<backend>:<position>:<n>``; None for other ids (snapshot reads)."""
    head = f"{backend}:{position}:"
    if event_id.startswith(head):
        tail = event_id[len(head):]
        if tail.isdigit():
            return int(tail)
    return None


def compare(a: "Mark", b: "Mark", backend: str) -> Optional[int]:
    """-1, 0 or 1 as ``a`` comes before, is, or comes after ``b`` in the backend's order;
    None when that cannot be known for sure."""
    if a.id == b.id:
        return 0
    ka, kb = order_key(a.position), order_key(b.position)
    if ka is None or kb is None or ka[0] != kb[0]:
        return None
    if ka[1] != kb[1]:
        return -1 if ka[1] < kb[1] else 1
    ia = index_in_transaction(a.id, backend, a.position)
    ib = index_in_transaction(b.id, backend, b.position)
    if ia is None or ib is None or ia == ib:
        return None
    return -1 if ia < ib else 1


class Mark(NamedTuple):
    id: str
    position: Optional[str]


class Skipper:
    """Per stream: the newest entry of this backend, read since the last failure, until the
    first record past it."""

    def __init__(self, backend: str):
        self.backend = backend
        #: stream -> its newest entry still to pass (None: nothing to skip); a stream missing
        #: here is unknown: read it before writing to it
        self.marks: Dict[str, Optional[Mark]] = {}
        self.skipped = 0

    def unknown(self, streams) -> List[str]:
        return sorted(set(streams) - self.marks.keys())

    def learn(self, stream: str, mark: Optional[Mark]) -> None:
        self.marks[stream] = mark

    def forget(self) -> None:
        """After a failure nothing is known of what the streams took: read them again."""
        self.marks.clear()

    def keep(self, streams: Sequence[str], records: Sequence[Record]) -> List[int]:
        """The indices of the records to write (``streams[i]`` is record ``i``'s stream)."""
        marks = self.marks
        if not any(marks.get(s) for s in set(streams)):
            return list(range(len(records)))
        # where each pending mark is in this batch, if it is
        found: Dict[str, int] = {}
        for index, (stream, record) in enumerate(zip(streams, records)):
            mark = marks.get(stream)
            if mark is not None and record.id == mark.id:
                found[stream] = index
        out = []
        for index, (stream, record) in enumerate(zip(streams, records)):
            mark = marks.get(stream)
            if mark is None:
                out.append(index)
                continue
            at = found.get(stream)
            if at is not None:
                if index <= at:
                    self.skipped += 1
                    if index == at:
                        marks[stream] = None
                    continue
            elif compare(Mark(record.id, record.position), mark, self.backend) == -1:
                self.skipped += 1
                continue
            marks[stream] = None
            out.append(index)
        return out


def newest_of(backend: str, entries) -> Optional[Mark]:
    """This backend's newest entry among ``entries`` (XREVRANGE's reply: newest first, each
    ``(entry id, {field: value})`` with bytes), or None."""
    import orjson

    head = f"{backend}:".encode()
    for _, fields in entries or ():
        event_id = fields.get(b"id")
        if event_id is None or not event_id.startswith(head):
            continue
        position = None
        try:
            position = orjson.loads(fields.get(b"event") or b"{}").get("position")
        except (orjson.JSONDecodeError, AttributeError):
            pass
        return Mark(event_id.decode("utf-8", "replace"), position)
    return None
