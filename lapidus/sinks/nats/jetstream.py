"""JetStream delivery: pipelined publishes, a bounded window of unacknowledged messages.

Runs in the dispatcher process, inside its asyncio loop.

Why not ``js.publish``: it waits for each ack before the next publish, one round trip per
event (about 2.6k events/s here).  Instead every message is published with a reply subject
``<inbox>.<n>`` under one wildcard subscription; the stream's ack for message ``n`` arrives
there.  At most ``max_pending_acks`` messages are unacknowledged at any time (memory stays
bounded whatever the batch size); a batch is confirmed when every message of it has its ack.

Failure handling, all with the same ``Nats-Msg-Id`` (= the event id), so JetStream stores each
event once however often it is sent within the stream's duplicate window:

* connection lost mid-batch: once reconnected, every unacknowledged message of the batch is
  published again, in batch order (nats-py's unsent buffer is dropped, see
  ``Connection._drop_unsent``, so nothing older overtakes them);
* no ack at all for ``ack_timeout`` seconds: the unacknowledged messages are published again;
  after ``MAX_STALLS`` such rounds the batch fails (SinkError) and the dispatcher retries it;
* an error ack (no stream for the subject, stream full, ...): SinkError naming the subject,
  the reason and the fix; the dispatcher retries the batch with backoff.

Known limit: if the server lost one message yet stored a later one of the same connection
(which a TCP connection does not do), resending the lost one would store it after the later.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Optional, Sequence

import nats
import orjson

from ..base import SinkError
from .connection import Connection, ConnectionLost
from .core import YIELD_EVERY, first_of, raise_if_refused, round_trip, write_connected
from .messages import Message
from .refusals import Refusal, check_sizes, too_large
from .wire import Wire

MAX_STALLS = 3
#: JetStream's err_code for a message over the stream's max_msg_size
STREAM_MESSAGE_TOO_LARGE = 10054
_NO_RESPONDERS = "503"


def _is_error_ack(data: bytes) -> bool:
    """Whether a JetStream answer is an error (``{"error": {...}}``), read as JSON: only
    called when the bytes contain ``"error"``, which a stream or domain named ``error`` puts
    into every successful ack too."""
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError:
        return True
    return not isinstance(answer, dict) or "error" in answer


class _Batch:
    """Ack bookkeeping of the batch in flight."""

    __slots__ = ("messages", "numbers", "acked", "plain_sent", "remaining", "done", "error")

    def __init__(self, messages: Sequence[Message], numbers: List[int]):
        self.messages = messages
        self.numbers = numbers                     # reply number of each message, -1: no ack
        self.acked = bytearray(len(messages))
        self.plain_sent = bytearray(len(messages))  # plain (no ack) messages written
        self.remaining = sum(1 for n in numbers if n >= 0)
        self.done: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self.error: Optional[SinkError] = None
        if not self.remaining:
            self.done.set_result(None)


class JetStreamPublisher:
    def __init__(self, connection: Connection, backend: str, max_pending_acks: int,
                 ack_timeout: float, flush_timeout: float, stream: Optional[str], log: Any):
        self.connection = connection
        self.backend = backend
        self.max_pending = max_pending_acks
        self.ack_timeout = ack_timeout
        self.flush_timeout = flush_timeout
        self.stream = stream
        self.log = log
        self._inbox = ""
        self._waiting: Dict[int, int] = {}       # reply number -> index in the batch
        self._next = 0
        self._batch: Optional[_Batch] = None
        self._space = asyncio.Event()
        self._space.set()

    async def start(self) -> None:
        """Subscribe to the ack inbox (needs a connection; nats-py renews it on reconnect)."""
        await self.connection.wait_ready()
        nc = self.connection.nc
        self.wire = Wire(nc)
        self.client_generation = self.connection.client_generation
        self._inbox = nc.new_inbox() + "."
        self._inbox_len = len(self._inbox)
        # A limit far above the window: nats-py drops messages of a subscription over its
        # limits ("slow consumer"), and a dropped ack would only cost a resend.
        await self.wire.subscribe_acks(self._inbox + "*", self._on_ack,
                                       pending_msgs_limit=max(65536, 4 * self.max_pending))

    # -- sending ---------------------------------------------------------------------------

    async def publish(self, messages: Sequence[Message]) -> None:
        """Return once JetStream acknowledged every stored message of the batch."""
        numbers = []
        for message in messages:
            if message.stored:
                numbers.append(self._next)
                self._next += 1
            else:
                numbers.append(-1)
        batch = _Batch(messages, numbers)
        self._batch = batch
        stalls = 0
        try:
            while True:
                await self.connection.wait_ready(held=batch.remaining)
                if self.client_generation != self.connection.client_generation:
                    await self.start()  # a new nats-py client: its own inbox subscription
                # with the server's max_payload, before any of the batch is published
                check_sizes(messages, self.connection.nc.max_payload)
                session = self.connection.session()
                try:
                    # After a stall the unacked stored messages go again, and the plain
                    # cache messages not yet written (a full window stops a send early);
                    # after a lost connection every plain one, which may have died with it.
                    await self._send(batch, session, resend_plain=stalls == 0)
                    if await self._acked(batch, session):
                        await self._confirm_plain(batch, session)
                        return
                except ConnectionLost:
                    stalls = 0
                    self.log.info("nats connection lost during a JetStream batch; resending "
                                  "what was not acknowledged", unacked=batch.remaining)
                    continue
                stalls += 1
                if stalls > MAX_STALLS:
                    raise SinkError(self._stalled_message(batch))
                self.log.warning("JetStream acks missing; resending the unacknowledged "
                                 "messages with the same Nats-Msg-Id", unacked=batch.remaining,
                                 waited_seconds=self.ack_timeout, round=stalls)
        finally:
            self._batch = None
            for number in numbers:
                if number >= 0:
                    self._waiting.pop(number, None)
            self._space.set()

    async def _send(self, batch: _Batch, session: Any, resend_plain: bool) -> None:
        wire = self.wire
        frames = wire.frames()
        waiting = self._waiting
        inbox = self._inbox
        acked = batch.acked
        message = None
        try:
            for index, message in enumerate(batch.messages):
                if acked[index]:
                    continue
                number = batch.numbers[index]
                if number < 0:
                    # After a stall only those never written; after a lost connection all.
                    if resend_plain or not batch.plain_sent[index]:
                        frames.add(message.subject, "", message.header, message.payload)
                        batch.plain_sent[index] = 1
                    continue
                # A resend already holds its place in the window (its number stays waiting
                # until acked); only a first send needs room.
                if number not in waiting and len(waiting) >= self.max_pending:
                    await write_connected(wire, frames, self.connection, session)   # acks follow
                    if not await self._wait_for_space(session):
                        return  # acks stalled: stop filling the window; the caller resends
                if batch.error is not None:
                    return      # no point publishing more: the batch fails anyway
                frames.add(message.subject, inbox + str(number), message.header,
                           message.payload)
                waiting[number] = index
                if frames.count >= YIELD_EVERY:
                    await write_connected(wire, frames, self.connection, session)
                    await asyncio.sleep(0)   # see core.YIELD_EVERY
            await write_connected(wire, frames, self.connection, session)
        except nats.errors.MaxPayloadError:
            raise too_large(message, self.connection.nc.max_payload) from None
        except (nats.errors.OutboundBufferLimitError, nats.errors.ConnectionReconnectingError):
            raise ConnectionLost() from None

    async def _wait_for_space(self, session: Any) -> bool:
        """Wait until the window has room; False when no ack came for ack_timeout."""
        while len(self._waiting) >= self.max_pending:
            self._space.clear()
            space = asyncio.ensure_future(self._space.wait())
            try:
                if not await first_of(space, session.lost, self.ack_timeout):
                    return False
            finally:
                space.cancel()
        return True

    async def _acked(self, batch: _Batch, session: Any) -> bool:
        """True once every stored message is acknowledged; False when no ack arrived for
        ack_timeout seconds.  Raises the batch's error, or ConnectionLost."""
        while not batch.done.done():
            before = batch.remaining
            await first_of(batch.done, session.lost, self.ack_timeout)
            if batch.done.done() or batch.remaining == before:
                break         # done, or no progress at all in ack_timeout
        if batch.error is not None:
            raise batch.error
        if batch.done.done():
            return True
        if not self.connection.intact(session):
            raise ConnectionLost()
        # a refused publish is never acked
        raise_if_refused(self.connection, session, batch.messages)
        return False

    async def _confirm_plain(self, batch: _Batch, session: Any) -> None:
        """Plain (cache_prefix) messages have no ack: a PONG on the same connection confirms
        them, as in core mode."""
        if all(n >= 0 for n in batch.numbers):
            return
        await round_trip(self.wire, self.connection, session, self.flush_timeout,
                         waiting_for="confirming the cache_prefix messages")
        raise_if_refused(self.connection, session, batch.messages)

    # -- acks --------------------------------------------------------------------------------

    def _on_ack(self, subject: bytes, data: bytes, headers: Optional[bytes]) -> None:
        """Called for each message on the ack inbox, in arrival order (see Wire)."""
        try:
            number = int(subject[self._inbox_len:])
        except ValueError:
            return
        index = self._waiting.pop(number, None)
        batch = self._batch
        if len(self._waiting) < self.max_pending:
            self._space.set()
        if index is None or batch is None or batch.acked[index]:
            return    # ack of an earlier send of a message already acknowledged
        if data[:1] == b"{" and (b'"error"' not in data or not _is_error_ack(data)):
            batch.acked[index] = 1
            batch.remaining -= 1
            if batch.remaining == 0 and not batch.done.done():
                batch.done.set_result(None)
            return
        batch.error = self._ack_error(batch.messages[index], data, headers)
        if not batch.done.done():
            batch.done.set_result(None)

    def _ack_error(self, message: Message, data: bytes, headers: Optional[bytes]) -> SinkError:
        subject = message.subject
        if not data and (headers or b"").startswith(b"NATS/1.0 " + _NO_RESPONDERS.encode()):
            if self.stream is not None:
                fix = (f'add it to the subjects of stream "{self.stream}" (the subjects '
                       f"option applies only when Lapidus creates the stream)")
            else:
                fix = ('create a stream whose subjects match it (set stream = "NAME" and '
                       'subjects = ["..."] in the nats plugin options, or `nats stream add`)')
            return SinkError(
                f'JetStream: no stream captures subject "{subject}" (backend "{self.backend}", '
                f"the server answered 'no responders'). Fix: {fix}, or set jetstream = false "
                f"for core NATS")
        try:
            error = orjson.loads(data).get("error") or {}
        except (orjson.JSONDecodeError, AttributeError):
            error = {"description": repr(data[:200]) + (f" (headers {headers[:100]!r})"
                                                        if headers else "")}
        description = error.get("description", "unknown error")
        code = error.get("err_code", error.get("code", "?"))
        if code == STREAM_MESSAGE_TOO_LARGE:
            # The stream's max_msg_size: as permanent as the server's max_payload.
            return Refusal(message, f'JetStream refused it on subject "{subject}": '
                                    f"{description} (error {code})",
                           "raise the stream's max_msg_size (`nats stream edit --max-msg-size`), "
                           "or set publish_event_data = false")
        return SinkError(f'JetStream refused event {message.msg_id} on subject "{subject}": '
                         f"{description} (error {code}); the batch will be sent again. Check "
                         f"the stream's limits and subjects (`nats stream info`)")

    def _stalled_message(self, batch: _Batch) -> str:
        first = next(i for i, n in enumerate(batch.numbers) if n >= 0 and not batch.acked[i])
        return (f"JetStream acknowledged nothing for {self.ack_timeout:g} s, {MAX_STALLS + 1} "
                f"times; {batch.remaining} messages unacknowledged (first on subject "
                f'"{batch.messages[first].subject}"). Is the stream\'s storage full or the '
                f"server overloaded? Raise ack_timeout if it is only slow; the batch will be "
                f"sent again")
