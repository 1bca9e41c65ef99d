"""The replication reader of a PostgreSQL backend in cluster mode: confirms what the sinks acked.

In cluster mode the spool is only a local buffer (another node cannot read it), so the slot's
``confirmed_flush_lsn`` is the position a new owner resumes from, and it must never pass what the
sinks acknowledged.  ``pg_recvlogical`` confirms what it fsynced to the spool, so it cannot be
used here; this child takes its place.  It streams the slot over libpq (``replication=database``,
``START_REPLICATION ... LOGICAL``) and writes each message exactly as ``pg_recvlogical -f``
does (the message's bytes, then ``\\n``) into ``<state>/spool/active``, so the worker's
spool reader and decoders are the same as without ``[cluster]``.  What it confirms to the server
comes from the worker (:class:`WalStream.ack`, a line on the child's stdin), after the worker's
checkpoint is saved in the cluster bucket:

* ``lsn``: the saved checkpoint's last complete transaction's commit LSN + 1 (the server
  resumes after a transaction whose commit record lies *before* the confirmed position, so a
  transaction partly delivered is sent again whole);
* ``segment offset``: the saved checkpoint's spool position.

:class:`Confirmation` is the rule: the flush position sent is the largest acked ``lsn``, or the
``wal_end`` of a keepalive read after everything written before it had been delivered (idle,
or only changes no table of this backend has: the slot must not hold WAL for ever), never
lower than the slot's position at the start and never more.  libpq is called through ctypes
because psycopg2's replication cursor moves its flush position to a keepalive's ``wal_end`` on
its own, judged by what it *read*, not by what the sinks acknowledged.

Runs as ``python -m lapidus.workers.postgresql.walstream`` (a child of the PostgreSQL worker,
which gives it the libpq connection string without the password in argv; ``PGPASSWORD`` and
``PGOPTIONS`` in the environment).  SIGHUP: reopen ``active`` (the spool rotated).  SIGINT or
SIGTERM, or the worker's end of stdin closing: read the last acks, confirm, end the stream.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import errno
import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Deque, List, Optional, Tuple

from .recvlogical import SpoolChild

Position = Tuple[int, int]       # (spool segment, offset)

_PG_EPOCH = 946_684_800          # 2000-01-01 UTC in Unix seconds
_XLOGDATA = struct.Struct(">QQq")            # dataStart, walEnd, sendTime
_KEEPALIVE = struct.Struct(">QqB")           # walEnd, sendTime, reply requested
_FEEDBACK = struct.Struct(">cQQQqB")         # 'r', write, flush, apply, sendTime, reply
KEEPALIVES_KEPT = 4096
WRITE_CHUNK = 1 << 20


class Confirmation:
    """What may be confirmed to the server: see the module docstring.

    ``floor`` is the slot's ``confirmed_flush_lsn`` when the stream started (confirming less
    would move it backwards).
    """

    def __init__(self, floor: int = 0):
        self.floor = floor
        self.acked = 0                        # commit LSN + 1 of the last saved transaction
        self.delivered: Optional[Position] = None   # the saved checkpoint's spool position
        # keepalives read: (bytes written before it, its wal_end), oldest first
        self.keepalives: Deque[Tuple[Position, int]] = collections.deque()
        self.confirmed = floor

    def ack(self, lsn: int, delivered: Position) -> None:
        """The worker saved a checkpoint: ``lsn`` and its spool position."""
        self.acked = max(self.acked, lsn)
        if self.delivered is None or delivered > self.delivered:
            self.delivered = delivered

    def keepalive(self, written: Position, wal_end: int) -> None:
        """A keepalive read when ``written`` was the end of what the spool held."""
        kept = self.keepalives
        if kept and kept[-1][0] == written:
            if wal_end > kept[-1][1]:
                kept[-1] = (written, wal_end)
            return
        if kept and wal_end <= kept[-1][1]:
            return
        kept.append((written, wal_end))
        if len(kept) > KEEPALIVES_KEPT:
            # the worker is far behind: forget the oldest (a later one covers more anyway)
            kept.popleft()

    def flush_lsn(self) -> int:
        """The position to confirm now (0: nothing to confirm yet, the server ignores 0)."""
        best = max(self.confirmed, self.acked)
        delivered, kept = self.delivered, self.keepalives
        while kept and delivered is not None and kept[0][0] <= delivered:
            best = max(best, kept.popleft()[1])
        self.confirmed = best
        return best


# -- libpq ----------------------------------------------------------------------------------

CONNECTION_OK = 0
PGRES_COPY_BOTH = 8


def _libpq():
    # the system's libpq, which psycopg2 is built against too
    names = [ctypes.util.find_library("pq"), "libpq.so.5"]
    for name in names:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise OSError("libpq not found (apt-get install libpq5)")
    vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    for fn, res, args in (
            ("PQconnectdb", vp, [cp]), ("PQstatus", i, [vp]), ("PQerrorMessage", cp, [vp]),
            ("PQexec", vp, [vp, cp]), ("PQresultStatus", i, [vp]),
            ("PQresultErrorMessage", cp, [vp]), ("PQclear", None, [vp]), ("PQsocket", i, [vp]),
            ("PQconsumeInput", i, [vp]),
            ("PQgetCopyData", i, [vp, ctypes.POINTER(ctypes.POINTER(ctypes.c_char)), i]),
            ("PQfreemem", None, [vp]), ("PQputCopyData", i, [vp, cp, i]), ("PQflush", i, [vp]),
            ("PQputCopyEnd", i, [vp, cp]), ("PQgetResult", vp, [vp]), ("PQfinish", None, [vp]),
            ("PQescapeIdentifier", vp, [vp, cp, ctypes.c_size_t])):
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args
    return lib


class StreamError(Exception):
    """The connection or the stream failed; the message is libpq's or the server's."""


def start_command(slot: str, plugin_options: List[str], start_lsn: int = 0) -> str:
    """``START_REPLICATION SLOT ... LOGICAL ...`` with ``-o``-style ``name=value`` options."""
    options = []
    for option in plugin_options:
        name, _, value = option.partition("=")
        item = '"' + name.replace('"', '""') + '"'
        if value:
            item += " '" + value.replace("'", "''") + "'"
        options.append(item)
    command = (f'START_REPLICATION SLOT "{slot}" LOGICAL '
               f"{start_lsn >> 32:X}/{start_lsn & 0xFFFFFFFF:X}")
    return command + (f" ({', '.join(options)})" if options else "")


def _now_pg() -> int:
    return int((time.time() - _PG_EPOCH) * 1_000_000)


class Receiver:
    """The child's state: the connection, the output file, the confirmation rule."""

    def __init__(self, conninfo: str, slot: str, output: str, plugin_options: List[str],
                 floor: int, status_interval: float):
        self.lib = _libpq()
        self.conninfo = conninfo
        self.slot = slot
        self.output = output
        self.plugin_options = plugin_options
        self.status_interval = status_interval
        self.rule = Confirmation(floor)
        self.conn = None
        self.fd: Optional[int] = None
        self.segment = 0
        self.offset = 0
        self.received = 0
        self.sent_flush = -1
        self.pending: List[bytes] = []
        self.pending_bytes = 0
        self.stdin_buffer = b""

    # -- connection

    def connect(self) -> None:
        lib = self.lib
        self.conn = lib.PQconnectdb((self.conninfo + " replication=database").encode())
        if lib.PQstatus(self.conn) != CONNECTION_OK:
            raise StreamError(self._error())
        result = lib.PQexec(self.conn, start_command(self.slot, self.plugin_options).encode())
        try:
            if lib.PQresultStatus(result) != PGRES_COPY_BOTH:
                message = lib.PQresultErrorMessage(result) or b""
                raise StreamError("could not start replication: "
                                  + message.decode("utf-8", "replace").strip())
        finally:
            lib.PQclear(result)

    def _error(self) -> str:
        message = self.lib.PQerrorMessage(self.conn) or b""
        return message.decode("utf-8", "replace").strip() or "connection failed"

    def close(self) -> None:
        if self.conn is not None:
            self.lib.PQfinish(self.conn)
            self.conn = None

    # -- output

    def reopen(self) -> None:
        """(Re)open ``active``: its target is the segment to write (created if missing)."""
        self.write_pending()
        if self.fd is not None:
            os.close(self.fd)
        self.fd = os.open(self.output, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                          0o600)
        target = os.readlink(self.output) if os.path.islink(self.output) else "0.seg"
        self.segment = int(os.path.basename(target).split(".")[0] or 0)
        self.offset = os.fstat(self.fd).st_size

    def write_pending(self) -> None:
        if not self.pending:
            return
        data = b"".join(self.pending)
        self.pending, self.pending_bytes = [], 0
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        self.offset += len(data)

    def written(self) -> Position:
        return (self.segment, self.offset + self.pending_bytes)

    # -- the stream

    def read_available(self) -> bool:
        """Take in every complete message now available; True when feedback is asked for."""
        lib = self.lib
        if lib.PQconsumeInput(self.conn) != 1:
            raise StreamError(self._error())
        reply = False
        buffer = ctypes.POINTER(ctypes.c_char)()
        while True:
            n = lib.PQgetCopyData(self.conn, ctypes.byref(buffer), 1)
            if n == 0:
                break
            if n == -1:
                result = lib.PQgetResult(self.conn)
                message = (lib.PQresultErrorMessage(result) or b"") if result else b""
                if result:
                    lib.PQclear(result)
                raise StreamError("the server ended the stream: " + (
                    message.decode("utf-8", "replace").strip() or "no message"))
            if n < 0:
                raise StreamError(self._error())
            try:
                data = ctypes.string_at(buffer, n)
            finally:
                lib.PQfreemem(buffer)
            kind = data[0:1]
            if kind == b"w":
                start, _end, _t = _XLOGDATA.unpack_from(data, 1)
                self.received = max(self.received, start)
                payload = data[25:]
                self.pending.append(payload + b"\n")
                self.pending_bytes += len(payload) + 1
                if self.pending_bytes >= WRITE_CHUNK:
                    self.write_pending()
            elif kind == b"k":
                wal_end, _t, asked = _KEEPALIVE.unpack_from(data, 1)
                self.received = max(self.received, wal_end)
                self.rule.keepalive(self.written(), wal_end)
                reply = reply or bool(asked)
        self.write_pending()
        return reply

    def take_acks(self, data: bytes) -> None:
        """Lines ``<lsn> <segment> <offset>`` from the worker."""
        self.stdin_buffer += data
        *lines, self.stdin_buffer = self.stdin_buffer.split(b"\n")
        for line in lines:
            parts = line.split()
            if len(parts) == 3:
                lsn, segment, offset = (int(p) for p in parts)
                self.rule.ack(lsn, (segment, offset))

    def feedback(self, *, reply: bool = False, force: bool = False) -> bool:
        """Send the standby status update when the flush position moved (or when asked)."""
        flush = self.rule.flush_lsn()
        if not force and not reply and flush == self.sent_flush:
            return False
        write = max(self.received, flush)
        message = _FEEDBACK.pack(b"r", write, flush, flush, _now_pg(), 0)
        if self.lib.PQputCopyData(self.conn, message, len(message)) != 1 or \
                self.lib.PQflush(self.conn) != 0:
            raise StreamError(self._error())
        self.sent_flush = flush
        return True

    def finish(self) -> None:
        """End the stream politely: last feedback, CopyDone."""
        try:
            self.write_pending()
            self.feedback(force=True)
            self.lib.PQputCopyEnd(self.conn, None)
            self.lib.PQflush(self.conn)
        except StreamError:
            pass


def main(argv: Optional[List[str]] = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="lapidus-walstream")
    parser.add_argument("--conninfo", required=True)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--floor", type=int, default=0)
    parser.add_argument("--status-interval", type=float, default=1.0)
    parser.add_argument("-o", dest="options", action="append", default=[])
    args = parser.parse_args(argv)
    name = "lapidus-walstream"

    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    signal.set_wakeup_fd(wake_w)
    flags = {"hup": False, "stop": False}

    def on_hup(*_):
        flags["hup"] = True

    def on_stop(*_):
        flags["stop"] = True

    signal.signal(signal.SIGHUP, on_hup)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGTERM, on_stop)
    stdin = sys.stdin.fileno()
    fcntl.fcntl(stdin, fcntl.F_SETFL, fcntl.fcntl(stdin, fcntl.F_GETFL) | os.O_NONBLOCK)

    receiver = Receiver(args.conninfo, args.slot, args.output, args.options, args.floor,
                        args.status_interval)

    def read_stdin() -> None:
        while True:
            try:
                data = os.read(stdin, 65536)
            except BlockingIOError:
                return
            if not data:
                flags["stop"] = True      # the worker is gone
                return
            receiver.take_acks(data)

    try:
        receiver.reopen()
        receiver.connect()
        sock = receiver.lib.PQsocket(receiver.conn)
        print(f"{name}: streaming slot {args.slot}", file=sys.stderr, flush=True)
        next_status = 0.0
        while True:
            now = time.monotonic()
            try:
                ready, _, _ = select.select([sock, stdin, wake_r], [], [],
                                            max(0.0, next_status - now))
            except InterruptedError:
                ready = []
            if wake_r in ready:
                try:
                    while os.read(wake_r, 256):
                        pass
                except BlockingIOError:
                    pass
            if stdin in ready:
                read_stdin()
            if flags["hup"]:
                flags["hup"] = False
                receiver.reopen()
            if flags["stop"]:
                read_stdin()
                receiver.finish()
                return 0
            reply = receiver.read_available() if sock in ready else False
            now = time.monotonic()
            due = now >= next_status
            if receiver.feedback(reply=reply, force=due) or due:
                next_status = now + args.status_interval
    except StreamError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except OSError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        receiver.close()


# -- the worker's side ----------------------------------------------------------------------

class WalStream(SpoolChild):
    """The child as the PostgreSQL worker sees it: :class:`SpoolChild`'s calls, as for
    ``pg_recvlogical``, plus :meth:`ack`."""

    program = "lapidus-walstream"
    STATUS_KEY = "walstream_pid"            # its pid's name in the backend's status

    def __init__(self, *, floor: int = 0, **child):
        super().__init__(**child)
        self.floor = floor
        self._last_ack: Optional[bytes] = None

    def argv(self) -> List[str]:
        from .recvlogical import conninfo
        status = max(0.2, float(self.options.get("status_interval", 1.0)))
        argv = [sys.executable, "-m", "lapidus.workers.postgresql.walstream",
                "--conninfo", conninfo(self.options, self.application_name),
                "--slot", self.slot, "--output", str(self.output),
                "--floor", str(self.floor), f"--status-interval={status:g}"]
        for opt in self.plugin_options:
            argv += ["-o", opt]
        return argv

    def start(self) -> None:
        from .recvlogical import child_environment
        env = child_environment(self.options)
        # the child imports this package: the worker's own import path, whatever the cwd
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(
            [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self._popen(env, subprocess.PIPE)
        fd = self.proc.stdin.fileno()
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        if self._last_ack is not None:
            self._send(self._last_ack)

    def ack(self, lsn: int, segment: int, offset: int) -> None:
        """The worker's checkpoint is saved: the child may confirm up to ``lsn`` (see the
        module docstring)."""
        self._last_ack = f"{lsn} {segment} {offset}\n".encode()
        self._send(self._last_ack)

    def _send(self, line: bytes) -> None:
        if not self.running():
            return
        try:
            os.write(self.proc.stdin.fileno(), line)
        except OSError as exc:
            # full (the child is busy: a later ack says more) or gone (noticed by the worker's
            # supervision of the child); either way nothing to do here
            if exc.errno not in (errno.EAGAIN, errno.EPIPE):
                raise


if __name__ == "__main__":
    sys.exit(main())
