"""The link between workers and the dispatcher: a unix stream socket with length-prefixed frames.

Why a socket per worker rather than one shared ``multiprocessing.Queue``: a queue's writers share
a lock and a pipe, and a writer killed with SIGKILL in the middle of a ``put`` can leave the lock
held or a torn message in the pipe, wedging every other backend (the stdlib documents this).  A
connection per worker has a single writer; when a worker dies only its own connection closes.

Frame: 4-byte big-endian length, 1-byte kind, pickled payload.  Both ends are Lapidus processes
of the same service user; the socket lives in a 0700 directory.

* worker -> dispatcher: ``HELLO {"backend": name, "config": BackendConfig}``,
  ``BATCH (seq, [Record fields, ...], at_boundary, routed)`` (plain tuples in
  :class:`lapidus.events.Record` order; ``at_boundary``: :class:`lapidus.workers.base.Batch`'s,
  one bool per batch; an empty list with it true says that the last batch's transaction ended;
  ``routed``: the batch may hold events of a run made for one sink, :mod:`lapidus.sink_runs`)
* dispatcher -> worker: ``ACK seq`` (every batch up to ``seq`` is confirmed by all sinks);
  ``HELD [plugin name, ...]`` (these sinks hold what is in flight: they are down, or refuse an
  event for good; sent again every second while it lasts, and an ACK says the wait is over)
"""

from __future__ import annotations

import io
import pickle
import select
import socket
import struct
import time
from typing import Any, Iterator, List, Optional, Tuple

HEADER = struct.Struct(">IB")
HELLO, BATCH, ACK, HELD = 1, 2, 3, 4


def pack(kind: int, payload: Any) -> bytes:
    body = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body), kind) + body


def pack_batch(seq: int, records: list, at_boundary: bool = False,
               routed: bool = False) -> bytes:
    """``pack(BATCH, (seq, records, at_boundary, routed))``, pickled without the memo (the pickler's
    fast mode).

    A batch is thousands of small strings and bytes, none of them shared and nothing
    referring to itself: the memo (a dict entry and a PUT for every object, so that a second
    reference can point back) is pure cost there, most of the pickling time and a good part
    of the unpickling (docs/dev/benchmarks.md, Snapshot); the frame is a few percent larger, as
    a string that repeats (``"read"``, the table) is written again.  The unpickler reads it
    like any other pickle.  Not for payloads that could refer to themselves: fast mode would
    recurse without end.  Runs in the worker process.
    """
    buffer = io.BytesIO()
    buffer.write(bytes(HEADER.size))        # the header, once the length is known
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.fast = True
    pickler.dump((seq, records, at_boundary, routed))
    HEADER.pack_into(buffer.getbuffer(), 0, buffer.tell() - HEADER.size, BATCH)
    return buffer.getvalue()


def frames_in(buffer: bytearray) -> Iterator[Tuple[int, Any, int]]:
    """``(kind, payload, end)`` of each complete frame at the start of ``buffer``, ``end``
    being the offset just past it."""
    pos, size = 0, len(buffer)
    while size - pos >= HEADER.size:
        length, kind = HEADER.unpack_from(buffer, pos)
        end = pos + HEADER.size + length
        if end > size:
            return
        yield kind, pickle.loads(buffer[pos + HEADER.size:end]), end
        pos = end


def unpack_from(buffer: bytearray) -> Tuple[List[Tuple[int, Any]], int]:
    """Complete frames in ``buffer`` and the number of bytes they used."""
    out, used = [], 0
    for kind, payload, used in frames_in(buffer):
        out.append((kind, payload))
    return out, used


class LinkLost(Exception):
    """The dispatcher closed the connection (it died or is shutting down)."""


class DispatcherLink:
    """The worker's end.  Blocking sends, non-blocking ack reads.  Runs in a worker process."""

    def __init__(self, path: str, backend: str, connect_timeout: float = 30.0,
                 config: Any = None):
        """Connect and say HELLO; ``config`` (the worker's BackendConfig, its plugins resolved)
        goes with it, so the dispatcher builds this backend's sinks from the worker's own
        configuration, also for a backend added or changed by a reload."""
        deadline = time.monotonic() + connect_timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if time.monotonic() > deadline:
                    raise LinkLost(f"dispatcher socket {path} did not accept a connection")
                time.sleep(0.05)
        self.sock = sock
        self._buffer = bytearray()
        # the sinks the dispatcher last said hold the batches (HELD), until an ack comes: a
        # worker that stops does not wait for acks they cannot give (WorkerLoop._drain)
        self.held_by: List[str] = []
        hello = {"backend": backend}
        if config is not None:
            hello["config"] = config
        self.sock.sendall(pack(HELLO, hello))

    def send_batch(self, seq: int, records: list, at_boundary: bool = False,
                   routed: bool = False) -> None:
        try:
            self.sock.sendall(pack_batch(seq, records, at_boundary, routed))
        except OSError as exc:
            raise LinkLost(f"dispatcher connection lost: {exc}") from None

    def acks(self, timeout: float = 0.0) -> Optional[int]:
        """The highest acknowledged sequence that arrived within ``timeout``, or None;
        :attr:`held_by` follows the HELD frames that came with it."""
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        try:
            data = self.sock.recv(65536)
        except OSError as exc:   # reset when the dispatcher died with our batches unread
            raise LinkLost(f"dispatcher connection lost: {exc}") from None
        if not data:
            raise LinkLost("dispatcher closed the connection")
        self._buffer += data
        frames, used = unpack_from(self._buffer)
        del self._buffer[:used]
        acked = None
        for kind, payload in frames:
            if kind == ACK:
                acked = payload
                self.held_by = []
            elif kind == HELD:
                self.held_by = payload
        return acked

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
