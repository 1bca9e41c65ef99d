"""One backend's AMQP connection and confirm channel, and the state of both.

Runs in the dispatcher process, inside its asyncio loop.  Contract:

* :meth:`Connection.start` returns at once; connecting (TCP, AMQP handshake, a channel in
  confirm mode, the exchange declared durable ``topic`` when missing) happens in a background
  task, and again after any loss, for ever: an unreachable broker holds back this backend's
  batches instead of failing the dispatcher.
* :meth:`Connection.wait_ready` returns once that channel is usable; :attr:`Connection.channel`
  is then the one to publish on.  A confirm received on a channel counts only for messages
  published on that same channel (AMQP delivery tags are per channel), so a batch interrupted by
  a loss is published again, whole, on the next one.
* The connection is named ``lapidus:<backend>`` (``connection_name``, shown by the broker's
  management tools).  Logs name the server as ``scheme://host:port``; never the credentials.  A
  failure that waiting cannot cure (refused credentials, a missing vhost, an exchange of another
  type, TLS) carries a ``fix`` and is logged once (again only every 5 minutes while it lasts).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any, Dict, Optional

import aiormq
from aiormq import exceptions as amqp_errors

from .options import RabbitOptions

WAITING_LOG_EVERY = 30.0
OUTAGE_LOG_EVERY = 30.0
MISCONFIGURED_LOG_EVERY = 300.0
MISCONFIGURED_RETRY = 5.0

# aiormq logs every connection the broker closes as an error with a traceback, in the plain
# format of stdlib logging, into Lapidus's JSON log.  The sink logs each loss and reconnection
# itself, with the backend and the server (and a fix where one helps): keep aiormq's own
# records to the critical ones.
logging.getLogger("aiormq").setLevel(logging.CRITICAL)

#: what a failed connection attempt or a lost connection raises
CONNECTION_ERRORS = (amqp_errors.AMQPError, OSError, asyncio.TimeoutError, ConnectionError)


def how_to_fix(error: BaseException, options: RabbitOptions) -> Optional[str]:
    """What to change when ``error`` says the settings are wrong rather than the broker down;
    None for errors an outage explains."""
    text = str(error).lower()
    if isinstance(error, (amqp_errors.ProbableAuthenticationError,
                          amqp_errors.AuthenticationError)) or "access_refused" in text \
            and "login" in text or "authentication" in text:
        return ("the broker refused the credentials: check the user and password in the "
                "rabbitmq plugin's url (amqp://user:${AMQP_PASSWORD}@host:5672/vhost)")
    if "vhost" in text and ("not found" in text or "not_allowed" in text or "access" in text):
        return ("the vhost in the url does not exist or the user may not use it: create it or "
                "grant permissions (rabbitmqctl set_permissions -p VHOST USER '.*' '.*' '.*'), "
                "or fix the url's path")
    if isinstance(error, amqp_errors.ChannelPreconditionFailed) or "inequivalent arg" in text:
        return (f'an exchange "{options.exchange}" exists with other settings (Lapidus needs '
                f"a durable topic exchange): delete it, or set another exchange in the "
                f"rabbitmq plugin options")
    if isinstance(error, amqp_errors.ChannelAccessRefused) or "access_refused" in text:
        return (f'the user may not declare or publish to exchange "{options.exchange}": grant '
                f"configure and write permissions on it, or declare it yourself as a durable "
                f"topic exchange")
    if isinstance(error, ssl.SSLCertVerificationError):
        return ("the broker's TLS certificate is not trusted: set tls_ca_file to the CA that "
                "signed it")
    if isinstance(error, ssl.SSLError):
        return ("TLS failed: use amqps:// only for a listener with TLS (port 5671 usually), "
                "amqp:// otherwise, and check tls_ca_file")
    return None


def describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class Connection:
    def __init__(self, options: RabbitOptions, backend: str, log: Any):
        self.options = options
        self.backend = backend
        self.log = log
        self.server = options.server
        self.connection: Optional[aiormq.Connection] = None
        self.channel: Optional[Any] = None
        self.generation = 0
        self.last_error: Optional[str] = None
        self._ready = asyncio.Event()
        self._down_since: Optional[float] = time.monotonic()
        self._task: Optional[asyncio.Task] = None
        self._logged: Dict[str, float] = {}
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._reconnect()

    def _reconnect(self) -> None:
        if self._closing or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self._connect(), name=f"amqp-connect:{self.backend}")

    def _tls_context(self) -> Optional[ssl.SSLContext]:
        if self.options.tls_ca_file is None:
            return None
        return ssl.create_default_context(cafile=self.options.tls_ca_file)

    async def _open(self) -> None:
        connection = aiormq.Connection(
            self.options.url, context=self._tls_context(),
            client_properties={"connection_name": f"lapidus:{self.backend}"})
        try:
            await asyncio.wait_for(connection.connect(), self.options.connect_timeout)
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await channel.exchange_declare(exchange=self.options.exchange,
                                           exchange_type="topic", durable=True)
        except BaseException:
            await _quietly_close(connection)
            raise
        self.connection, self.channel = connection, channel
        connection.closing.add_done_callback(lambda f: self._closed(connection, f))
        channel.closing.add_done_callback(lambda f: self._closed(connection, f))

    async def _connect(self) -> None:
        while True:
            try:
                await self._open()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:      # anything: keep trying, never kill the dispatcher
                fix = how_to_fix(exc, self.options)
                retry_in = max(self.options.reconnect_time_wait, MISCONFIGURED_RETRY) if fix \
                    else self.options.reconnect_time_wait
                self._failed(exc, fix, retry_in)
                await asyncio.sleep(retry_in)
        self.generation += 1
        down_for = time.monotonic() - self._down_since if self._down_since else 0.0
        self._down_since = None
        self.last_error = None
        self._logged.clear()
        self._ready.set()
        self.log.info("rabbitmq connected" if self.generation == 1 else "rabbitmq reconnected",
                      server=self.server, exchange=self.options.exchange,
                      after_seconds=round(down_for, 2))

    def _failed(self, exc: BaseException, fix: Optional[str], retry_in: float) -> None:
        text = describe(exc)
        self.last_error = text + (f"; fix: {fix}" if fix else "")
        now = time.monotonic()
        every = MISCONFIGURED_LOG_EVERY if fix else OUTAGE_LOG_EVERY
        if now - self._logged.get(text, -1e9) < every:
            return
        self._logged[text] = now
        if fix:
            self.log.error("rabbitmq refuses the connection; events are held back until the "
                           "settings are fixed", server=self.server, error=text, fix=fix,
                           retry_in=retry_in)
        else:
            self.log.warning("cannot connect to rabbitmq; retrying", server=self.server,
                             error=text, retry_in=retry_in)

    def _closed(self, connection: Any, future: "asyncio.Future") -> None:
        """The broker (or the network) closed the connection or the channel."""
        if connection is not self.connection or self._closing:
            return
        error = None if future.cancelled() else future.exception()
        self.lost(error or ConnectionError("closed"))

    def lost(self, error: BaseException) -> None:
        """Publishing failed for want of a channel: down from now, reconnect on a new one."""
        if self._ready.is_set():
            self._ready.clear()
            self._down_since = time.monotonic()
            self.last_error = describe(error)
            self.log.warning("rabbitmq connection lost; reconnecting", server=self.server,
                             error=describe(error))
            old, self.connection, self.channel = self.connection, None, None
            if old is not None:
                asyncio.ensure_future(_quietly_close(old))
        self._reconnect()

    async def close(self) -> None:
        self._closing = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.connection is not None:
            await _quietly_close(self.connection)

    # -- what the sink uses ----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, held: int = 0) -> None:
        while not self._ready.is_set():
            try:
                await asyncio.wait_for(self._ready.wait(), WAITING_LOG_EVERY)
            except asyncio.TimeoutError:
                self.log.warning("waiting for rabbitmq; events are held back, none is dropped",
                                 server=self.server, held_events=held,
                                 down_for=self.down_seconds(), error=self.last_error)

    def down_seconds(self) -> Optional[float]:
        since = self._down_since
        return None if since is None else round(time.monotonic() - since, 1)

    def health(self) -> Dict[str, Any]:
        return {"connected": self.ready, "down_seconds": self.down_seconds(),
                "server": self.server, "last_error": self.last_error}


async def _quietly_close(connection: Any) -> None:
    try:
        await asyncio.wait_for(connection.close(), 5)
    except BaseException:      # closing a dead connection: nothing left to save
        pass
