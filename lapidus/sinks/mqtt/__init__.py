"""The mqtt sink: every event as one MQTT message on ``<topic_prefix>/schema/table/key``.

Runs in the dispatcher process, inside its asyncio loop; one instance, hence one connection,
per backend (``shared = False``).  Contract (lapidus.sinks.base.Sink): :meth:`MqttSink.send`
returns only when every message of the batch is confirmed: QoS 1 (default) by the broker's
PUBACK on the connection it was sent on; ``qos = 0`` once written (at most once).  While the
broker is unreachable ``send`` waits and the connection is retried for ever; nothing is
dropped, and what was unconfirmed when a connection dropped is sent again, in order.  A
connection that confirms nothing for ``ack_timeout`` seconds is dropped on purpose (see
:mod:`.publisher`).

The payload is the event's EVENTS.md JSON; MQTT 5 (when the broker speaks it) adds user
properties ``Lapidus-Id`` (the event id, for dropping repeats), ``Lapidus-Backend``,
``Lapidus-Type`` and ``Lapidus-Position``.  Modules: ``options`` (validation, no aiomqtt
import), ``topics`` (records -> topics, reversible), ``connection`` (aiomqtt client,
reconnection, health), ``publisher`` (windowed QoS 1 publishing and PUBACK reason codes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence

from ... import logs
from ...events import Record
from ..base import Sink, UndeliverableError
from .options import MqttOptions, validate
from .topics import TopicBuilder

if TYPE_CHECKING:        # aiomqtt is imported lazily: validation must work without it
    from .connection import Connection
    from .publisher import Publisher

REFUSED_FIX = ("allow the topic for this user in the broker's ACL (or raise its "
               "message_size_limit), or change topic_prefix; or set on_undeliverable = "
               "\"dead_letter\" to move the event aside and stream on")


class MqttSink(Sink):
    shared = False
    merge_batches = True       # one PUBACK tail per merged delivery

    def __init__(self, options: Mapping[str, Any], backend: str):
        super().__init__(options, backend)
        self.settings = MqttOptions.parse(options)
        self.log = logs.get_logger(backend=backend, sink="mqtt")
        self.topics = TopicBuilder(self.settings.topic_prefix)
        self.connection: Optional["Connection"] = None
        self.publisher: Optional["Publisher"] = None

    @classmethod
    def validate(cls, options: Mapping[str, Any]) -> list:
        return validate(options)

    async def start(self) -> None:
        """Start connecting in the background; returns at once (the broker may be down)."""
        from .connection import Connection
        from .publisher import Publisher
        if self.connection is not None:
            return
        self.connection = Connection(self.settings, self.backend, self.log)
        self.publisher = Publisher(self.connection, self.backend, self.settings.qos,
                                   self.settings.max_inflight, self.log,
                                   self.settings.ack_timeout)
        self.connection.start()

    async def send(self, records: Sequence[Record]) -> None:
        from .publisher import Refused, messages_of
        if self.connection is None:
            await self.start()
        try:
            await self.publisher.publish(messages_of(records, self.topics.topic))
        except Refused as refused:
            record = records[refused.index]
            where = ("of table " + ".".join(p for p in (record.schema, record.table) if p)
                     if record.table else f"({record.type}, no table)")
            raise UndeliverableError(
                refused.index, f"event {record.id} {where} ({len(record.data)} bytes of "
                               f"JSON): the broker refused it on topic \"{refused.topic}\" "
                               f"({refused.reason})", REFUSED_FIX) from None

    def health(self) -> Optional[Dict[str, Any]]:
        if self.connection is None:
            return {"connected": False, "down_seconds": None,
                    "server": self.settings.target, "last_error": None}
        return self.connection.health()

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()


__all__ = ("MqttSink", "MqttOptions", "validate")
