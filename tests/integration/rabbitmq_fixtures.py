"""Helpers for tests against the local RabbitMQ (guest on 127.0.0.1:5672).

* :func:`rabbit_exchange` gives a test an exchange name of its own and a queue bound to it with
  ``#`` (everything), both deleted afterwards.  The queue is not durable: RabbitMQ then keeps
  even persistent messages in memory, which makes a test several times faster on a busy host
  (durable queues write and fsync every message before the confirm) and changes nothing the
  sink sees.
* :class:`Consumer` reads that queue from a background thread (aiormq), recording each message's
  routing key, body and properties, so synchronous tests can wait on conditions.
* :func:`close_connections_of` closes a Lapidus backend's connections from the broker's side
  (``rabbitmqctl close_connection``, only those named ``lapidus:<backend>``): the connections
  of other programs on the shared broker are left alone.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from typing import List, NamedTuple, Optional

import aiormq
import pytest

from tests.conftest import wait_until
from tests.integration.recorder import BackgroundRecorder, recorders

URL = "amqp://guest:guest@127.0.0.1:5672/"


class Seen(NamedTuple):
    routing_key: str
    body: bytes
    message_id: Optional[str]
    content_type: Optional[str]
    delivery_mode: Optional[int]
    headers: dict


async def _with_channel(action):
    connection = await aiormq.connect(URL)
    try:
        channel = await connection.channel()
        return await action(channel)
    finally:
        await connection.close()


@pytest.fixture
def rabbit_exchange():
    name = f"it-{uuid.uuid4().hex[:10]}"

    async def setup(channel):
        await channel.exchange_declare(exchange=name, exchange_type="topic", durable=True)
        await channel.queue_declare(name, durable=False, auto_delete=False)
        await channel.queue_bind(name, name, routing_key="#")

    async def teardown(channel):
        await channel.queue_delete(name)
        await channel.exchange_delete(name)

    asyncio.run(_with_channel(setup))
    yield name
    asyncio.run(_with_channel(teardown))


class Consumer(BackgroundRecorder):
    """Records every message of ``queue``, acknowledging each (a background thread)."""

    what = "RabbitMQ"

    def __init__(self, queue: str):
        self.queue = queue
        super().__init__()

    async def listen(self):
        connection = await aiormq.connect(URL)
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=2000)

        async def on_message(message) -> None:
            p = message.header.properties
            self.record(Seen(message.routing_key, message.body, p.message_id,
                             p.content_type, p.delivery_mode, dict(p.headers or {})))
            await message.channel.basic_ack(message.delivery.delivery_tag)

        await channel.basic_consume(self.queue, on_message)
        return connection.close

    def wait_unique(self, count: int, timeout: float = 60.0) -> List[Seen]:
        """Every message, once ``count`` distinct message ids arrived."""
        def enough():
            seen = self.seen()
            return seen if len({m.message_id for m in seen}) >= count else None
        return wait_until(enough, timeout, message=f"{count} distinct messages in {self.queue} "
                                                   f"(have {len(self.seen())})")


@pytest.fixture
def consume():
    yield from recorders(Consumer)


def connections_of(backend: str) -> List[str]:
    """The broker's pids of the connections named ``lapidus:<backend>``."""
    result = subprocess.run(["rabbitmqctl", "-q", "--no-table-headers", "list_connections",
                             "pid", "client_properties"], capture_output=True, text=True,
                            timeout=60, check=True)
    return [line.split("\t", 1)[0] for line in result.stdout.splitlines()
            if f"lapidus:{backend}" in line]


def close_connections_of(backend: str) -> int:
    pids = connections_of(backend)
    for pid in pids:
        subprocess.run(["rabbitmqctl", "-q", "close_connection", pid, "lapidus test: outage"],
                       capture_output=True, timeout=60, check=True)
    return len(pids)
