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
from typing import Any, Dict, Optional

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError

from ..reconnecting import ReconnectingLink
from .options import RedisOptions

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


class Connection(ReconnectingLink):
    """The client and its connection state (:class:`..reconnecting.ReconnectingLink`)."""

    kind = "redis"

    def __init__(self, options: RedisOptions, backend: str, log: Any):
        super().__init__(options, backend, log)
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

    async def _open(self) -> None:
        await self.client.ping()

    def _how_to_fix(self, error: BaseException) -> Optional[str]:
        return how_to_fix(error)

    async def close(self) -> None:
        await self._stop_connecting()
        try:
            await asyncio.wait_for(self.client.aclose(), 5)
        except Exception:      # closing a dead connection: nothing left to save
            pass
