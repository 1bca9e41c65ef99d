"""The websocket listener shared by every backend whose websocket options are the same.

Runs in the dispatcher process, inside its asyncio loop.  One :class:`Hub` per listen address:
a backend's :class:`lapidus.sinks.websocket.WebsocketSink` attaches to it (the first one starts
the server, the last one to close stops it), so the global ``[plugins.websocket]`` of several
backends is one port with one replay window per backend.  Two backends giving different options
for one address is an error naming both.

The opening handshake (:meth:`Hub.check_request`) refuses, before anything is sent: a wrong path
(404), a missing or unknown token (401), an origin not in ``origins`` (403), a malformed query
(400), a full house (503).  Query parameters: ``subjects`` (comma-separated patterns), ``after``
(an event id, once per backend), ``token``, ``snapshot`` (``1``, or backend names: the
subscribed tables' current rows first, :mod:`.snapshots`).  Only the websockets library's
handshake, pings and close are used; event frames are written by :mod:`.clients`.
"""

from __future__ import annotations

import asyncio
import hmac
import http
import logging
import ssl
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

import orjson

from ... import logs
from ..base import SinkError
from .clients import Client, Subscription
from .options import Grant, WebsocketOptions
from .patterns import both, matcher, pattern_problem
from .replay import ReplayBuffer, text_frame
from .snapshots import SETTLED_EVERY, SnapshotRuns, tables_of

#: high-water mark of a client's write buffer (the websocket library's ``write_limit``):
#: above it the client counts as behind and is fed from the replay buffer as it drains
WRITE_LIMIT = 1 << 20
CLOSE_TIMEOUT = 10.0
#: while events keep coming, the pause after writing to the clients is this many times the
#: CPU time those writes took: at most half the dispatcher's CPU goes to client writes
WRITE_PAUSE_FACTOR = 1.0
PARAMETERS = ("subjects", "after", "token", "snapshot")

# The library's own log lines (handshake failures with tracebacks) stay out of Lapidus's log;
# what matters is logged by the hub itself.
_QUIET = logging.getLogger("lapidus.websocket.library")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False

_HUBS: Dict[Tuple[str, int], "Hub"] = {}


class Refused(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def hub_for(settings: WebsocketOptions, backend: str, snapshot_requests=None) -> "Hub":
    """The hub of ``settings``' address, made on first use; ``backend`` attached to it."""
    key = (settings.host, settings.port)
    hub = _HUBS.get(key)
    if hub is None:
        hub = _HUBS[key] = Hub(settings, logs.get_logger(sink="websocket"))
    elif hub.settings != settings:
        other = ", ".join(sorted(hub.buffers))
        raise SinkError(f"websocket sink of backend {backend}: {settings.listen} is already "
                        f"the websocket listener of {other}, with other options; give the "
                        f"backends the same websocket options, or each its own listen address")
    hub.attach(backend, snapshot_requests)
    return hub


class Hub:
    def __init__(self, settings: WebsocketOptions, log):
        self.settings = settings
        self.log = log
        # without client_max_lag, only leaving the replay window closes a client
        self.max_lag = settings.client_max_lag or settings.replay_events
        self.buffers: Dict[str, ReplayBuffer] = {}
        self.attached: List[str] = []
        self.clients: List[Client] = []
        self.pending: "weakref.WeakKeyDictionary[Any, Tuple]" = weakref.WeakKeyDictionary()
        self.snapshots = SnapshotRuns(log)
        self._watching_runs = False
        self.server = None
        self.start_error: Optional[str] = None
        self.down_since: Optional[float] = time.monotonic()
        self.frames_sent: Dict[str, int] = {}     # backend -> event frames written
        self.slow_closed = 0
        self.refused = 0
        self.repeats_skipped: Dict[str, int] = {}
        self.tasks: set = set()
        self._starting: Optional[asyncio.Future] = None
        self.published: Dict[str, int] = {}       # backend -> events handed to the clients
        self._flush: Optional[asyncio.TimerHandle] = None
        self._flushed_at = 0.0
        self._pause = 0.0                         # seconds, after the last writes

    # -- life cycle ---------------------------------------------------------------------

    def attach(self, backend: str, snapshot_requests=None) -> None:
        self.attached.append(backend)
        if backend not in self.buffers:
            self.buffers[backend] = ReplayBuffer(self.settings.replay_events,
                                                 self.settings.replay_bytes)
            self.repeats_skipped[backend] = 0
        self.snapshots.attach(backend, snapshot_requests)

    async def start(self) -> None:
        if self.server is not None:
            return
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._serve())
        try:
            await asyncio.shield(self._starting)
        except BaseException:
            self._starting = None
            raise

    async def _serve(self) -> None:
        from websockets.asyncio.server import serve

        settings = self.settings
        context = None
        if settings.tls_cert_file:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
            except (OSError, ssl.SSLError) as exc:
                raise self._failed(f"cannot load tls_cert_file / tls_key_file: {exc}; give a "
                                   f"PEM certificate chain and its private key") from None
        try:
            self.server = await serve(
                self.handle, settings.host, settings.port, ssl=context,
                process_request=self.check_request, compression=None,
                ping_interval=settings.ping_interval, ping_timeout=settings.ping_timeout,
                close_timeout=CLOSE_TIMEOUT, max_size=1 << 16, max_queue=4,
                write_limit=WRITE_LIMIT, server_header="lapidus", logger=_QUIET)
        except OSError as exc:
            raise self._failed(f"cannot listen on {settings.listen}: {exc.strerror or exc}"
                               + _bind_fix(exc)) from None
        self.down_since = None
        self.start_error = None
        port = next(iter(self.server.sockets)).getsockname()[1]
        self.log.info("websocket listener ready", url=settings.url.replace(
                          f":{settings.port}/", f":{port}/", 1),
                      backends=sorted(self.buffers), tokens=len(settings.grants))

    def _failed(self, message: str) -> SinkError:
        self.start_error = f"websocket sink: {message}"
        return SinkError(self.start_error)

    async def detach(self, backend: str) -> None:
        if backend in self.attached:
            self.attached.remove(backend)
        if self.attached:
            return
        _HUBS.pop((self.settings.host, self.settings.port), None)
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self.server is not None:
            self.server.close()
            try:
                await asyncio.wait_for(self.server.wait_closed(), CLOSE_TIMEOUT)
            except asyncio.TimeoutError:
                pass
            self.server = None

    # -- the handshake ------------------------------------------------------------------

    def check_request(self, connection, request):
        """websockets' ``process_request``: None to accept, an HTTP answer to refuse."""
        try:
            subscription, after, snapshot = self._subscription(request)
        except Refused as refusal:
            self.refused += 1
            self.log.info("websocket client refused", status=refusal.status,
                          reason=refusal.reason, peer=_address(connection))
            response = connection.respond(refusal.status, refusal.reason + "\n")
            if refusal.status == http.HTTPStatus.UNAUTHORIZED:
                response.headers["WWW-Authenticate"] = 'Bearer realm="lapidus"'
            return response
        self.pending[connection] = (subscription, after, snapshot)
        return None

    def _subscription(self, request) -> Tuple[Subscription, Dict[str, str], Optional[Tuple]]:
        settings = self.settings
        parts = urlsplit(request.path)
        if parts.path != settings.path:
            raise Refused(404, f"no websocket here; connect to {settings.path}")
        if len(self.clients) + len(self.pending) >= settings.max_clients:
            raise Refused(503, f"too many clients ({settings.max_clients}, max_clients); "
                               f"try again later")
        try:
            query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False,
                             max_num_fields=200)
        except ValueError as exc:
            raise Refused(400, f"malformed query: {exc}") from None
        unknown = sorted(set(query) - set(PARAMETERS))
        if unknown:
            raise Refused(400, f"unknown parameter {unknown[0]} (known: "
                               + ", ".join(PARAMETERS) + ")")
        grant = self._grant(request, query)
        origin = request.headers.get("Origin")
        if origin is not None and settings.origins is not None \
                and origin not in settings.origins:
            raise Refused(403, f"origin {origin} is not allowed (the sink's origins option)")
        requested = None
        if "subjects" in query:
            requested = tuple(p.strip() for value in query["subjects"]
                              for p in value.split(",") if p.strip())
            for pattern in requested:
                problem = pattern_problem(pattern)
                if problem:
                    raise Refused(400, f"subjects: {problem}")
            if not requested:
                raise Refused(400, "subjects is empty; give patterns such as "
                                   "public.items.>,public.orders.*")
        after = {}
        for event_id in query.get("after", []):
            backend = self._backend_of(event_id)
            if backend is None:
                raise Refused(400, f"after={event_id}: not an event id of a backend served "
                                   f"here (" + ", ".join(sorted(self.buffers)) + ")")
            if backend in after:
                raise Refused(400, f"after= is given twice for backend {backend}; give the "
                                   f"last id received of each backend once")
            after[backend] = event_id
        snapshot = (self._snapshot(query, requested, after, grant) if "snapshot" in query
                    else None)
        key = (requested, grant.subjects if grant else None)
        return Subscription(key, both(*key)), after, snapshot

    def _snapshot(self, query, requested, after, grant: Optional[Grant]
                  ) -> Optional[Tuple[List[str], List[str]]]:
        """``snapshot=1`` (every backend served here) or ``snapshot=shop,crm``: the backends
        and tables to read for the client, or None for ``snapshot=0``.  A token limited to
        some subjects must allow every row of each table: a table is not read for a client
        that would see none or part of it."""
        values = [v.strip() for value in query["snapshot"] for v in value.split(",")
                  if v.strip()]
        if values in (["0"], ["false"]):
            return None
        if values in (["1"], ["true"]):
            backends = sorted(self.buffers)
        else:
            backends = values
            unknown = [b for b in backends if b not in self.buffers]
            if not backends or unknown:
                raise Refused(400, f"snapshot={','.join(values)}: give 1 (every backend served "
                                   f"here) or backend names (" + ", ".join(sorted(self.buffers))
                              + ")")
        if after:
            raise Refused(400, "give snapshot=1 or after=, not both: after= resumes a stream "
                               "from an event, snapshot=1 starts one from the current rows")
        try:
            tables = tables_of(requested)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        if grant is not None and grant.subjects is not None:
            allows = matcher(grant.subjects)
            for pattern in requested:
                table = ".".join(pattern.split(".")[:2])
                if not allows(table + ".%"):      # any key of the table ("%": one token)
                    raise Refused(403, f"snapshot=1: the token does not allow every row of "
                                       f"{table}; ask for tables whose every row it allows")
        unavailable = self.snapshots.unavailable(backends)
        if unavailable:
            raise Refused(400, f"snapshot=1: {unavailable}; load the current rows from the "
                               f"database instead")
        return backends, tables

    def _grant(self, request, query) -> Optional[Grant]:
        grants = self.settings.grants
        given = query.get("token", [])
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, value = header.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise Refused(401, 'the Authorization header must be "Bearer <token>"')
            given = given + [value.strip()]
        if not grants:
            return None
        if not given:
            raise Refused(401, "a token is required: send Authorization: Bearer <token>, "
                               "or ?token=<token>")
        if len(given) > 1:
            raise Refused(400, "give one token (header or ?token=), not several")
        offered = given[0].encode()
        match = None
        for grant in grants:   # every one compared, in constant time: no timing hint
            if hmac.compare_digest(grant.token.encode(), offered):
                match = grant
        if match is None:
            raise Refused(401, "the token is not accepted")
        return match

    def _backend_of(self, event_id: str) -> Optional[str]:
        found = [b for b in self.buffers if event_id.startswith(b + ":")]
        return max(found, key=len) if found else None

    # -- a connection -------------------------------------------------------------------

    async def handle(self, connection) -> None:
        """A client after a successful handshake: gap frames if any, then its stream."""
        subscription, after, snapshot = self.pending.pop(connection, (None, {}, None))
        if subscription is None:
            return
        client = Client(connection, subscription, self)
        gaps, queued = [], b""
        if snapshot is not None:
            # before the client joins: its runs are known before any of their events come
            try:
                labels, queued = self.snapshots.start(client, *snapshot)
            except OSError as exc:
                self.log.error("websocket snapshot run could not be queued", error=str(exc),
                               peer=client.peer)
                await connection.close(1011, f"snapshot=1: cannot queue the run: "
                                             f"{exc.strerror or exc}"[:120])
                return
            client.subscription = subscription.with_runs(frozenset(labels))
            self._watch_runs()
        for backend, buffer in self.buffers.items():
            client.cursors[backend] = buffer.head
            event_id = after.get(backend)
            if event_id is None:
                continue
            cursor = buffer.after(event_id)
            if cursor is None:
                gaps.append(text_frame(orjson.dumps({
                    "type": "gap", "backend": backend, "after": event_id,
                    "oldest": buffer.oldest_id(),
                    "reason": "this id is not in the replay window: older than its oldest "
                              "event, or from before Lapidus restarted",
                    "fix": "reload the state from the database; the events that follow "
                           "are the live stream from now"})))
                continue
            client.cursors[backend] = cursor
            if buffer.head - cursor > self.max_lag:
                client.catching_up.add(backend)
        client.write(queued + b"".join(gaps), 0)
        self.clients.append(client)
        task = asyncio.ensure_future(client.run())
        client.wake.set()
        self.log.info("websocket client connected", peer=client.peer, clients=len(self.clients),
                      subjects=",".join(subscription.key[0] or (">",)),
                      resumed=sorted(after), gaps=len(gaps),
                      snapshot_runs=len(client.subscription.runs))
        try:
            async for _ in connection:
                pass     # clients have nothing to say; reading keeps pings and close working
        except Exception:
            pass
        finally:
            client.closed = True
            client.wake.set()
            task.cancel()
            self.clients.remove(client)
            if snapshot is not None:
                self.snapshots.gone(client)
            self.log.info("websocket client disconnected", peer=client.peer,
                          clients=len(self.clients), frames=client.frames,
                          code=connection.close_code)

    def _watch_runs(self) -> None:
        """While snapshot runs are queued, look for refused or cancelled ones once a second."""
        if self._watching_runs:
            return
        self._watching_runs = True

        async def watch():
            try:
                while self.snapshots.queued() and self.server is not None:
                    await asyncio.sleep(SETTLED_EVERY)
                    self.snapshots.check_settled()
            finally:
                self._watching_runs = False
        self.spawn(watch())

    # -- events -------------------------------------------------------------------------

    def added(self) -> None:
        """New events are in a replay buffer (:meth:`WebsocketSink.send`): write them to the
        clients now, or, when the last writes ended less than a pause ago, at the pause's
        end, with whatever else came meanwhile.  The pause is the CPU time the last writes
        took (``WRITE_PAUSE_FACTOR``): a socket write costs about as much as the Python
        around it, and at 1,000 batches a second and 200 clients one write per client and
        batch would take the dispatcher's whole CPU.  So an idle sink writes at once, and a
        busy one gathers events for as long as its last writes cost, which grows with the
        clients and what the writes cost on this host, not with a fixed figure."""
        if self._flush is not None:
            return
        loop = asyncio.get_running_loop()
        delay = self._flushed_at + self._pause - loop.time()
        if delay <= 0:
            self.flush()
        else:
            self._flush = loop.call_later(delay, self.flush)

    def flush(self) -> None:
        self._flush = None
        # CPU time, not wall time: writes preempted on a crowded host do not lengthen the pause
        started = time.thread_time()
        for backend, buffer in self.buffers.items():
            start = self.published.get(backend, 0)
            if start < buffer.head:
                self.publish(backend, start)
        self._pause = (time.thread_time() - started) * WRITE_PAUSE_FACTOR
        # from the end of the writes: the pause follows them, however long they took
        self._flushed_at = asyncio.get_running_loop().time()

    def publish(self, backend: str, start: int) -> None:
        """The events ``start`` .. head of ``backend``'s buffer are new: write them to every
        caught-up client now, once matched per subscription; wake the others.  Then trim the
        buffer: after the writes, so a batch larger than the window still goes out."""
        buffer = self.buffers[backend]
        end = buffer.head
        self.published[backend] = end
        entries = buffer.entries(start, end)
        matched: Dict[Tuple, Tuple[bytes, int]] = {}
        behind = []
        for client in self.clients:
            if client.closed:
                continue
            cursor = client.cursors.setdefault(backend, start)
            if cursor == start and client.writable():
                key = client.subscription.key
                frames = matched.get(key)
                if frames is None:
                    frames = matched[key] = client.subscription.frames(entries)
                client.write(*frames, backend)
                client.cursors[backend] = end
            else:
                behind.append(client)
        buffer.trim()
        for client in behind:
            client.check_lag(backend, buffer)
            client.wake.set()

    def sent(self, backend: str, count: int) -> None:
        self.frames_sent[backend] = self.frames_sent.get(backend, 0) + count

    def spawn(self, coroutine) -> None:
        """Run ``coroutine`` in the background, holding on to its task until it ends."""
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def dropped(self, client: Client, why: str) -> None:
        self.slow_closed += 1
        self.log.warning("websocket client too slow; closing it (1008), other clients and the "
                         "backend are not held back", peer=client.peer, reason=why)

    def health(self, backend: str) -> Dict[str, Any]:
        buffer = self.buffers[backend]
        since = self.down_since
        return {"connected": self.server is not None,
                "down_seconds": None if since is None or self.server is not None
                else round(time.monotonic() - since, 1),
                "server": self.settings.url, "last_error": self.start_error,
                "clients": len(self.clients), "frames_sent": self.frames_sent.get(backend, 0),
                "slow_clients_closed": self.slow_closed, "refused": self.refused,
                "replay_events": len(buffer), "replay_bytes": buffer.bytes,
                "repeats_skipped": self.repeats_skipped.get(backend, 0),
                "snapshot_runs": len(self.snapshots.runs.get(backend, {}))}


def _address(connection) -> Optional[str]:
    try:
        address = connection.remote_address
        return f"{address[0]}:{address[1]}"
    except Exception:
        return None


def _bind_fix(exc: OSError) -> str:
    import errno
    if exc.errno == errno.EADDRINUSE:
        return ("; another program (or another backend's websocket sink with other options) "
                "listens there: choose another listen port")
    if exc.errno == errno.EADDRNOTAVAIL:
        return "; that is not an address of this machine: use 127.0.0.1 or 0.0.0.0"
    if exc.errno == errno.EACCES:
        return "; ports below 1024 need root or CAP_NET_BIND_SERVICE: use 1024 or above"
    return ""
