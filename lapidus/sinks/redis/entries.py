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
    args: tuple        # XADD's arguments after the key: [MAXLEN ~ n] * field value ...
    record: int        # the index of its record in the batch given to build()


class EntryBuilder:
    def __init__(self, backend: str, template: str, maxlen: Optional[int] = None):
        self.backend = backend
        self.template = template
        self.subjects = SubjectBuilder(backend)
        # MAXLEN ~ lets Redis trim whole macro nodes only: almost free, unlike an exact MAXLEN
        self.head: tuple = ("MAXLEN", "~", maxlen, "*") if maxlen else ("*",)
        self._streams: Dict[Tuple[Optional[str], Optional[str]], str] = {}

    def stream_of(self, record: Record) -> str:
        names = (record.schema, record.table)
        stream = self._streams.get(names)
        if stream is None:
            stream = self._streams[names] = self.template.format(
                backend=self.backend, schema=record.schema or MISSING,
                table=record.table or MISSING)
        return stream

    def build(self, records: Sequence[Record]) -> List[Entry]:
        subject, stream_of, head = self.subjects.subject, self.stream_of, self.head
        return [Entry(stream_of(record),
                      head + ("id", record.id, "type", record.type, "subject", subject(record),
                              "event", record.data), index)
                for index, record in enumerate(records)]
