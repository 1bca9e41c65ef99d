"""Records -> Redis stream entries: the stream key and the ``XADD`` arguments of each event.

Runs in the dispatcher process, inside its asyncio loop, once per batch; no redis-py import, so
it is unit-tested without a server.

Each event is one entry with the fields ``id`` (the event id), ``type``, ``subject`` (the event's
NATS subject as in docs/events.md, ``schema.table.key`` with its escaping: consumers can route
on it without parsing the JSON) and ``event`` (the event's JSON).  The stream key is the
``stream`` template with ``{backend}``, ``{schema}`` and ``{table}`` as they are (a Redis key
can hold any byte); ``_`` stands in for a missing schema or table (PostgreSQL logical
messages, database-level schema events, gap events).
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ...events import Record
from ..subjects import SubjectBuilder

MISSING = "_"


class Entry(NamedTuple):
    stream: str
    command: bytes     # the whole XADD in the protocol's form (RESP), ready to be written
    record: int        # the index of its record in the batch given to build()


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class EntryBuilder:
    def __init__(self, backend: str, template: str, maxlen: Optional[int] = None):
        self.backend = backend
        self.template = template
        self.subjects = SubjectBuilder(backend)
        # MAXLEN ~ lets Redis trim whole macro nodes only: almost free, unlike an exact MAXLEN
        self.options: tuple = (b"MAXLEN", b"~", str(maxlen).encode(), b"*") if maxlen else (b"*",)
        self._streams: Dict[Tuple[Optional[str], Optional[str]], str] = {}
        self._heads: Dict[str, bytes] = {}

    def stream_of(self, record: Record) -> str:
        names = (record.schema, record.table)
        stream = self._streams.get(names)
        if stream is None:
            stream = self._streams[names] = self.template.format(
                backend=self.backend, schema=record.schema or MISSING,
                table=record.table or MISSING)
        return stream

    def head(self, stream: str) -> bytes:
        """The command up to the first field's value: the same for every entry of a stream."""
        head = self._heads.get(stream)
        if head is None:
            parts = (b"XADD", stream.encode(), *self.options)
            count = len(parts) + 8           # four fields, each a name and a value
            head = self._heads[stream] = (b"*%d\r\n" % count + b"".join(map(bulk, parts))
                                          + bulk(b"id"))
        return head

    def build(self, records: Sequence[Record]) -> List[Entry]:
        """The entries of one batch, in record order.  The protocol bytes are built here, one
        join per entry, rather than by redis-py's general packer: that packer was most of
        the sink's CPU time (about 90 us of 120 per event on the development host)."""
        subject_of, stream_of, head_of = self.subjects.subject, self.stream_of, self.head
        out = []
        for index, record in enumerate(records):
            stream = stream_of(record)
            event_id = record.id.encode()
            kind = record.type.encode()
            subject = subject_of(record).encode()
            data = record.data
            out.append(Entry(stream, b"".join((
                head_of(stream), b"$%d\r\n" % len(event_id), event_id,
                b"\r\n$4\r\ntype\r\n$%d\r\n" % len(kind), kind,
                b"\r\n$7\r\nsubject\r\n$%d\r\n" % len(subject), subject,
                b"\r\n$5\r\nevent\r\n$%d\r\n" % len(data), data, b"\r\n")), index))
        return out
