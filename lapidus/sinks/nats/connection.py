"""One backend's NATS connection, and the connection facts its publishers rely on.

Runs in the dispatcher process, inside its asyncio loop.  Contract:

* :meth:`Connection.start` returns at once; connecting (and reconnecting, forever:
  ``max_reconnect_attempts=-1``) happens in the background, so an unreachable NATS at start-up
  holds back this backend's batches instead of failing the dispatcher.
* :meth:`Connection.wait_ready` returns once the connection is usable.
* A :class:`Session` taken when a batch starts tells whether every byte written since went
  through that same, still open connection (:meth:`Connection.intact`).  Publishers confirm a
  batch only then: a PONG or an ack that arrives on a *new* connection says nothing about
  messages written into the old socket.
* State changes are logged with the backend name and the server as ``scheme://host:port``;
  credentials never reach a log line.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional

import nats
from nats.aio.client import Client

from .options import NatsOptions, redact_url

# nats-py's defaults (a PING every 2 minutes, 2 unanswered) notice a silently dead connection
# only after minutes; a dead peer without a TCP reset then holds the batch that long.
PING_INTERVAL = 20
MAX_OUTSTANDING_PINGS = 3
# During an outage nats-py reports every failed attempt; log the first and then a summary.
ERROR_LOG_EVERY = 30.0
WAITING_LOG_EVERY = 30.0
REFUSALS_KEPT = 64


def how_to_fix(error: BaseException) -> Optional[str]:
    """What to change when ``error`` says the settings are wrong rather than the server down
    (retrying alone will not help); None for errors an outage explains."""
    text = str(error).lower()
    if isinstance(error, nats.errors.AuthorizationError) or "authorization violation" in text \
            or "authentication" in text:
        return ("the server refused the credentials: check user and password, token, "
                "nkeys_seed or credentials in the nats plugin options")
    if "permissions violation" in text:
        return ("the server's permissions for this user do not allow that subject: allow it "
                "there, or change subject_prefix / subject_template")
    if isinstance(error, ssl.SSLCertVerificationError):
        return ("the server's TLS certificate is not trusted: set tls_ca_file to the CA that "
                "signed it, and tls_hostname if it names another host")
    if isinstance(error, ssl.SSLError):
        return ("TLS failed: use a tls:// URL only for a server with TLS enabled, and check "
                "tls_ca_file, tls_cert_file and tls_key_file")
    return None


def fix_field(error: Optional[BaseException]) -> Dict[str, str]:
    """``{"fix": ...}`` for a log line about ``error`` when :func:`how_to_fix` knows one."""
    fix = how_to_fix(error) if error is not None else None
    return {"fix": fix} if fix else {}


class ConnectionLost(Exception):
    """The connection dropped while a batch was in flight; resend it once reconnected."""


@dataclass(frozen=True)
class Session:
    """The connection as it was when a batch started (see :meth:`Connection.intact`)."""

    lost: "asyncio.Future[None]"
    reconnects: int
    refusals: int = 0       # publishes the server had refused by then (Connection.refused)


class Connection:
    def __init__(self, options: NatsOptions, backend: str, log: Any):
        self.options = options
        self.backend = backend
        self.log = log
        self.nc: Client = Client()
        self._ready = asyncio.Event()
        self._lost: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self._task: Optional[asyncio.Task] = None
        self._down_since: Optional[float] = None
        self._errors_logged_at = 0.0
        self._errors_suppressed = 0
        self._closing = False
        self._refusals = 0
        # the texts of the latest refusals (a batch reads those since it began); bounded: a
        # batch names the first refused message it finds among them
        self._refusal_texts: Deque[str] = collections.deque(maxlen=REFUSALS_KEPT)
        #: counts the nats-py clients that connected: publishers compare it with the one
        #: they subscribed and wrote through (see CorePublisher.publish)
        self.client_generation = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._connect(), name=f"nats-connect:{self.backend}")

    async def _connect(self) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
        while True:
            try:
                # With max_reconnect_attempts=-1 nats-py retries unreachable servers forever
                # by itself; what escapes is a problem of the settings (an unreadable .creds
                # file, a bad TLS file ...): say so, and try again with a fresh client.
                await self.nc.connect(**self.connect_arguments())
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                retry_in = max(self.options.reconnect_time_wait, 5.0)
                self.log.error("cannot connect to NATS; check the nats plugin options",
                               error=f"{type(exc).__name__}: {exc}", retry_in=retry_in,
                               servers=[redact_url(s) for s in self.options.servers],
                               **fix_field(exc))
                await asyncio.sleep(retry_in)
                self.nc = Client()
        self.client_generation += 1     # a new client: publishers bind to it again
        self._came_up("nats connected")

    def connect_arguments(self) -> Dict[str, Any]:
        """Keyword arguments for nats-py's ``connect`` (secrets included: never log them)."""
        o = self.options
        args: Dict[str, Any] = dict(
            servers=list(o.servers),
            name=o.name or f"lapidus:{self.backend}",
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=o.reconnect_time_wait,
            connect_timeout=o.connect_timeout,
            ping_interval=PING_INTERVAL,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            closed_cb=self._on_closed,
        )
        if o.user is not None:
            args.update(user=o.user, password=o.password)
        if o.token is not None:
            args["token"] = o.token
        if o.credentials is not None:
            args["user_credentials"] = o.credentials
        if o.nkeys_seed is not None:
            args["nkeys_seed"] = o.nkeys_seed
        context = self.tls_context()
        if context is not None:
            args["tls"] = context
        if o.tls_hostname is not None:
            args["tls_hostname"] = o.tls_hostname
        return args

    def tls_context(self) -> Optional[ssl.SSLContext]:
        o = self.options
        if o.tls_ca_file is None and o.tls_cert_file is None:
            return None      # tls:// URLs still get nats-py's default context
        context = ssl.create_default_context(cafile=o.tls_ca_file)
        if o.tls_cert_file is not None:
            context.load_cert_chain(o.tls_cert_file, o.tls_key_file)
        return context

    async def close(self) -> None:
        self._closing = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.nc.is_connected or self.nc.is_reconnecting:
            try:
                await asyncio.wait_for(self.nc.close(), 5)
            except (asyncio.TimeoutError, nats.errors.Error):
                pass

    # -- what publishers use ---------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.nc.is_connected

    async def wait_ready(self, held: int = 0) -> None:
        """Return once connected; meanwhile log every 30 s how many events wait."""
        while not self.ready:
            if self._ready.is_set():
                # nats-py counts itself as reconnecting before our disconnected callback
                # clears the flag: waiting on the set flag would return at once, and (with
                # Python 3.12's wait_for) never let that callback run.
                await asyncio.sleep(0.01)
                continue
            try:
                await asyncio.wait_for(self._ready.wait(), WAITING_LOG_EVERY)
            except asyncio.TimeoutError:
                since = self._down_since
                down_for = None if since is None else round(time.monotonic() - since, 1)
                self.log.warning("waiting for NATS; events are held back, none is dropped",
                                 servers=[redact_url(s) for s in self.options.servers],
                                 held_events=held, down_for=down_for)

    def health(self) -> Dict[str, Any]:
        """Connected or not, since when (seconds), and the server (without credentials)."""
        since = self._down_since
        return {"connected": self.ready,
                "down_seconds": None if since is None else round(time.monotonic() - since, 1),
                "server": self._server()}

    def session(self) -> Session:
        return Session(self._lost, self.nc.stats["reconnects"], self._refusals)

    def refused(self, session: Session) -> List[str]:
        """The server's errors for publishes it refused since ``session`` began (subjects the
        user may not publish to), oldest first; empty when none.  Core NATS has no ack: the
        server says so only in an ``-ERR``, which it sends before the PONG that would confirm
        the batch."""
        count = min(self._refusals - session.refusals, len(self._refusal_texts))
        return list(self._refusal_texts)[-count:] if count > 0 else []

    def intact(self, session: Session) -> bool:
        """Whether the connection of ``session`` is still the open one.  Reading the reconnect
        counter covers the gap before the disconnected callback has run: nats-py counts a
        reconnection before the new connection can deliver anything."""
        return (not session.lost.done() and self.nc.is_connected
                and self.nc.stats["reconnects"] == session.reconnects)

    # -- nats-py callbacks -----------------------------------------------------------------

    def _server(self) -> str:
        url = self.nc.connected_url
        if url is None:
            return ", ".join(redact_url(s) for s in self.options.servers)
        return f"{url.scheme}://{url.hostname}:{url.port}"

    def _came_up(self, message: str) -> None:
        down_for = time.monotonic() - self._down_since if self._down_since else 0.0
        self._down_since = None
        self._errors_suppressed = 0
        self._errors_logged_at = 0.0
        if self._lost.done():
            self._lost = asyncio.get_running_loop().create_future()
        self._ready.set()
        self.log.info(message, server=self._server(), after_seconds=round(down_for, 2))

    async def _on_disconnected(self) -> None:
        self._ready.clear()
        if not self._lost.done():
            self._lost.set_result(None)
        self._drop_unsent()
        if self._down_since is None and not self._closing:
            self._down_since = time.monotonic()
            self.log.warning("nats disconnected; reconnecting", server=self._server())

    async def _on_reconnected(self) -> None:
        self._came_up("nats reconnected")

    async def _on_closed(self) -> None:
        self._ready.clear()
        if not self._lost.done():
            self._lost.set_result(None)
        if self._closing or (self._task is not None and not self._task.done()):
            return
        # nats-py gives a client up for good after some server errors ("User Authentication
        # Expired", any -ERR but a stale connection or a permission): start over with a new
        # client, as at start-up, instead of waiting for ever on one that never reconnects.
        if self._down_since is None:
            self._down_since = time.monotonic()
        error = getattr(self.nc, "last_error", None)
        retry_in = max(self.options.reconnect_time_wait, 1.0)
        self.log.warning("nats closed the connection for good; connecting again with a new "
                         "client", server=self._server(), retry_in=retry_in,
                         error=f"{type(error).__name__}: {error}" if error else None,
                         **fix_field(error))
        self._task = asyncio.create_task(self._connect_anew(retry_in),
                                         name=f"nats-connect:{self.backend}")

    async def _connect_anew(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.nc = Client()
        await self._connect()

    async def _on_error(self, error: Exception) -> None:
        if "permissions violation for publish" in str(error).lower():
            # counted before the rate limit below: each one fails its batch
            self._refusals += 1
            self._refusal_texts.append(str(error))
        now = time.monotonic()
        if now - self._errors_logged_at < ERROR_LOG_EVERY:
            self._errors_suppressed += 1
            return
        self._errors_logged_at = now
        # nats-py's messages name the server at most; they never contain the credentials.
        self.log.warning("nats connection error", error=f"{type(error).__name__}: {error}",
                         server=self._server(), similar_errors_since_last=self._errors_suppressed,
                         **fix_field(error))
        self._errors_suppressed = 0

    def _drop_unsent(self) -> None:
        """Forget what nats-py buffered but had not written when the connection dropped.

        nats-py replays that buffer on the next connection.  It is the tail of a batch whose
        head may have died in the old socket, so replaying it would deliver later changes
        before earlier ones (and JetStream would store them in that order).  The publishers
        resend every unconfirmed message of the batch, in order, instead.  ``_pending`` is
        nats-py's private buffer; :mod:`.compat` checked at start that the client has it.
        """
        self.nc._pending.clear()
        self.nc._pending_data_size = 0
