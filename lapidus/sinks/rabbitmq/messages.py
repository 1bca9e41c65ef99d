"""Records -> AMQP messages: routing key, body and properties.

Runs in the dispatcher process, inside its asyncio loop, once per batch.  Imports pamqp's
property class lazily (it comes with aiormq), so the module itself loads without it.

* routing key: the event's subject as in docs/events.md (``schema.table.key``, each value one
  escaped token; ``_message.<prefix>`` and ``_<type>.<schema>`` for events without a table), so
  topic bindings such as ``public.orders.#`` or ``*.*.42`` work as NATS wildcards would;
* persistent (``delivery_mode = 2``), ``content_type = application/json``, ``message_id`` = the
  event id (consumers drop repeats by it), ``type`` = the event type;
* headers as the nats sink's (without ``Nats-Msg-Id``, which ``message_id`` carries):
  ``Lapidus-Backend``, ``Lapidus-Type``, ``Lapidus-Position``.
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Sequence

from ...events import Record
from ..subjects import SubjectBuilder
from .options import MAX_SHORTSTR


class Message(NamedTuple):
    routing_key: str
    body: bytes
    properties: Any        # pamqp.commands.Basic.Properties
    record: int            # the index of its record in the batch given to build()


class TooLong(Exception):
    """A routing key over AMQP's 255 bytes: the broker cannot take the message at all."""

    def __init__(self, message_index: int, routing_key: str):
        super().__init__(routing_key)
        self.index = message_index
        self.routing_key = routing_key


class MessageBuilder:
    def __init__(self, backend: str):
        from pamqp.commands import Basic

        self.backend = backend
        self.subjects = SubjectBuilder(backend)
        self.properties = Basic.Properties

    def build(self, records: Sequence[Record]) -> List[Message]:
        subject_of, properties, backend = self.subjects.subject, self.properties, self.backend
        out = []
        for index, record in enumerate(records):
            routing_key = subject_of(record)
            if len(routing_key) > MAX_SHORTSTR // 4 and len(routing_key.encode()) > MAX_SHORTSTR:
                raise TooLong(index, routing_key)
            out.append(Message(routing_key, record.data, properties(
                content_type="application/json", delivery_mode=2, message_id=record.id,
                message_type=record.type,
                headers={"Lapidus-Backend": backend, "Lapidus-Type": record.type,
                         "Lapidus-Position": record.position}), index))
        return out
