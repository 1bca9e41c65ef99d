"""Connections to MySQL/MariaDB: connect, name failures (fatal or not), watch the binlog stream.

Runs in the mysql worker process, after fork.

:class:`WatchedConnection` is the pymysql connection python-mysql-replication gets for both its
binlog stream and its control queries.  Once the binlog dump command has been sent it changes
two things on the stream:

* a read at a packet boundary waits only until :attr:`WatchedConnection.deadline` and then
  raises :class:`Idle`, having consumed nothing; so ``Source.read(timeout)`` returns on time
  and the stream continues exactly where it was.  (A plain socket timeout would not do: pymysql
  closes the connection on any timeout.)  The wait is a ``poll`` on the socket, so a change
  is picked up the moment its bytes arrive.
* when no byte at all (events or the server's heartbeats) arrived for ``dead_after`` seconds
  it raises :class:`LinkDead`.
* the wait also ends, with :class:`Idle`, when :attr:`WatchedConnection.wake_fd` (the worker's
  wake-up pipe, set for the reads of the worker loop) becomes readable.

Neither is a pymysql error, so nothing in the library can "helpfully" reconnect (its reconnect
replays from the original start position).

Retrying is not done here: :func:`connect` makes one attempt, and a transient failure goes to
the worker loop, which waits and opens the source again (:mod:`lapidus.workers.waiting`).
"""

from __future__ import annotations

import select
import time
from typing import Any, Optional

import pymysql
from pymysql.connections import MAX_PACKET_LEN, MysqlPacket

from ..base import BackendError
from .settings import MysqlSettings
from .tls import describe_tls_failure, preferred_context

COM_BINLOG_DUMP = 0x12
COM_BINLOG_DUMP_GTID = 0x1E
# Below glibc's mmap threshold (128 KiB): a larger read buffer is mapped, shrunk and unmapped
# for every read (three system calls; over TLS each read is one record of at most 16 KiB).
_CHUNK = 64 * 1024

# pymysql / server error numbers this module tells apart.
CR_CONN_HOST_ERROR = 2003
CR_SERVER_GONE = 2006
CR_SERVER_LOST = 2013
ER_ACCESS_DENIED = 1045
ER_DBACCESS_DENIED = 1044
ER_HOST_NOT_PRIVILEGED = 1130
ER_HOST_IS_BLOCKED = 1129
ER_SPECIFIC_ACCESS_DENIED = 1227
ER_MASTER_FATAL_READING_BINLOG = 1236
ER_CON_COUNT = 1040
ER_TOO_MANY_USER_CONNECTIONS = 1203
ER_SLAVE_SAME_ID = 4052          # MariaDB; MySQL says it inside error 1236

# The worker's own queries (checks, binlog retention, JSON column look-ups) on the query
# connection give up after this long: a hung server cannot freeze the worker.
QUERY_TIMEOUT = 15.0


class Idle(Exception):
    """Nothing arrived before the read deadline; no byte of the stream was consumed."""


class LinkDead(Exception):
    """No byte (not even a heartbeat) for longer than the dead-link limit."""


class _StreamBuffer:
    """Stands in for pymysql's buffered socket file on a binlog stream.

    pymysql reads through ``sock.makefile()``, whose buffer cannot be inspected without a
    blocking read; this one can (:meth:`pending`), which is what lets the connection tell
    "a packet is already here" from "wait on the socket".
    """

    __slots__ = ("_sock", "_buf", "_pos", "last_received")

    def __init__(self, sock):
        self._sock = sock
        self._buf = b""
        self._pos = 0
        self.last_received = time.monotonic()

    def pending(self) -> int:
        return len(self._buf) - self._pos

    def read(self, n: int) -> bytes:
        end = self._pos + n
        if end <= len(self._buf):
            out = self._buf[self._pos:end]
            self._pos = end
            return out
        parts = [self._buf[self._pos:]]
        have = len(parts[0])
        while have < n:
            chunk = self._sock.recv(max(_CHUNK, n - have))
            if not chunk:
                break       # EOF: pymysql sees a short read and reports the connection lost
            self.last_received = time.monotonic()
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self._buf = data
        self._pos = min(n, len(data))
        return data[:n]

    def push_back(self, data: bytes) -> None:
        """Make ``data`` (just read) the next bytes read again."""
        self._buf = data + self._buf[self._pos:]
        self._pos = 0

    def close(self) -> None:
        self._buf = b""
        self._pos = 0


class WatchedConnection(pymysql.connections.Connection):
    """A pymysql connection that becomes deadline-aware once it streams a binlog."""

    def __init__(self, *args: Any, dead_after: float = 30.0, **kwargs: Any):
        self.deadline = 0.0
        self.dead_after = dead_after
        self._stream: Optional[_StreamBuffer] = None
        self._poller: Optional[select.poll] = None
        self._wake_fd: Optional[int] = None
        if "db" in kwargs:     # python-mysql-replication still passes pymysql's old name
            kwargs["database"] = kwargs.pop("db")
        super().__init__(*args, **kwargs)

    def _create_ssl_ctx(self, sslp):
        # pymysql asks for {} in its preferred mode (no TLS settings given); an explicit
        # context (TLS settings, lapidus.workers.mysql.tls) is passed through as it is.
        if isinstance(sslp, dict) and not sslp:
            return preferred_context()
        return super()._create_ssl_ctx(sslp)

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    @property
    def wake_fd(self) -> Optional[int]:
        return self._wake_fd

    @wake_fd.setter
    def wake_fd(self, fd: Optional[int]) -> None:
        """Also end a wait for the stream when ``fd`` is readable (None: do not)."""
        if fd == self._wake_fd:
            return
        if self._poller is not None:
            if self._wake_fd is not None:
                self._poller.unregister(self._wake_fd)
            if fd is not None:
                self._poller.register(fd, select.POLLIN)
        self._wake_fd = fd

    def _write_bytes(self, data: bytes) -> None:
        super()._write_bytes(data)
        # The dump request is the last thing the client ever sends on this connection; the
        # server answers nothing before it, so pymysql's read buffer is empty at this point.
        if len(data) > 4 and data[4] in (COM_BINLOG_DUMP, COM_BINLOG_DUMP_GTID) \
                and self._sock is not None:
            self._stream = _StreamBuffer(self._sock)
            self._rfile = self._stream
            self._poller = select.poll()
            self._poller.register(self._sock, select.POLLIN | select.POLLPRI)
            if self._wake_fd is not None:
                self._poller.register(self._wake_fd, select.POLLIN)

    def read_payload(self) -> bytes:
        """The next packet's payload on the binlog stream: pymysql's ``_read_packet``
        (waiting as above, sequence numbers, packets of 16 MiB and more, error packets
        raised as pymysql errors) without building a ``MysqlPacket`` for every event."""
        stream = self._stream
        if not stream.pending():
            self._await_bytes(stream)
        if self._current_timeout != self._read_timeout:
            self._sock.settimeout(self._read_timeout)
            self._current_timeout = self._read_timeout
        parts = []
        while True:
            header = self._read_bytes(4)
            length = header[0] | header[1] << 8 | header[2] << 16
            if header[3] != self._next_seq_id:
                # pymysql's own errors for it (a server that shut down sends seq 0)
                stream.push_back(header)
                return super()._read_packet()._data
            self._next_seq_id = (self._next_seq_id + 1) % 256
            parts.append(self._read_bytes(length))
            if length < MAX_PACKET_LEN:
                break
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if data[:1] == b"\xff":
            MysqlPacket(data, self.encoding).raise_for_error()
        return data

    def _await_bytes(self, stream: _StreamBuffer) -> None:
        # Over TLS, decrypted bytes can wait inside the SSL object where poll() cannot see
        # them: they are ready now.
        pending = getattr(self._sock, "pending", None)
        if pending is not None and pending():
            return
        wait = self.deadline - time.monotonic()
        ready = self._poller.poll(max(0.0, wait) * 1000.0)
        if ready:
            if len(ready) > 1 or ready[0][0] != self._wake_fd:
                return      # the stream has bytes (or an error pymysql will name)
            raise Idle()    # woken: the worker loop has something else to do
        silent = time.monotonic() - stream.last_received
        if silent > self.dead_after:
            raise LinkDead(f"no data and no heartbeat for {silent:.0f} s")
        raise Idle()


def describe_error(settings: MysqlSettings, exc: BaseException) -> BackendError:
    """A pymysql error during connect or streaming, as the operator should read it.

    Fatal when retrying cannot help (credentials, privileges, purged binlog); transient
    otherwise.  Never includes the password.
    """
    who = settings.describe()
    where = settings.address
    code = exc.args[0] if getattr(exc, "args", None) and isinstance(exc.args[0], int) else None
    text = exc.args[1] if code is not None and len(exc.args) > 1 else str(exc)
    tls = describe_tls_failure(settings, exc)
    if tls is not None:
        return tls
    if code == ER_SLAVE_SAME_ID or "same server_uuid/server_id" in text \
            or "same server_id" in text:
        return server_id_clash(settings, text)
    if code == ER_ACCESS_DENIED:
        return BackendError(
            f"{who}: access denied for user \"{settings.user}\" at {where} ({text}); check the "
            f"backend's user and password", fatal=True)
    if code == ER_HOST_NOT_PRIVILEGED:
        return BackendError(
            f"{who}: {where} does not let this host connect ({text}); create the user for this "
            f"host (CREATE USER '{settings.user}'@'<this host>')", fatal=True)
    if code == ER_DBACCESS_DENIED:
        return BackendError(f"{who}: {text}; grant the user access to the database", fatal=True)
    if code == ER_SPECIFIC_ACCESS_DENIED:
        return BackendError(
            f"{who}: user \"{settings.user}\" lacks a privilege at {where} ({text}); "
            f"GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO '{settings.user}'",
            fatal=True)
    if code == ER_HOST_IS_BLOCKED:
        return BackendError(
            f"{who}: {where} blocks this host after too many failed connections ({text}); run "
            f"FLUSH HOSTS (mariadb-admin flush-hosts) on the server")
    if code in (ER_CON_COUNT, ER_TOO_MANY_USER_CONNECTIONS):
        return BackendError(f"{who}: {where} refuses more connections ({text}); will retry")
    if code in (CR_CONN_HOST_ERROR, CR_SERVER_GONE, CR_SERVER_LOST) or code is None or code >= 2000:
        return BackendError(
            f"{who}: cannot reach MySQL/MariaDB at {where} ({text}); check that the server "
            f"runs and that host and port are right")
    return BackendError(f"{who}: server error {code} at {where}: {text}")


def server_id_clash(settings: MysqlSettings, text: str) -> BackendError:
    """The server dropped this reader because another one connected with its server_id.

    Fatal on purpose: reconnecting would knock the other reader off in turn, and the two
    would take the stream from each other for ever.
    """
    return BackendError(
        f"{settings.describe()}: {settings.address} disconnected this reader because another "
        f"one connected with the same server_id {settings.server_id} ({text}); give every "
        f"reader of the server its own server_id (SHOW SLAVE HOSTS lists them; leaving "
        f"server_id unset derives one from this host and the backend name)", fatal=True)


def connect(settings: MysqlSettings, **extra: Any) -> WatchedConnection:
    """One connection attempt for queries; failures become a :class:`BackendError` saying
    whether retrying can help (:func:`describe_error`).  Its queries time out after
    ``QUERY_TIMEOUT`` seconds."""
    kwargs = dict(read_timeout=QUERY_TIMEOUT, write_timeout=QUERY_TIMEOUT)
    kwargs.update(extra)
    try:
        return WatchedConnection(**settings.connection_kwargs(**kwargs))
    except pymysql.err.MySQLError as exc:
        raise describe_error(settings, exc) from None
