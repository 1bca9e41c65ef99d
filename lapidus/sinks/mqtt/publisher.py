"""Publishing one delivery over MQTT and confirming it message by message.

Runs in the dispatcher process, inside its asyncio loop.  Contract: :meth:`Publisher.publish`
returns once every message was confirmed on the connection it was sent on: QoS 1 by the
broker's PUBACK (with a success reason code, MQTT 5); QoS 0 once paho wrote it to the socket
(at most once: nothing confirms it arrived).  At most ``window`` messages await their PUBACK
at a time, and never more than the broker's Receive Maximum.

When the connection drops, the messages from the first unconfirmed one to the end are sent
again, in order, on the next connection: a consumer sees a key's changes in commit order, some
possibly twice (same ``Lapidus-Id``).  A connection on which no PUBACK comes for
``ack_timeout`` seconds while messages await one is dropped (the broker holds the TCP
connection but confirms nothing: stuck, or a proxy that lost its other side), with the same
resending on the next one; without it such a broker would hold the backend silently for
ever.  A PUBACK with a failure reason code (MQTT 5: not
authorized, packet too large, quota exceeded ...) refuses that message for good:
:class:`Refused` names its index, and the sink turns it into UndeliverableError.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Deque, Dict, List, NamedTuple, Sequence, Tuple

import paho.mqtt.client as paho

from ...events import Record
from .connection import Connection, Link
from .properties import PropertiesBuilder


class Message(NamedTuple):
    topic: str
    record: Record
    index: int              # in the records given to the sink's send()


class Refused(Exception):
    def __init__(self, index: int, topic: str, reason: str):
        super().__init__(reason)
        self.index = index
        self.topic = topic
        self.reason = reason


class Publisher:
    def __init__(self, connection: Connection, backend: str, qos: int, window: int, log: Any,
                 ack_timeout: float = 30.0):
        self.connection = connection
        self.backend = backend
        self.qos = qos
        self.window = window
        self.ack_timeout = ack_timeout
        self.log = log
        self._waiting: Dict[int, "asyncio.Future[Any]"] = {}    # paho mid -> its future
        self.properties = PropertiesBuilder(backend)
        connection.on_publish = self._on_publish

    def _on_publish(self, mid: int, reason_code: Any) -> None:
        future = self._waiting.pop(mid, None)
        if future is not None and not future.done():
            future.set_result(reason_code)

    async def publish(self, messages: Sequence[Message]) -> None:
        start = 0
        while start < len(messages):
            link = await self.connection.wait_ready()
            start = await self._on_link(link, messages, start)

    async def _on_link(self, link: Link, messages: Sequence[Message], start: int) -> int:
        """Publish ``messages[start:]`` on ``link``; the index below which all are confirmed
        (``len(messages)`` unless the link was lost)."""
        loop = asyncio.get_running_loop()
        client, lost = link.paho, link.lost
        self._waiting.clear()          # futures of an earlier link never complete
        window = max(1, min(self.window, self.connection.receive_maximum))
        qos, version5 = self.qos, link.version5
        properties_of = self.properties.build
        publish, success = client.publish, paho.MQTT_ERR_SUCCESS
        pending: Deque[Tuple[int, "asyncio.Future[Any]"]] = collections.deque()
        confirmed = start
        position = start
        total = len(messages)
        while position < total or pending:
            while position < total and len(pending) < window:
                topic, record, _ = messages[position]
                properties = (properties_of(record.id, record.type, record.position)
                              if version5 else None)
                info = publish(topic, record.data, qos, False, properties)
                if info.rc != success:
                    return confirmed          # not connected any more
                future = loop.create_future()
                if info.is_published():
                    future.set_result(None)
                else:
                    self._waiting[info.mid] = future
                pending.append((position, future))
                position += 1
            index, future = pending[0]
            if not future.done():
                # the oldest unconfirmed message: each PUBACK restarts the clock
                await asyncio.wait((future, lost), timeout=self.ack_timeout,
                                   return_when=asyncio.FIRST_COMPLETED)
                if not future.done():
                    if not lost.done():
                        self.connection.drop(link, f"no PUBACK within {self.ack_timeout:g} s "
                                                   f"({len(pending)} publishes waiting); "
                                                   f"connection dropped, sending them again")
                    return confirmed          # lost before its PUBACK: resend from here
            pending.popleft()
            reason = future.result()
            if reason is not None and getattr(reason, "is_failure", False):
                message = messages[index]
                raise Refused(message.index, message.topic, str(reason))
            confirmed = index + 1
        return confirmed


def messages_of(records: Sequence[Record], topic_of) -> List[Message]:
    return [Message(topic_of(record), record, index) for index, record in enumerate(records)]
