"""Core NATS delivery: publish a batch, then PING/PONG; confirmed when the PONG comes back.

Runs in the dispatcher process, inside its asyncio loop.  A PONG proves the server has
processed every message written before the PING *on that connection*, which is all core NATS
promises (delivery to the subscribers present at that moment).  So a batch counts only when
the PONG came over the connection the batch started on (:meth:`Connection.intact`); if the
connection dropped on the way the whole batch is published again, in order, once reconnected.
Subscribers may then see the head of a batch twice (same ``Nats-Msg-Id``), never out of order.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import nats

from ..base import SinkError
from .connection import Connection, ConnectionLost, Session
from .messages import Message
from .refusals import REFUSED_FIX, check_sizes, refusal_for, too_large
from .wire import Wire

# Messages are handed to nats-py in runs of this many (one write each, see wire.Frames);
# nats-py only buffers, its flusher task writes to the socket when the loop runs.  Yielding
# after each run lets the server work on the head of a batch while the tail is still being
# encoded (and acks come back meanwhile), instead of one batch-long burst.
YIELD_EVERY = 128


async def first_of(work: "asyncio.Future[Any]", lost: "asyncio.Future[None]",
                   timeout: float | None = None) -> bool:
    """Wait for ``work`` unless the connection is lost first (ConnectionLost) or ``timeout``
    passes (returns False).  True once ``work`` is done; its exception is not raised here."""
    done, _ = await asyncio.wait((work, lost), timeout=timeout,
                                 return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        return True
    if lost in done:
        raise ConnectionLost()
    return False


class CorePublisher:
    def __init__(self, connection: Connection, flush_timeout: float, log: Any):
        self.connection = connection
        self.flush_timeout = flush_timeout
        self.log = log

    async def start(self) -> None:
        self.wire = Wire(self.connection.nc)
        self.client_generation = self.connection.client_generation

    async def publish(self, messages: Sequence[Message]) -> None:
        """Return once the server has processed every message; resend after a reconnect."""
        while True:
            await self.connection.wait_ready(held=len(messages))
            if self.client_generation != self.connection.client_generation:
                await self.start()      # a new nats-py client (see Connection._on_closed)
            # Connected, so max_payload is the server's (its INFO): the whole batch is
            # checked before any of it is published (an oversized event never passes).
            check_sizes(messages, self.connection.nc.max_payload)
            try:
                await self._publish_once(messages)
                return
            except ConnectionLost:
                self.log.info("nats connection lost during a batch; it will be sent again",
                              messages=len(messages))

    async def _publish_once(self, messages: Sequence[Message]) -> None:
        conn = self.connection
        nc = conn.nc
        session = conn.session()
        wire = self.wire
        frames = wire.frames()
        message = None
        try:
            for message in messages:
                frames.add(message.subject, "", message.header, message.payload)
                if frames.count == YIELD_EVERY:
                    await write_connected(wire, frames, conn, session)
                    await asyncio.sleep(0)
            await write_connected(wire, frames, conn, session)
            await round_trip(wire, conn, session, self.flush_timeout,
                             waiting_for=f"server {conn._server()}")
            raise_if_refused(conn, session, messages)
        except nats.errors.MaxPayloadError:
            raise too_large(message, nc.max_payload) from None
        except (nats.errors.OutboundBufferLimitError, nats.errors.ConnectionReconnectingError):
            raise ConnectionLost() from None
        if not conn.intact(session):
            raise ConnectionLost()


async def write_connected(wire: Wire, frames: Any, connection: Connection,
                          session: Session) -> None:
    """Hand ``frames`` to nats-py, only while the connection of ``session`` (the one the
    batch started on) is still open; ConnectionLost otherwise, and the caller resends from
    the first unconfirmed message.  Checked before: publishing while reconnecting would go
    to nats-py's buffer, which the connection drops (Connection._drop_unsent).  And after:
    with the server not reading, handing over can wait inside nats-py until a reconnect, and
    the rest of the batch must not follow on the new connection ahead of its dropped head."""
    if not connection.intact(session):
        raise ConnectionLost()
    await wire.send(frames)
    if not connection.intact(session):
        raise ConnectionLost()


async def round_trip(wire: Wire, connection: Connection, session: Session,
                     timeout: float, waiting_for: str) -> None:
    """Return once the server has processed everything written on ``session``'s connection
    (PING/PONG, see Wire.ping).  ConnectionLost if it dropped first; after ``timeout``
    seconds on a live connection a SinkError naming ``waiting_for`` and the fix."""
    if not connection.intact(session):
        raise ConnectionLost()
    pong = wire.ping(timeout)
    try:
        if not await first_of(pong, session.lost, timeout):
            raise nats.errors.FlushTimeoutError
        pong.result()       # the fallback's flush may have failed
    except nats.errors.FlushTimeoutError:
        if not connection.intact(session):
            raise ConnectionLost() from None
        raise SinkError(f"NATS did not answer a flush within {timeout:g} s ({waiting_for}); "
                        f"the batch will be sent again. If the server is overloaded, raise "
                        f"flush_timeout") from None
    if not connection.intact(session):
        raise ConnectionLost()


def raise_if_refused(connection: Connection, session: Session,
                     messages: Sequence[Message]) -> None:
    """A publish the server refused since ``session`` began fails the batch, never a
    confirmation: a :class:`.refusals.Refusal` naming the first refused message of
    ``messages``, or (a refusal of a subject not in the batch) a SinkError to retry."""
    errors = connection.refused(session)
    if not errors:
        return
    refusal = refusal_for(messages, errors)
    if refusal is not None:
        raise refusal
    raise SinkError(f"NATS refused a publish while this batch was sent ({errors[-1]}); the "
                    f"user of the nats plugin may not publish to that subject. Fix: "
                    f"{REFUSED_FIX} (the batch will be sent again)")
