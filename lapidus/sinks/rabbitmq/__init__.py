"""The rabbitmq sink: every event as one persistent AMQP message on a durable topic exchange.

Runs in the dispatcher process, inside its asyncio loop; one instance, hence one connection and
one confirm channel, per backend (``shared = False``).  Contract (lapidus.sinks.base.Sink):
:meth:`RabbitmqSink.send` publishes the whole batch on the channel (pipelined: no wait between
messages), then waits for the broker's publisher confirm of every message, and returns only
when each one is an ack.  A nack, a lost channel or ``confirm_timeout`` fails the batch, which
the dispatcher publishes again, whole: consumers may see the head of a batch twice (same
``message_id``), never out of order.  With ``mandatory = true`` a message that no queue takes
comes back (``basic.return``) and is an :class:`~lapidus.sinks.base.UndeliverableError` with the
fix (bind a queue); without it the broker drops such messages and still acks them.  While the
broker is unreachable ``send`` waits (logging every 30 s) and never drops a record.

Modules: ``options`` (validation, no aiormq import: ``lapidus -t`` works without it),
``messages`` (records -> routing keys, bodies, properties), ``connection`` (connection,
channel, exchange, reconnecting, state, errors with a fix).  Documented in docs/sinks.md.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

from ... import logs
from ...events import Record
from ..base import Sink, SinkError, UndeliverableError
from ..optionkit import start_without_extra
from .options import RabbitOptions, validate

if TYPE_CHECKING:       # aiormq is imported lazily: validation must work without it
    from .connection import Connection
    from .messages import Message, MessageBuilder


class RabbitmqSink(Sink):
    shared = False
    merge_batches = True     # each delivery ends with a wait for confirms: pay it once

    def __init__(self, options: Mapping[str, Any], backend: str):
        super().__init__(options, backend)
        self.settings = RabbitOptions.parse(options)
        self.log = logs.get_logger(backend=backend, sink="rabbitmq")
        self.connection: Optional["Connection"] = None
        self.messages: Optional["MessageBuilder"] = None
        self._start_error: Optional[str] = None

    @classmethod
    def validate(cls, options: Mapping[str, Any]) -> list:
        return validate(options)

    async def start(self) -> None:
        """Start connecting in the background; returns at once (the broker may be down)."""
        try:
            from .connection import Connection
            from .messages import MessageBuilder
        except ImportError as exc:
            self._start_error = start_without_extra("rabbitmq", exc)
            raise SinkError(self._start_error) from None
        self.messages = MessageBuilder(self.backend)
        self.connection = Connection(self.settings, self.backend, self.log)
        self.connection.start()

    async def send(self, records: Sequence[Record]) -> None:
        if self.connection is None:
            await self.start()
        from .connection import CONNECTION_ERRORS
        from .messages import TooLong

        try:
            messages = self.messages.build(records)
        except TooLong as exc:
            record = records[exc.index]
            raise UndeliverableError(
                exc.index, f"event {record.id}: its routing key (the subject "
                           f"\"{exc.routing_key[:80]}...\") is {len(exc.routing_key.encode())} "
                           f"bytes, more than AMQP's 255", "shorten the key values or table "
                           "name, or leave the table out of this backend") from None
        connection = self.connection
        await connection.wait_ready(len(records))
        channel = connection.channel
        try:
            results = await self._publish(channel, messages)
        except CONNECTION_ERRORS as exc:
            connection.lost(exc)
            raise SinkError(f"rabbitmq channel lost with a batch in flight "
                            f"({type(exc).__name__}: {exc}); it is published again once "
                            f"reconnected") from None
        self._check(results, messages, records)

    async def _publish(self, channel, messages: List["Message"]) -> list:
        """Publish every message without waiting in between, then wait for all confirms
        (``confirm_timeout`` for the batch).  Returns aiormq's results in message order:
        ``Basic.Ack``/``Basic.Nack`` frames, or the exceptions (returned messages are
        ``PublishError``).  A lost channel raises."""
        from aiormq import exceptions as amqp_errors

        exchange, mandatory = self.settings.exchange, self.settings.mandatory
        publish = channel.basic_publish
        # One task per message: aiormq takes a publish under the channel's lock (FIFO, so in
        # this order) and resolves its confirm future; awaiting each in turn would be one
        # round trip per message.
        pending = [asyncio.ensure_future(publish(m.body, exchange=exchange,
                                                 routing_key=m.routing_key,
                                                 properties=m.properties, mandatory=mandatory,
                                                 wait=False))
                   for m in messages]
        try:
            results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True),
                                             self.settings.confirm_timeout)
        except asyncio.TimeoutError:
            for task in pending:
                task.cancel()
            raise SinkError(f"rabbitmq: no confirm for {sum(not t.done() for t in pending)} of "
                            f"{len(pending)} messages within confirm_timeout "
                            f"({self.settings.confirm_timeout:g} s; a broker alarm, memory or "
                            f"disk, blocks publishers); the batch is published again") from None
        for result in results:
            if isinstance(result, asyncio.CancelledError):
                # aiormq cancels the pending publishes of a channel that closes; that is a
                # lost channel here, not a cancellation of the dispatcher's task
                raise ConnectionError("the channel closed with publishes pending")
            if isinstance(result, BaseException) and not isinstance(
                    result, (amqp_errors.PublishError, amqp_errors.DeliveryError)):
                raise result
        return results

    def _check(self, results: list, messages: List["Message"],
               records: Sequence[Record]) -> None:
        from aiormq import exceptions as amqp_errors
        from pamqp.commands import Basic

        for result, message in zip(results, messages):
            if isinstance(result, Basic.Ack):
                continue
            record = records[message.record]
            if isinstance(result, amqp_errors.PublishError):
                raise UndeliverableError(
                    message.record, f"event {record.id}: no queue is bound to exchange "
                                    f"\"{self.settings.exchange}\" for routing key "
                                    f"\"{message.routing_key}\" (mandatory = true: the broker "
                                    f"returned it)",
                    f"bind a queue to exchange \"{self.settings.exchange}\" with a pattern "
                    f"that matches it (\"#\" takes everything), or set mandatory = false")
            raise SinkError(f"rabbitmq did not confirm event {record.id} "
                            f"({type(result).__name__}: {result}); the batch is published "
                            f"again")

    def health(self) -> Optional[Dict[str, Any]]:
        if self.connection is None:
            return {"connected": False, "down_seconds": None, "last_error": self._start_error}
        return self.connection.health()

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()


__all__ = ("RabbitmqSink", "RabbitOptions", "validate")
