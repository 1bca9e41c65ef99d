"""The core publisher and real nats-py against a minimal NATS server in the test (a socket-level
fake): the PING that confirms a batch goes out after every message of it, a flush timeout leaves
nats-py able to read, and a batch whose connection dropped while nats-py held it back is sent
again from its first message on the new connection."""

from __future__ import annotations

import asyncio
import re
import socket
from typing import Callable, List, Optional

import pytest

from lapidus.events import Record
from lapidus.sinks.base import SinkError
from lapidus.sinks.nats.connection import Connection
from lapidus.sinks.nats.core import CorePublisher
from lapidus.sinks.nats.messages import MessageBuilder
from lapidus.sinks.nats.options import NatsOptions

INFO = (b'INFO {"server_id":"TEST","version":"2.10.0","proto":1,"headers":true,'
        b'"max_payload":1048576}\r\n')
MSG_ID = re.compile(rb"Nats-Msg-Id: [^\r]*:(\d+)\r")


class Quiet:
    def info(self, *args, **kwargs):
        pass

    warning = error = info


def records(n: int, size: int) -> List[Record]:
    return [Record(f"pg:0/1:{i}", "insert", "public", "t", (str(i),), "0/1", b"x" * size)
            for i in range(n)]


class FakeServer:
    """Speaks just enough NATS: INFO, then reads CONNECT, PING, SUB and HPUB.  ``on_ping(n,
    connection, writer)`` decides what each PING of a connection gets (n counts from 1: the
    first is nats-py's own at connect).  Records the message ids each connection received,
    and how many each had received when each PING came."""

    def __init__(self, on_ping: Callable):
        self.on_ping = on_ping
        self.received: List[List[int]] = []        # per connection: message ids, in order
        self.at_ping: List[List[int]] = []         # per connection: messages before each PING
        self.server: Optional[asyncio.AbstractServer] = None
        self.port = 0

    async def start(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # backs up quickly
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        self.port = sock.getsockname()[1]
        self.server = await asyncio.start_server(self._serve, sock=sock)

    async def _serve(self, reader, writer) -> None:
        number = len(self.received)
        self.received.append([])
        self.at_ping.append([])
        writer.write(INFO)
        pings = 0
        while True:
            line = await reader.readline()
            if not line:
                return
            op, *args = line.split()
            if op == b"HPUB":
                body = await reader.readexactly(int(args[-1]) + 2)
                self.received[number].append(int(MSG_ID.search(body).group(1)))
            elif op == b"PING":
                pings += 1
                self.at_ping[number].append(len(self.received[number]))
                if await self.on_ping(pings, number, writer) is False:
                    writer.transport.abort()
                    return

    def close(self) -> None:
        self.server.close()


async def publisher(server: FakeServer, **options):
    settings = NatsOptions.parse({"servers": [f"nats://127.0.0.1:{server.port}"],
                                  "reconnect_time_wait": 0.2, **options})
    connection = Connection(settings, "shop", Quiet())
    connection.start()
    await asyncio.wait_for(connection.wait_ready(), 10)
    core = CorePublisher(connection, settings.flush_timeout, Quiet())
    await core.start()
    return connection, core, MessageBuilder("shop", settings)


def publish_one_batch(on_ping: Callable, batch: List[Record]) -> FakeServer:
    """Publish ``batch`` through the core publisher to a FakeServer answering ``on_ping``;
    the server, once the batch is confirmed."""
    async def run():
        server = FakeServer(on_ping)
        await server.start()
        connection, core, messages = await publisher(server)
        await asyncio.wait_for(core.publish(messages.build(batch)), 30)
        await connection.close()
        server.close()
        return server
    return asyncio.run(run())


def test_the_confirming_ping_follows_every_message_of_the_batch():
    async def on_ping(n, connection, writer):
        writer.write(b"PONG\r\n")
        if n == 1:
            await asyncio.sleep(1.0)      # a slow reader for a moment: the client backs up

    server = publish_one_batch(on_ping, records(266, 12000))
    # nats-py's own flush wrote its PING ahead of what it still buffered: the PONG then
    # confirmed a batch of which the server had seen 256 messages
    assert server.at_ping[0][1] == 266


def test_a_flush_timeout_leaves_nats_py_reading():
    async def on_ping(n, connection, writer):
        if n == 1:
            writer.write(b"PONG\r\n")
        elif n == 2:                          # the first batch's PONG comes too late
            async def late():
                await asyncio.sleep(1.5)
                writer.write(b"PONG\r\n")
            asyncio.ensure_future(late())
        else:
            writer.write(b"PONG\r\n")

    async def run():
        server = FakeServer(on_ping)
        await server.start()
        connection, core, messages = await publisher(server, flush_timeout=1)
        with pytest.raises(SinkError, match="did not answer a flush"):
            await core.publish(messages.build(records(3, 10)))
        await asyncio.sleep(1.0)              # the late PONG arrives meanwhile
        await asyncio.wait_for(core.publish(messages.build(records(3, 10))), 5)
        reading = not connection.nc._reading_task.done()
        await connection.close()
        server.close()
        return reading, server.at_ping[0]

    reading, at_ping = asyncio.run(run())
    # Before: the late PONG ended nats-py's read loop, and the second batch was "confirmed"
    # at once, without a PING reaching the server.
    assert reading
    assert at_ping == [0, 3, 6]


def test_a_batch_held_back_across_a_reconnect_starts_again_from_its_first_message():
    async def on_ping(n, connection, writer):
        writer.write(b"PONG\r\n")
        if connection == 0 and n == 1:
            await asyncio.sleep(1.0)          # stops reading: nats-py's buffer fills
            return False                      # then the connection dies

    received = publish_one_batch(on_ping, records(600, 12000)).received
    assert len(received) >= 2
    # Before: the tail of the batch went out on the new connection first, then its head.
    assert received[-1] == list(range(600))


def test_no_fallback_to_the_public_flush_without_nats_py_internals():
    """nats-py's public flush() can confirm messages it still buffers: a client without the
    internals Wire uses is refused (lapidus.sinks.nats.compat) instead of used that way."""
    from lapidus.sinks.nats import compat

    class Client:
        async def flush(self, timeout):
            pass

    assert "_pongs" in compat.missing_internals(Client())
    with pytest.raises(compat.UnsupportedNatsPy, match="lacks internals"):
        compat.check_client(Client())


def test_a_client_nats_py_gives_up_on_is_replaced_and_the_batch_delivered():
    async def on_ping(n, connection, writer):
        writer.write(b"PONG\r\n")
        if connection == 0 and n == 1:
            async def expire():
                await asyncio.sleep(0.3)
                # nats-py closes its client for good after this error and never reconnects
                writer.write(b"-ERR 'User Authentication Expired'\r\n")
                writer.close()
            asyncio.ensure_future(expire())

    async def run():
        server = FakeServer(on_ping)
        await server.start()
        connection, core, messages = await publisher(server)
        first = connection.nc
        await wait_closed(first)
        await asyncio.wait_for(core.publish(messages.build(records(3, 10))), 10)
        replaced = connection.nc is not first
        await connection.close()
        server.close()
        return replaced, server.received

    replaced, received = asyncio.run(run())
    assert replaced
    assert received[-1] == [0, 1, 2]


async def wait_closed(client, timeout: float = 5.0) -> None:
    """Until nats-py has closed ``client`` (polled: it has no event to wait on)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not client.is_closed:
        assert asyncio.get_running_loop().time() < deadline, "nats-py did not close"
        await asyncio.sleep(0.01)
