"""One backend's MQTT connection: connect, notice the loss, connect again, for ever.

Runs in the dispatcher process, inside its asyncio loop; imported only when the sink starts
(aiomqtt is the optional extra ``lapidus[mqtt]``).  Contract:

* :meth:`Connection.start` returns at once; connecting happens in a background task, so a
  broker that is down at start-up holds back this backend's batches, not the dispatcher.
* :meth:`Connection.wait_ready` returns a :class:`Link` once connected: the paho client to
  publish through and a future that is done when that connection is gone.  The publisher
  confirms a message only by a PUBACK on that same link.
* Every connection starts a *clean* session (MQTT 5 clean start, 3.1.1 clean session): the
  broker forgets the previous one and paho replays nothing by itself, so the publisher alone
  resends what was unconfirmed, in order.
* ``protocol = "auto"`` tries MQTT 5 and falls back to 3.1.1 when the broker refuses the
  version (and stays there).  Refused credentials or client id, and a broker certificate that
  does not verify, are a settings problem: one error line naming the fix, then an attempt
  every 10 s.  Anything else (no broker, TLS,
  a dropped connection) is retried with backoff up to 10 s, logged when it starts and every
  30 s.

aiomqtt gives the connection, the network loop on asyncio and the CONNACK check; it has no
reconnection of its own and its ``publish`` hides the PUBACK's reason code, so this module
uses two of its internals, checked by :func:`check_client`: ``Client._client`` (the paho
client: ``publish``, ``on_connect``, ``on_publish``) and
``Client._disconnected`` (the future of the loss).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from typing import Any, Dict, NamedTuple, Optional

import aiomqtt
from aiomqtt.exceptions import MqttConnectError

from ...backoff import Backoff
from ..base import SinkError
from .options import MqttOptions

SETTINGS_RETRY = 10.0
RETRY_MAX = 10.0
LOG_EVERY = 30.0

#: CONNACK reason codes (MQTT 5 numbering; 3.1.1's 1-5 are mapped by paho) that say the
#: settings are wrong, with what to change
SETTINGS_FIXES = {
    "Bad user name or password": "check the user and password in the mqtt plugin's url "
                                 "(mqtt://user:password@host)",
    "Not authorized": "give this user the right to connect in the broker's configuration, "
                      "or check the user and password in the mqtt plugin's url",
    "Invalid client identifier": "set client_id to an identifier the broker accepts",
    "Client identifier not valid": "set client_id to an identifier the broker accepts",
    "Banned": "the broker bans this client: see its configuration",
    "Bad authentication method": "check the user and password in the mqtt plugin's url",
}


def settings_fix(text: str) -> str:
    """The fix for a CONNACK refusal that the settings explain ("" for others).  Matched
    without spaces and case: paho spells 3.1.1's and 5's reasons differently ("Bad username
    or password", "Bad user name or password", "Not authorised")."""
    squeezed = text.lower().replace(" ", "").replace("authorised", "authorized")
    return next((fix for reason, fix in SETTINGS_FIXES.items()
                 if reason.lower().replace(" ", "") in squeezed), "")


TLS_FIX = ("set tls_ca_file to the CA that signed the broker's certificate (and make the url's "
           "host one the certificate names), or use mqtt:// for a broker without TLS")


class UnsupportedClient(SinkError):
    """The installed aiomqtt lacks what the sink relies on."""


def check_client(client: "aiomqtt.Client") -> None:
    missing = [name for name in ("_client", "_disconnected") if not hasattr(client, name)]
    if missing or not hasattr(client._client, "publish"):
        raise UnsupportedClient(
            f"the installed aiomqtt {getattr(aiomqtt, '__version__', '?')} lacks "
            f"{', '.join(missing) or 'a paho client'}, which the mqtt sink "
            f"needs to confirm each message; fix: pip install 'lapidus[mqtt]' (aiomqtt 2.x)")


def _register_write(client: aiomqtt.Client):
    """aiomqtt's ``on_socket_register_write``, but safe when the socket closes before the
    loop gets to it: aiomqtt adds the writer through ``call_soon_threadsafe``, and a
    connection that breaks in between makes asyncio report an ``OSError: Bad file
    descriptor`` traceback from its callback (the loss itself is reported anyway)."""
    loop = asyncio.get_running_loop()

    def on_register_write(paho_client, userdata, sock) -> None:
        def writable() -> None:
            try:
                paho_client.loop_write()
            except Exception as exc:       # a broken connection, as aiomqtt does
                if not client._disconnected.done():
                    client._disconnected.set_exception(exc)

        def add() -> None:
            if sock.fileno() == -1:
                return                     # closed meanwhile: nothing to write to
            try:
                loop.add_writer(sock.fileno(), writable)
            except (OSError, ValueError):
                pass

        loop.call_soon_threadsafe(add)
    return on_register_write


#: paho's own log lines ("failed to receive on socket: ...") would reach standard error in
#: no format of ours; this module logs every state change itself
_QUIET = logging.getLogger("lapidus.sinks.mqtt.paho")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


class Link(NamedTuple):
    paho: "paho.Client"
    lost: "asyncio.Future[None]"
    generation: int
    version5: bool


class Connection:
    def __init__(self, options: MqttOptions, backend: str, log: Any):
        self.options = options
        self.backend = backend
        self.log = log
        self.link: Optional[Link] = None
        self.version5 = options.protocol != "3.1.1"
        self.receive_maximum = 65535
        self.on_publish = None        # set by the publisher: (mid, reason_code) -> None
        self._client: Optional[aiomqtt.Client] = None
        self._ready = asyncio.Event()
        self._task: Optional[asyncio.Task] = None
        self._generation = 0
        self._down_since: Optional[float] = time.monotonic()
        self._last_error: Optional[str] = None
        self._logged_at = 0.0
        self._closing = False

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"mqtt-connect:{self.backend}")

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        client = self._client
        if client is not None and self.link is not None and not self.link.lost.done():
            try:
                await asyncio.wait_for(client.__aexit__(None, None, None), 5)
            except (asyncio.TimeoutError, aiomqtt.MqttError, RuntimeError):
                pass

    async def _run(self) -> None:
        """Connect for ever.  A bug in a client library must not end that silently: it is
        logged, and connecting starts over."""
        while True:
            try:
                await self._connect_forever()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._last_error = f"{type(exc).__name__}: {exc}"
                self.log.error("mqtt connection failed unexpectedly; connecting again",
                               server=self.options.target, error=self._last_error,
                               retry_in=SETTINGS_RETRY)
                self.link = None
                self._ready.clear()
                if self._down_since is None:
                    self._down_since = time.monotonic()
                await asyncio.sleep(SETTINGS_RETRY)

    async def _connect_forever(self) -> None:
        backoff = Backoff(0.2, RETRY_MAX)
        while True:
            client = self._new_client()
            try:
                await client.__aenter__()
            except asyncio.CancelledError:
                raise
            except MqttConnectError as exc:
                reason = str(getattr(exc, "rc", "") or exc)
                if self.version5 and self.options.protocol == "auto" and \
                        "protocol version" in str(exc).lower():
                    self.version5 = False      # a 3.1.1 broker: ask again in its version
                    self.log.info("the broker does not speak MQTT 5; using 3.1.1 (no user "
                                  "properties)", server=self.options.target)
                    continue
                fix = settings_fix(str(exc))
                if fix:
                    self._failed(f"the broker refused the connection: {reason}", fix,
                                 SETTINGS_RETRY, settings=True)
                    await asyncio.sleep(SETTINGS_RETRY)
                    continue
                delay = backoff.next()
                self._failed(f"the broker refused the connection: {reason}", "", delay)
                await asyncio.sleep(delay)
                continue
            except (aiomqtt.MqttError, OSError) as exc:
                text = str(exc) or type(exc).__name__
                if "certificate verify failed" in text.lower():
                    # retrying will not cure it: a settings error, tried again slowly
                    self._failed(f"the broker's TLS certificate does not verify: {text}",
                                 TLS_FIX, SETTINGS_RETRY, untrusted=True)
                    await asyncio.sleep(SETTINGS_RETRY)
                    continue
                delay = backoff.next()
                fix = TLS_FIX if "ssl" in text.lower() or "certificate" in text.lower() else ""
                self._failed(f"cannot connect to the broker: {text}", fix, delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            self._came_up(client)
            try:
                await asyncio.shield(client._disconnected)
            except asyncio.CancelledError:
                raise
            except Exception as exc:       # the loss, as aiomqtt reports it
                self._last_error = f"connection lost: {exc}"
            self._went_down()
            try:       # releases aiomqtt's re-entrancy lock; the connection is gone already
                await client.__aexit__(None, None, None)
            except Exception:
                pass

    def _new_client(self) -> aiomqtt.Client:
        o = self.options
        context = None
        if o.tls:
            context = ssl.create_default_context(cafile=o.tls_ca_file)
        version = aiomqtt.ProtocolVersion.V5 if self.version5 else aiomqtt.ProtocolVersion.V311
        extra: Dict[str, Any] = ({"clean_start": True} if self.version5
                                 else {"clean_session": True})
        client = aiomqtt.Client(
            o.host, o.port, username=o.username, password=o.password,
            identifier=o.client_id or f"lapidus-{self.backend}", protocol=version, logger=_QUIET,
            keepalive=o.keepalive, timeout=o.connect_timeout, tls_context=context,
            max_queued_outgoing_messages=0,   # 0: paho queues without a bound; we bound it
            # 0: no limit in paho, whose limit costs a scan of every unacknowledged message
            # per PUBACK; the publisher keeps the window (max_inflight, Receive Maximum)
            max_inflight_messages=0,
            # neither paho nor aiomqtt turn Nagle off: a batch's last PUBLISH and each PUBACK
            # would wait for the peer's delayed ACK (40 ms) before leaving
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
            **extra)
        check_client(client)
        self._client = client
        inner = client._client
        aiomqtt_connect = inner.on_connect
        aiomqtt_publish = inner.on_publish

        def on_connect(c, userdata, flags, reason_code, properties=None):
            # the broker's Receive Maximum: more unacknowledged QoS 1 publishes than that
            # and an MQTT 5 broker disconnects us (paho does not read it)
            maximum = getattr(properties, "ReceiveMaximum", None) if properties else None
            self.receive_maximum = maximum or 65535
            aiomqtt_connect(c, userdata, flags, reason_code, properties)

        def on_publish(c, userdata, mid, reason_code, properties):
            if self.on_publish is not None:
                self.on_publish(mid, reason_code)
            aiomqtt_publish(c, userdata, mid, reason_code, properties)

        inner.on_connect = on_connect
        inner.on_publish = on_publish
        inner.on_socket_register_write = _register_write(client)
        return client

    # -- state ----------------------------------------------------------------------------

    def _came_up(self, client: aiomqtt.Client) -> None:
        # what the publisher keeps to (paho itself has no limit, see _new_client)
        inflight = max(1, min(self.options.max_inflight, self.receive_maximum))
        self._generation += 1
        self.link = Link(client._client, client._disconnected, self._generation,
                         self.version5)
        down_for = time.monotonic() - self._down_since if self._down_since else 0.0
        self._down_since = None
        self._last_error = None
        self._ready.set()
        self.log.info("mqtt connected", server=self.options.target,
                      protocol="5" if self.version5 else "3.1.1", inflight=inflight,
                      after_seconds=round(down_for, 2))

    def _went_down(self) -> None:
        self._ready.clear()
        self.link = None
        if self._closing:
            return
        if self._down_since is None:       # (health() may have seen the loss first)
            self._down_since = time.monotonic()
        self._logged_at = time.monotonic()
        self.log.warning("mqtt disconnected; reconnecting, no event is dropped",
                         server=self.options.target, error=self._last_error)

    def _failed(self, reason: str, fix: str, retry_in: float, settings: bool = False,
                untrusted: bool = False) -> None:
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        changed = reason != self._last_error
        self._last_error = reason
        if changed or now - self._logged_at >= LOG_EVERY:
            self._logged_at = now
            fields = dict(server=self.options.target, error=reason,
                          retry_in=round(retry_in, 2),
                          down_for=round(now - self._down_since, 1))
            if fix:
                fields["fix"] = fix
            if settings:
                self.log.error("the mqtt broker refuses the sink's settings; the backend "
                               "waits, no event is dropped", **fields)
            elif untrusted:
                self.log.error("the mqtt broker's TLS certificate is not trusted; the backend "
                               "waits, no event is dropped", **fields)
            else:
                self.log.warning("mqtt broker unavailable; retrying, no event is dropped",
                                 **fields)

    def drop(self, link: Link, reason: str) -> None:
        """Give up on ``link`` (the publisher's PUBACK timeout: the broker holds the TCP
        connection but confirms nothing).  The connection is lost from here on like any
        other: :meth:`wait_ready` waits for the next one, ``health()`` shows ``reason``, and
        the socket is shut down so that paho closes it (a broker that reads nothing any more
        would never take a DISCONNECT)."""
        if link is not self.link or link.lost.done():
            return
        self.link = None
        self._last_error = reason
        sock = link.paho.socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass              # closed meanwhile: lost anyway
        link.lost.set_exception(aiomqtt.MqttError(reason))

    async def wait_ready(self) -> Link:
        while True:
            link = self.link
            if link is not None and not link.lost.done():
                return link
            if self._ready.is_set():
                # lost, and _run has not yet seen it (it clears the flag): a moment
                await asyncio.sleep(0.01)
                continue
            await self._ready.wait()

    def health(self) -> Dict[str, Any]:
        link = self.link
        connected = link is not None and not link.lost.done()
        if not connected and self._down_since is None and not self._closing:
            # lost a moment ago; _run has not seen it yet
            self._down_since = time.monotonic()
        since = self._down_since
        return {"connected": connected,
                "down_seconds": None if since is None else round(time.monotonic() - since, 1),
                "server": self.options.target, "last_error": self._last_error,
                "protocol": "5" if self.version5 else "3.1.1"}
