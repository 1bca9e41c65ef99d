"""The webhook sink: events as JSON batches POSTed to one URL.

Runs in the dispatcher process, inside its asyncio loop; one instance (one aiohttp session,
hence one keep-alive connection pool) per backend.  Contract (lapidus.sinks.base.Sink):
:meth:`WebhookSink.send` cuts the records into requests of ``batch_size`` events, POSTs them
one after the other (the next only once the previous one was answered 2xx, so a receiver sees
each key's changes in commit order; it is built while the previous one is in flight) and
returns once every one was answered 2xx.

While the server is down, slow, or answers 429/5xx, ``send`` retries the same request for ever
(backoff up to ``retry_max``, or the server's ``Retry-After``): the backend's position stays
where it is and nothing is dropped; :meth:`health` says since when it is down.  401/403, 3xx
and a certificate that does not verify are settings errors: one clear error, then the same
waiting (see :mod:`.answers`).

Another 4xx refuses an event for good.  A request of several events is then sent again one
event per request, in order, until the refused one is found: the events before it are
confirmed one by one, and :class:`lapidus.sinks.base.UndeliverableError` names the refused
one (index, id, table), for the backend's ``on_undeliverable`` policy.  Event by event rather
than bisecting, so that the receiver still gets every event in commit order; a refusal is
rare and this costs one request per event of one batch, once.

Delivery is at least once: an answer lost after the server took a request, a dispatcher
crash, or the narrowing above sends events again, with the same ids (and, for the same cut,
the same Idempotency-Key).  Modules: ``options`` (validation, no aiohttp import),
``requests`` (bodies, signature, headers), ``answers`` (what an answer means), ``client``
(the aiohttp session).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence

from ... import logs
from ...backoff import Backoff
from ...events import Record
from ..base import Sink, UndeliverableError
from . import answers
from .options import WebhookOptions, validate
from .requests import Request, RequestBuilder

if TYPE_CHECKING:       # aiohttp is imported lazily: validation must work without it
    from .client import Client

#: while failing, a line every this many seconds (plus the first one and the recovery)
LOG_EVERY = 30.0
SETTINGS_RETRY = 10.0     # seconds between attempts while the settings are wrong


class WebhookSink(Sink):
    shared = False
    merge_batches = True     # deliveries may span batches; POSTs stay batch_size events

    def __init__(self, options: Mapping[str, Any], backend: str):
        super().__init__(options, backend)
        self.settings = WebhookOptions.parse(options)
        self.log = logs.get_logger(backend=backend, sink="webhook")
        self.requests = RequestBuilder(backend, self.settings.secret)
        self.client: Optional["Client"] = None
        self._down_since: Optional[float] = None
        self._last_error: Optional[str] = None
        self._logged_at = 0.0
        self._failures = 0

    @classmethod
    def validate(cls, options: Mapping[str, Any]) -> list:
        return validate(options)

    async def start(self) -> None:
        from .client import Client
        if self.client is None:
            self.client = Client(self.settings, self.backend)

    async def send(self, records: Sequence[Record]) -> None:
        if self.client is None:
            await self.start()
        posting: Optional[asyncio.Future] = None
        try:
            # each request is built while the previous one is on the wire: the body's join
            # and its HMAC overlap the server's work instead of adding to each round trip
            for request in self.requests.build(records, self.settings.batch_size):
                if posting is not None:
                    await posting        # confirmed (2xx) before the next one is sent
                posting = asyncio.ensure_future(self._deliver(request, records))
                # two loop turns: one for the POST to start, one for aiohttp's body writer
                # (a task of its own before Python 3.12); then the request is written
                await asyncio.sleep(0)
                await asyncio.sleep(0)
            if posting is not None:
                await posting
        finally:
            if posting is not None and not posting.done():
                posting.cancel()         # send() itself was cancelled (shutdown, a reload)

    async def _deliver(self, request: Request, records: Sequence[Record]) -> None:
        """POST ``request`` until it is answered 2xx; narrow a refusal down to its event."""
        backoff: Optional[Backoff] = None     # made on the first failure: the hot path
        while True:
            verdict = await self.client.post(request)
            if verdict.kind == answers.OK:
                self._came_up()
                return
            if verdict.kind == answers.REFUSED:
                self._came_up()     # it answers: it is not down, it refuses
                if request.count == 1:
                    raise self._undeliverable(records, request.first, verdict)
                self.log.warning("the webhook refused a request of several events; sending "
                                 "them one per request to find the one it refuses",
                                 events=request.count, answer=verdict.reason)
                for index in range(request.first, request.first + request.count):
                    await self._deliver(self.requests.one([records[index]], index), records)
                return
            if verdict.kind in (answers.SETTINGS, answers.UNTRUSTED):
                delay = max(SETTINGS_RETRY, verdict.retry_after or 0.0)
            else:
                if backoff is None:
                    # from 0.2 s (a receiver restarting), doubling up to retry_max
                    backoff = Backoff(min(0.2, self.settings.retry_max),
                                      self.settings.retry_max)
                delay = verdict.retry_after if verdict.retry_after is not None \
                    else backoff.next()
            self._went_down(verdict, delay, request)
            await asyncio.sleep(delay)

    def _undeliverable(self, records: Sequence[Record], index: int,
                       verdict: answers.Verdict) -> UndeliverableError:
        record = records[index]
        where = ("of table " + ".".join(p for p in (record.schema, record.table) if p)
                 if record.table else f"({record.type}, no table)")
        return UndeliverableError(index, f"event {record.id} {where} ({len(record.data)} bytes "
                                         f"of JSON): {verdict.reason}", verdict.fix)

    def _went_down(self, verdict: answers.Verdict, delay: float, request: Request) -> None:
        now = time.monotonic()
        first = self._down_since is None
        if first:
            self._down_since = now
        self._failures += 1
        changed = verdict.reason != self._last_error
        self._last_error = verdict.reason
        # The first failure, a new reason, then one line every LOG_EVERY seconds: an outage
        # of hours must not write a line per retry.
        if first or changed or now - self._logged_at >= LOG_EVERY:
            self._logged_at = now
            fields = dict(url=self.settings.target, error=verdict.reason,
                          retry_in=round(delay, 2), events_waiting=request.count,
                          failed_attempts=self._failures,
                          down_for=round(now - self._down_since, 1))
            if verdict.fix:
                fields["fix"] = verdict.fix
            if verdict.kind == answers.SETTINGS:
                self.log.error("the webhook refuses the sink's settings; the backend waits, "
                               "no event is dropped", **fields)
            elif verdict.kind == answers.UNTRUSTED:
                self.log.error("the webhook's TLS certificate is not trusted; the backend "
                               "waits, no event is dropped", **fields)
            else:
                self.log.warning("webhook unavailable; retrying the same request, no event "
                                 "is dropped", **fields)

    def _came_up(self) -> None:
        if self._down_since is not None:
            self.log.info("webhook answering again", url=self.settings.target,
                          after_seconds=round(time.monotonic() - self._down_since, 2),
                          failed_attempts=self._failures)
        self._down_since = None
        self._last_error = None
        self._failures = 0

    def health(self) -> Optional[Dict[str, Any]]:
        """Up until a POST fails; then down since that first failure, with its reason."""
        since = self._down_since
        return {"connected": since is None,
                "down_seconds": None if since is None else round(time.monotonic() - since, 1),
                "server": self.settings.target, "last_error": self._last_error}

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


__all__ = ("WebhookSink", "WebhookOptions", "validate")
