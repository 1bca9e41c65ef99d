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
from typing import Any, Dict, Optional

import aiormq
from aiormq import exceptions as amqp_errors

from ..reconnecting import ReconnectingLink
from .options import RabbitOptions


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


class Connection(ReconnectingLink):
    """The connection, its confirming channel and their state
    (:class:`..reconnecting.ReconnectingLink`)."""

    kind = "rabbitmq"

    def __init__(self, options: RabbitOptions, backend: str, log: Any):
        super().__init__(options, backend, log)
        self.connection: Optional[aiormq.Connection] = None
        self.channel: Optional[Any] = None

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

    def _how_to_fix(self, error: BaseException) -> Optional[str]:
        return how_to_fix(error, self.options)

    def _connected_fields(self) -> Dict[str, Any]:
        return {"exchange": self.options.exchange}

    def _closed(self, connection: Any, future: "asyncio.Future") -> None:
        """The broker (or the network) closed the connection or the channel."""
        if connection is not self.connection or self._closing:
            return
        error = None if future.cancelled() else future.exception()
        self.lost(error or ConnectionError("closed"))

    def _dropped(self) -> None:
        old, self.connection, self.channel = self.connection, None, None
        if old is not None:
            asyncio.ensure_future(_quietly_close(old))

    async def close(self) -> None:
        await self._stop_connecting()
        if self.connection is not None:
            await _quietly_close(self.connection)


async def _quietly_close(connection: Any) -> None:
    try:
        await asyncio.wait_for(connection.close(), 5)
    except BaseException:      # closing a dead connection: nothing left to save
        pass
