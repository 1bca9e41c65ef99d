"""The mqtt sink's PUBACK timeout, against a fake broker socket: a broker that accepts the
connection and the publishes but never acknowledges them must not hold the backend silently.

The fake broker is an asyncio TCP server speaking just enough MQTT 3.1.1 (CONNACK, PUBACK,
PINGRESP).  Its first connection takes everything and confirms nothing; the next ones confirm
every publish.  The normal path against a real Mosquitto is in
tests/integration/test_mqtt_sink.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import List, Optional

from lapidus.events import Record
from lapidus.sinks.mqtt import MqttSink

CONNECT, PUBLISH, PINGREQ, DISCONNECT = 1, 3, 12, 14


class FakeConnection:
    def __init__(self, acknowledges: bool):
        self.acknowledges = acknowledges
        self.published: List[tuple] = []      # (topic, payload)
        self.connected = asyncio.Event()      # CONNECT received
        self.closed = asyncio.Event()         # EOF from the client
        self.release = asyncio.Event()        # CONNACK only once the test allows it


class FakeBroker:
    """Accepts MQTT 3.1.1 clients; the first connection never sends a PUBACK."""

    def __init__(self) -> None:
        self.connections: List[FakeConnection] = []
        self.server: Optional[asyncio.AbstractServer] = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = FakeConnection(acknowledges=bool(self.connections))
        if not self.connections:
            conn.release.set()
        self.connections.append(conn)
        try:
            while True:
                first = await reader.readexactly(1)
                length, shift = 0, 0
                while True:                                   # remaining length, varint
                    byte = (await reader.readexactly(1))[0]
                    length |= (byte & 0x7F) << shift
                    shift += 7
                    if not byte & 0x80:
                        break
                body = await reader.readexactly(length)
                kind = first[0] >> 4
                if kind == CONNECT:
                    conn.connected.set()
                    await conn.release.wait()
                    writer.write(b"\x20\x02\x00\x00")         # CONNACK, accepted
                elif kind == PUBLISH:
                    size = int.from_bytes(body[:2], "big")
                    topic = body[2:2 + size].decode()
                    rest = body[2 + size:]
                    if (first[0] >> 1) & 3:                   # QoS 1: a packet id
                        packet_id, rest = rest[:2], rest[2:]
                        if conn.acknowledges:
                            writer.write(b"\x40\x02" + packet_id)
                    conn.published.append((topic, rest))
                elif kind == PINGREQ:
                    writer.write(b"\xd0\x00")
                elif kind == DISCONNECT:
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            conn.closed.set()
            writer.close()


def records(count: int) -> List[Record]:
    return [Record(f"shop:0/{i:X}:0", "insert", "public", "t", (str(i),), f"0/{i:X}",
                   json.dumps({"id": f"shop:0/{i:X}:0", "v": i}).encode())
            for i in range(count)]


async def until(condition, timeout: float = 10.0) -> None:
    """Poll ``condition`` on the loop until it is true (fails after ``timeout`` seconds)."""
    async def poll():
        while not condition():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


def test_a_broker_that_never_acknowledges_is_dropped_and_the_batch_sent_again():
    async def scenario():
        broker = FakeBroker()
        await broker.start()
        sink = MqttSink({"url": f"mqtt://127.0.0.1:{broker.port}", "protocol": "3.1.1",
                         "ack_timeout": 0.5, "topic_prefix": "cdc"}, "shop")
        batch = records(5)
        try:
            await sink.start()
            sending = asyncio.ensure_future(sink.send(batch))
            await until(lambda: broker.connections
                        and len(broker.connections[0].published) == 5)
            first = broker.connections[0]
            assert not sending.done()             # nothing confirmed: still waiting

            # no PUBACK for 0.5 s: the sink drops that connection and connects again
            await asyncio.wait_for(first.closed.wait(), 10)
            await until(lambda: len(broker.connections) == 2)
            second = broker.connections[1]
            await asyncio.wait_for(second.connected.wait(), 10)
            health = sink.health()                # while the new CONNACK is held back
            assert health["connected"] is False
            assert "no PUBACK within 0.5 s" in health["last_error"], health
            assert not sending.done()

            second.release.set()
            await asyncio.wait_for(sending, 10)   # confirmed by the second connection
            assert second.published == first.published   # the same messages, same order
            assert [json.loads(payload)["id"] for _, payload in second.published] == \
                [r.id for r in batch]
            assert [topic for topic, _ in second.published] == \
                [f"cdc/public/t/{i}" for i in range(5)]
            assert sink.health()["connected"] is True
            assert sink.health()["last_error"] is None
        finally:
            await sink.close()
            await broker.close()

    asyncio.run(scenario())


def test_the_ack_timeout_is_an_option_checked_like_the_others():
    from lapidus.sinks.mqtt.options import MqttOptions, validate
    assert MqttOptions.parse({}).ack_timeout == 30.0
    assert MqttOptions.parse({"ack_timeout": 2}).ack_timeout == 2.0
    assert dict(validate({"ack_timeout": 0}))["ack_timeout"] == "must be greater than 0, got 0"
    assert dict(validate({"ack_timeout": "1s"}))["ack_timeout"].startswith(
        "expected a number of seconds")
