"""One backend's Redis client and the state of its connection.

Runs in the dispatcher process, inside its asyncio loop.  Contract:

* :meth:`Connection.start` returns at once; connecting, and reconnecting after any failure,
  happens in a background task that tries for ever (every ``reconnect_time_wait`` seconds while
  the server is unreachable; every 5 s at least while it refuses the settings), so an
  unreachable Redis holds back this backend's batches instead of failing the dispatcher.
* :meth:`Connection.wait_ready` returns once a ``PING`` was answered on the current connection;
  :attr:`Connection.generation` counts those (re)connections, so the sink knows when what it
  learnt of the streams may be out of date.
* redis-py's own retries are off (``Retry(NoBackoff(), 0)``): a pipeline it retried by itself
  after a dropped connection would add the entries that did get in a second time.  The sink
  decides what to send again (see :mod:`.resume`).
* Logs name the server as ``scheme://host:port``; the URL's credentials never reach a log line.
  A failure that waiting cannot cure (refused credentials, TLS) carries a ``fix`` field, and is
  logged once (again only every 5 minutes while it lasts), not at every attempt.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any, Dict, Optional

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError

from .options import RedisOptions

WAITING_LOG_EVERY = 30.0
OUTAGE_LOG_EVERY = 30.0
MISCONFIGURED_LOG_EVERY = 300.0
MISCONFIGURED_RETRY = 5.0

#: what a failed connection attempt or a lost connection raises
CONNECTION_ERRORS = (RedisError, OSError, asyncio.TimeoutError)


def how_to_fix(error: BaseException) -> Optional[str]:
    """What to change when ``error`` says the settings are wrong rather than the server down;
    None for errors an outage explains."""
    text = str(error).lower()
    if "without any password configured" in text or "no password is set" in text:
        return ("the server has no password but the url gives one: remove it from the redis "
                "plugin's url, or set requirepass (or an ACL user) on the server")
    if isinstance(error, AuthenticationError) or "wrongpass" in text or "noauth" in text \
            or "invalid username-password" in text or "invalid password" in text:
        return ("the server refused the credentials: check the user and password in the redis "
                "plugin's url (redis://user:${REDIS_PASSWORD}@host:6379/0)")
    if "noperm" in text or "no permissions" in text:
        return ("the server's ACL does not let this user run XADD/XREVRANGE on the stream: "
                "allow them for the stream keys, or change the stream template")
    if isinstance(error, ssl.SSLCertVerificationError):
        return ("the server's TLS certificate is not trusted: set tls_ca_file to the CA that "
                "signed it")
    if isinstance(error, ssl.SSLError) or "ssl" in text or "tls" in text:
        return ("TLS failed: use rediss:// only for a server with TLS enabled (redis:// "
                "otherwise), and check tls_ca_file")
    if isinstance(error, ResponseError) and "db index is out of range" in text:
        return "the database number in the url does not exist on that server"
    return None


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class Connection:
    def __init__(self, options: RedisOptions, backend: str, log: Any):
        self.options = options
        self.backend = backend
        self.log = log
        self.server = options.server
        kwargs: Dict[str, Any] = dict(
            socket_connect_timeout=options.connect_timeout,
            socket_timeout=options.reply_timeout,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
            client_name=f"lapidus:{backend}",
            max_connections=4,
        )
        if options.tls_ca_file is not None:
            kwargs["ssl_ca_certs"] = options.tls_ca_file
        self.client = aioredis.Redis.from_url(options.url, **kwargs)
        self.generation = 0
        self.last_error: Optional[str] = None
        self._ready = asyncio.Event()
        self._down_since: Optional[float] = time.monotonic()
        self._task: Optional[asyncio.Task] = None
        self._logged: Dict[str, float] = {}      # error text -> when it was last logged
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._reconnect()

    def _reconnect(self) -> None:
        if self._closing or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self._connect(), name=f"redis-connect:{self.backend}")

    async def _connect(self) -> None:
        while True:
            try:
                await self.client.ping()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:      # anything: keep trying, never kill the dispatcher
                fix = how_to_fix(exc)
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
        self.log.info("redis connected" if self.generation == 1 else "redis reconnected",
                      server=self.server, after_seconds=round(down_for, 2))

    def _failed(self, exc: BaseException, fix: Optional[str], retry_in: float) -> None:
        text = describe(exc)
        self.last_error = text + (f"; fix: {fix}" if fix else "")
        now = time.monotonic()
        every = MISCONFIGURED_LOG_EVERY if fix else OUTAGE_LOG_EVERY
        if now - self._logged.get(text, -1e9) < every:
            return
        self._logged[text] = now
        if fix:
            self.log.error("redis refuses the connection; events are held back until the "
                           "settings are fixed", server=self.server, error=text, fix=fix,
                           retry_in=retry_in)
        else:
            self.log.warning("cannot connect to redis; retrying", server=self.server,
                             error=text, retry_in=retry_in)

    def lost(self, error: BaseException) -> None:
        """A command failed for want of a connection: down from now, reconnect."""
        if self._ready.is_set():
            self._ready.clear()
            self._down_since = time.monotonic()
            self.last_error = describe(error)
            self.log.warning("redis connection lost; reconnecting", server=self.server,
                             error=describe(error))
        self._reconnect()

    async def close(self) -> None:
        self._closing = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        try:
            await asyncio.wait_for(self.client.aclose(), 5)
        except Exception:      # closing a dead connection: nothing left to save
            pass

    # -- what the sink uses ----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, held: int = 0) -> None:
        """Return once connected; meanwhile log every 30 s how many events wait."""
        while not self._ready.is_set():
            try:
                await asyncio.wait_for(self._ready.wait(), WAITING_LOG_EVERY)
            except asyncio.TimeoutError:
                self.log.warning("waiting for redis; events are held back, none is dropped",
                                 server=self.server, held_events=held,
                                 down_for=self.down_seconds(), error=self.last_error)

    def down_seconds(self) -> Optional[float]:
        since = self._down_since
        return None if since is None else round(time.monotonic() - since, 1)

    def health(self) -> Dict[str, Any]:
        return {"connected": self.ready, "down_seconds": self.down_seconds(),
                "server": self.server, "last_error": self.last_error}
