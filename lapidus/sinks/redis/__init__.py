"""The redis sink: every event as one entry of a Redis stream (``XADD``).

Runs in the dispatcher process, inside its asyncio loop; one instance, hence one client, per
backend (``shared = False``).  Contract (lapidus.sinks.base.Sink): :meth:`RedisSink.send` writes
the batch's ``XADD`` commands as one pipeline on one connection and returns only when the
server's reply to every one of them is in (an entry id each); any missing or failed reply
fails the batch, which the dispatcher sends again.  What the streams provably have already is
skipped when a batch is sent again (:mod:`.resume`), so a crash or a lost connection adds no
duplicate entries where positions prove it; otherwise a repeat carries the same ``id`` field.
While Redis is unreachable ``send`` waits (logging every 30 s) and never drops a record.

Modules: ``options`` (validation, no redis-py import: ``lapidus -t`` works without it),
``entries`` (records -> stream keys and XADD arguments), ``resume`` (what to skip),
``connection`` (client, reconnecting, state, errors with a fix).  Options are documented in
docs/sinks.md.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

from ... import logs
from ...events import Record
from ..base import Sink, SinkError, UndeliverableError
from ..optionkit import start_without_extra
from .entries import Entry, EntryBuilder
from .options import RedisOptions, validate
from .resume import SCAN_BACK, Skipper, newest_of

if TYPE_CHECKING:       # redis-py is imported lazily: validation must work without it
    from .connection import Connection

WRONGTYPE_FIX = ("that key holds another type: delete or rename it, or change the stream "
                 "template of the redis plugin")


class RedisSink(Sink):
    shared = False
    merge_batches = True     # each delivery ends with a wait for the replies: pay it once

    def __init__(self, options: Mapping[str, Any], backend: str):
        super().__init__(options, backend)
        self.settings = RedisOptions.parse(options)
        self.log = logs.get_logger(backend=backend, sink="redis")
        self.entries = EntryBuilder(backend, self.settings.stream, self.settings.maxlen)
        self.skipper = Skipper(backend)
        self.connection: Optional["Connection"] = None
        self._generation = 0
        self._start_error: Optional[str] = None

    @classmethod
    def validate(cls, options: Mapping[str, Any]) -> list:
        return validate(options)

    async def start(self) -> None:
        """Start connecting in the background; returns at once (Redis may be down)."""
        try:
            from .connection import Connection
        except ImportError as exc:
            self._start_error = start_without_extra("redis", exc)
            raise SinkError(self._start_error) from None
        self.connection = Connection(self.settings, self.backend, self.log)
        self.connection.start()

    async def send(self, records: Sequence[Record]) -> None:
        if self.connection is None:
            await self.start()
        from .connection import CONNECTION_ERRORS

        connection = self.connection
        await connection.wait_ready(len(records))
        if connection.generation != self._generation:
            self._generation = connection.generation
            self.skipper.forget()
        entries = self.entries.build(records)
        streams = [entry.stream for entry in entries]
        try:
            unknown = self.skipper.unknown(streams)
            if unknown:
                await self._read_marks(unknown, streams, records)
            skipped = self.skipper.skipped
            keep = self.skipper.keep(streams, records)
            if self.skipper.skipped != skipped:
                self.log.info("skipped events the streams already have (added before a crash "
                              "or a lost connection)", events=self.skipper.skipped - skipped)
            if keep:
                replies = await self._write([entries[i] for i in keep])
                self._check(replies, [entries[i] for i in keep], records)
        except CONNECTION_ERRORS as exc:
            self.skipper.forget()
            if not isinstance(exc, SinkError) and _is_connection_error(exc):
                connection.lost(exc)
                raise SinkError(f"redis connection lost with a batch in flight "
                                f"({type(exc).__name__}: {exc}); it is sent again once "
                                f"reconnected, without what the streams already have") from None
            raise SinkError(f"redis: {type(exc).__name__}: {exc}") from None
        except BaseException:
            # cancelled, or a refusal: what got in is not known here; read the streams again
            self.skipper.forget()
            raise

    async def _read_marks(self, unknown: List[str], streams: List[str],
                          records: Sequence[Record]) -> None:
        """Learn each stream's newest entry of this backend (one round trip for all).  A key
        of another type refuses the first record bound for it, for good."""
        from redis.exceptions import ResponseError

        pipe = self.connection.client.pipeline(transaction=False)
        for stream in unknown:
            pipe.xrevrange(stream, "+", "-", count=SCAN_BACK)
        replies = await pipe.execute(raise_on_error=False)
        for stream, reply in zip(unknown, replies):
            if isinstance(reply, ResponseError) and str(reply).startswith("WRONGTYPE"):
                index = streams.index(stream)
                raise UndeliverableError(
                    index, f"event {records[index].id}: redis cannot read or add to stream "
                           f"\"{stream}\" ({reply})", WRONGTYPE_FIX)
            if isinstance(reply, Exception):
                raise reply
            self.skipper.learn(stream, newest_of(self.backend, reply))

    async def _write(self, entries: List[Entry]) -> list:
        """Write every entry's XADD in one go on one connection, then read one reply per
        entry: an entry id, or the server's error as a ResponseError (returned, not raised).
        The replies of a batch share one ``reply_timeout`` (per reply, redis-py would arm a
        timer each time: a tenth of the sink's time).  A connection that failed here is
        closed, never reused with replies still unread on it."""
        import math

        from redis.exceptions import ResponseError

        pool = self.connection.client.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(b"".join([e.command for e in entries]),
                                           check_health=False)

            async def replies() -> list:
                out = []
                read = conn.read_response
                for _ in range(len(entries)):
                    try:
                        out.append(await read(timeout=math.inf))
                    except ResponseError as exc:
                        out.append(exc)
                return out

            return await asyncio.wait_for(replies(), self.settings.reply_timeout)
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)

    def _check(self, replies: list, entries: List[Entry], records: Sequence[Record]) -> None:
        """Every reply an entry id, or the batch fails (a refusal: for good)."""
        from redis.exceptions import ResponseError

        for reply, entry in zip(replies, entries):
            if not isinstance(reply, Exception):
                continue
            record = records[entry.record]
            if isinstance(reply, ResponseError) and str(reply).startswith("WRONGTYPE"):
                raise UndeliverableError(
                    entry.record, f"event {record.id}: redis refused XADD to \"{entry.stream}\" "
                                  f"({reply})", WRONGTYPE_FIX)
            raise SinkError(f"redis refused XADD of event {record.id} to \"{entry.stream}\": "
                            f"{type(reply).__name__}: {reply}")
        if len(replies) != len(entries):
            raise SinkError(f"redis answered {len(replies)} of {len(entries)} commands")

    def health(self) -> Optional[Dict[str, Any]]:
        if self.connection is None:
            return {"connected": False, "down_seconds": None, "last_error": self._start_error}
        return self.connection.health()

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()


def _is_connection_error(exc: BaseException) -> bool:
    """A failure of the link, not of a command (those come back as ResponseError)."""
    from redis.exceptions import ResponseError
    return not isinstance(exc, ResponseError)


__all__ = ("RedisSink", "RedisOptions", "validate")
