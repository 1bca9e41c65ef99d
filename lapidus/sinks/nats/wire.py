"""Hand messages to nats-py and take acks from it, at the rate the JetStream goal needs.

Runs in the dispatcher process, inside its asyncio loop.

Why not only the public API: ``Client.publish(headers=dict)`` validates and encodes the header
dict on every call, and a subscription hands each message through a ``Msg`` object, a queue and
a task, per event.  Here messages go to nats-py in runs of encoded ``HPUB`` commands
(:class:`Frames`, one buffer append per run instead of one call per message), and acks are
read off the front of each socket read before nats-py's parser (``_read_acks_first``); what
that saves per event is measured in docs/dev/benchmarks.md.

These paths use nats-py internals, checked against nats-py 2.16 (``_send_command``,
``_flush_pending``, ``_flush_queue``, ``_pending``, ``_pongs``, ``_transport``,
``_process_msg``, and the parser ``_ps`` with its ``buf`` and ``state``).  There is no fallback
to the public API: its ``flush()`` can confirm a batch before it is sent (see
:meth:`Wire.ping`).  :mod:`.compat` checks that the internals exist when the sink starts and
refuses to start otherwise, naming the supported nats-py versions.  Header bytes are built by
:mod:`.messages` from values that cannot hold CR or LF (see ``header_block``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, Optional

import nats.errors
from nats.protocol.parser import AWAITING_CONTROL_LINE

#: handler(subject, data, raw_headers_or_None) for each message on the ack subscription
AckHandler = Callable[[bytes, bytes, Optional[bytes]], None]

_PING = b"PING\r\n"


def parse_header_block(block: bytes) -> Dict[str, str]:
    """``NATS/1.0\\r\\nK: V\\r\\n...\\r\\n\\r\\n`` -> dict (for tests and tools)."""
    out: Dict[str, str] = {}
    for line in block.decode("utf-8").split("\r\n")[1:]:
        if line:
            key, _, value = line.partition(": ")
            out[key] = value
    return out


class Frames:
    """Messages encoded as the NATS protocol's ``HPUB`` commands, to be written in one go.

    Encoding a run of messages into one bytes object and handing it to nats-py once costs a
    fraction of one ``publish`` call per message (measured in docs/dev/benchmarks.md).
    """

    __slots__ = ("parts", "count", "max_payload")

    def __init__(self, max_payload: int):
        self.parts: list = []
        self.count = 0
        self.max_payload = max_payload

    def add(self, subject: str, reply: str, header: bytes, payload: bytes) -> None:
        """Raises MaxPayloadError for a message the server would refuse for its size."""
        size = len(header) + len(payload)
        if size > self.max_payload:
            raise nats.errors.MaxPayloadError
        # HPUB <subject> <reply> <header bytes> <total bytes>: as nats-py's hpub_cmd.
        self.parts += (f"HPUB {subject} {reply} {len(header)} {size}\r\n".encode(),
                       header, payload, b"\r\n")
        self.count += 1

    def take(self) -> bytes:
        data = b"".join(self.parts)
        self.clear()
        return data

    def clear(self) -> None:
        self.parts.clear()
        self.count = 0


class Wire:
    """Writes and confirms through one nats-py client, which :func:`.compat.check_client`
    has found to have the internals used here."""

    def __init__(self, nc: Any):
        self.nc = nc

    def frames(self) -> "Frames":
        """An empty run of messages to fill and hand to :meth:`send`."""
        return Frames(self.nc.max_payload)

    async def send(self, frames: "Frames") -> None:
        """Hand a run of messages to nats-py as one write; empties ``frames``.  The caller has
        checked ``nc.is_connected``: nats-py's buffering while reconnecting must not be used
        (see Connection._drop_unsent)."""
        if not frames.count:
            return
        nc = self.nc
        if nc.is_closed:
            raise nats.errors.ConnectionClosedError
        await nc._send_command(frames.take())
        # As Client._send_publish: wake the flusher task unless a wake-up is already queued.
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()

    def ping(self, timeout: float) -> "asyncio.Future[Any]":
        """A PING written after everything handed to nats-py so far; the future is done when
        its PONG arrives (the server then has processed all of it).  Wait on it with a
        timeout of your own and leave it be when the time is up.

        Not ``nc.flush()``: it writes its PING straight to the socket, ahead of what nats-py
        still buffers (a PONG could then confirm messages the server never got), and on its
        timeout it cancels the future it queued for the PONG, which makes nats-py's read loop
        end at the next PONG (``set_result`` on a cancelled future); the connection then
        reads nothing until nats-py notices it is stale."""
        nc = self.nc
        pong: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()
        nc._pongs.append(pong)
        if nc._pending_data_size:
            # What nats-py still buffers goes to the socket first (as its flusher would),
            # with the PING in the same write: one system call per batch, not two
            nc._transport.writelines(nc._pending + [_PING])
            nc._pending = []
            nc._pending_data_size = 0
        else:
            nc._transport.write(_PING)
        return pong

    async def subscribe_acks(self, subject: str, handler: AckHandler,
                             pending_msgs_limit: int) -> None:
        nc = self.nc

        async def on_msg(msg: Any) -> None:
            raw = None
            status = (msg.headers or {}).get("Status")
            if status:
                raw = f"NATS/1.0 {status}\r\n\r\n".encode()
            handler(msg.subject.encode(), msg.data, raw)

        # The subscription exists (nats-py renews it after a reconnect, same sid) but its
        # messages are taken from the parser before nats-py builds Msg objects for them.
        sub = await nc.subscribe(subject, cb=on_msg, pending_msgs_limit=pending_msgs_limit)
        sid = getattr(sub, "_id", None)
        if sid is None:
            return      # cannot tell our messages apart: the subscription's callback serves
        original = nc._process_msg

        async def process_msg(msg_sid: int, msg_subject: bytes, reply: bytes, data: bytes,
                              headers: Optional[bytes]) -> None:
            if msg_sid == sid:
                handler(msg_subject, data, headers)
                return
            await original(msg_sid, msg_subject, reply, data, headers)

        nc._process_msg = process_msg
        self._read_acks_first(subject, sid, handler)

    def _read_acks_first(self, subject: str, sid: int, handler: AckHandler) -> None:
        """Take plain acks (``MSG <inbox>.<n> <sid> <size>``) off each read before nats-py's
        parser sees it: that parser matches a regular expression and schedules a coroutine per
        message, several microseconds per ack, one ack per event.  Anything else (the first
        line that is not such an ack, an error ack with headers) and everything after it goes
        to nats-py's parser unchanged; a read that continues a message's payload goes there
        whole, and a control line cut by the last read is joined to the next read first, so
        the stream is never reordered."""
        parser = getattr(self.nc, "_ps", None)
        if parser is None or not hasattr(parser, "buf") or not hasattr(parser, "state"):
            return
        original_parse = parser.parse
        prefix = b"MSG " + subject.rstrip("*").encode()
        sid_text = str(sid).encode()

        async def parse(data: bytes = b"") -> None:
            if parser.state != AWAITING_CONTROL_LINE:      # inside a message's payload
                await original_parse(data)
                return
            if parser.buf:
                # The start of a line the last read cut: it goes first, as in nats-py.
                data = bytes(parser.buf) + data
                parser.buf.clear()
            pos, size = 0, len(data)
            while data.startswith(prefix, pos):
                line_end = data.find(b"\r\n", pos)
                if line_end < 0:
                    break
                # "MSG <subject> <sid> <size>": nats-server writes two spaces where the
                # reply subject would be, so split on runs of whitespace.
                fields = data[pos:line_end].split()
                if len(fields) != 4 or fields[2] != sid_text or not fields[3].isdigit():
                    break
                start = line_end + 2
                end = start + int(fields[3])
                if end + 2 > size:
                    break
                handler(fields[1], data[start:end], None)
                pos = end + 2
            if pos < size:
                await original_parse(data[pos:] if pos else data)

        parser.parse = parse
