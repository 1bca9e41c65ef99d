"""The nats sink: every event as one NATS message on ``[prefix.]schema.table.key``.

Runs in the dispatcher process, inside its asyncio loop; one instance, hence one connection,
per backend (``shared = False``).  Contract (lapidus.sinks.base.Sink): :meth:`NatsSink.send`
returns only when every record of the batch is confirmed, by the server's PONG on the same
connection (core NATS, default) or by a JetStream ack per message (``jetstream = true``).
While NATS is unreachable ``send`` waits (and logs every 30 s); it never drops a record.  Its
memory is one batch plus at most ``max_pending_acks`` unacknowledged messages.

Modules: ``options`` (validation, no nats-py import: ``lapidus -t`` works without it),
``messages`` (records -> subjects, payloads, headers), ``compat`` (the nats-py internals the
sink needs, checked at start), ``connection``, ``wire`` (writes and confirms through those
internals), ``core``, ``jetstream``, ``stream``, ``refusals`` (what the server refuses for good
-> :class:`lapidus.sinks.base.UndeliverableError` for the record).  Options and subjects are
documented in docs/sinks.md.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Union

from ... import logs
from ...events import Record
from ..base import Sink, SinkError
from .messages import MessageBuilder
from .options import NatsOptions, plaintext_credentials, validate
from .refusals import Refusal, undeliverable

if TYPE_CHECKING:      # nats-py is imported lazily: validation must work without it
    from .connection import Connection
    from .core import CorePublisher
    from .jetstream import JetStreamPublisher


class NatsSink(Sink):
    shared = False
    merge_batches = True     # one ack tail (JetStream) or flush (core) per merged delivery

    def __init__(self, options: Mapping[str, Any], backend: str):
        super().__init__(options, backend)
        self.settings = NatsOptions.parse(options)
        self.log = logs.get_logger(backend=backend, sink="nats")
        self.messages = MessageBuilder(backend, self.settings)
        self.connection: Optional["Connection"] = None
        self.publisher: Optional[Union["CorePublisher", "JetStreamPublisher"]] = None
        self._prepared = False
        self._start_error: Optional[str] = None     # why start() refused (for health)
        self._preparing: Optional[asyncio.Future] = None

    @classmethod
    def validate(cls, options: Mapping[str, Any]) -> list:
        return validate(options)

    async def start(self) -> None:
        """Start connecting in the background; returns at once (NATS may be down)."""
        # nats-py is imported here, not at module level, so validation works without it.
        from .compat import check_client
        from .connection import Connection
        from .core import CorePublisher
        from .jetstream import JetStreamPublisher

        s = self.settings
        connection = Connection(s, self.backend, self.log)
        # Before anything connects: a nats-py without the internals the delivery guarantee
        # rests on is refused (UnsupportedNatsPy, naming the supported versions), here and
        # again at every batch, rather than used unsafely.
        try:
            check_client(connection.nc)
        except SinkError as exc:
            self._start_error = str(exc)
            raise
        self.connection = connection
        self._warn_plaintext_credentials()
        if s.jetstream:
            self.publisher = JetStreamPublisher(self.connection, self.backend,
                                                s.max_pending_acks, s.ack_timeout,
                                                s.flush_timeout, s.stream, self.log)
        else:
            self.publisher = CorePublisher(self.connection, s.flush_timeout, self.log)
        self.connection.start()
        # Connect and prepare in the background from now on: the first batch need not wait.
        self._preparing = asyncio.ensure_future(self._prepare())
        self._preparing.add_done_callback(self._report_prepare_failure)

    def _warn_plaintext_credentials(self) -> None:
        """Credentials over nats:// or ws:// to another host can be read on the network
        (unless that server requires TLS, which nats-py then uses): say so once, at start."""
        kinds, servers = plaintext_credentials(self.settings)
        if servers:
            self.log.warning("nats credentials go to a remote server over a plain-text "
                             "connection", credentials=kinds, servers=servers,
                             fix="use tls:// (or wss://) URLs, with tls_ca_file if the "
                                 "server's certificate is not publicly trusted")

    def _report_prepare_failure(self, task: "asyncio.Future") -> None:
        """Say at start-up already what will stop the first delivery (the batch then retries
        the preparation and reports the same reason)."""
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("nats sink not ready", error=str(task.exception()))

    async def _prepare(self) -> None:
        """Once connected: create the stream if asked, subscribe to the ack inbox."""
        from .stream import ensure_stream

        await self.connection.wait_ready()
        if self.settings.jetstream:
            await ensure_stream(self.connection.nc, self.settings, self.log)
        await self.publisher.start()
        self._prepared = True

    async def send(self, records: Sequence[Record]) -> None:
        if self.connection is None:
            await self.start()
        if not self._prepared:
            task = self._preparing
            if task is None or (task.done() and (task.cancelled() or task.exception())):
                # Never started, or failed (say the stream could not be created): again, so
                # that this batch's delivery reports the reason and is retried.
                task = self._preparing = asyncio.ensure_future(self._prepare())
            await asyncio.shield(task)
        messages = self.messages.build(records)
        try:
            await self.publisher.publish(messages)
        except Refusal as refusal:
            raise undeliverable(refusal, records) from None

    def health(self) -> Optional[Dict[str, Any]]:
        if self.connection is None:
            return {"connected": False, "down_seconds": None, "last_error": self._start_error}
        return self.connection.health()

    async def close(self) -> None:
        if self._preparing is not None and not self._preparing.done():
            self._preparing.cancel()
        if self.connection is not None:
            await self.connection.close()


__all__ = ("NatsSink", "NatsOptions", "validate")
