"""The NATS protocol as the benchmarks' subscriber processes read it: raw, without nats-py.

Imported by the sibling scripts (``from nats_wire import ...``); a subscriber written this way
costs the machine under measurement as little CPU as possible.
"""

from __future__ import annotations

import socket
from typing import List, Tuple

CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'

# one complete item: (control line, header bytes, start, end) for MSG/HMSG, where buf[start:end]
# holds the headers and the payload (offsets, so that a reader that only counts copies nothing);
# (line, 0, -1, -1) for any other line
Item = Tuple[bytes, int, int, int]


def read_items(buf: bytearray) -> Tuple[List[Item], int]:
    """The complete protocol items at the head of ``buf`` and the bytes they take."""
    items: List[Item] = []
    pos = 0
    while True:
        end = buf.find(b"\r\n", pos)
        if end < 0:
            break
        line = bytes(buf[pos:end])
        if line.startswith(b"HMSG ") or line.startswith(b"MSG "):
            parts = line.split(b" ")
            size = int(parts[-1])
            headers = int(parts[-2]) if parts[0] == b"HMSG" else 0
            if len(buf) < end + 2 + size + 2:
                break                       # the payload is not complete yet
            items.append((line, headers, end + 2, end + 2 + size))
            pos = end + 2 + size + 2
            continue
        items.append((line, 0, -1, -1))
        pos = end + 2
    return items, pos


def answer_control(sock: socket.socket, line: bytes, ready: bool) -> bool:
    """Handle a control line: PONG to the server's PING, "ready" printed on the PONG to our
    first PING, exit on -ERR.  Returns whether the subscriber is ready."""
    if line == b"PING":
        sock.sendall(b"PONG\r\n")
    elif line == b"PONG" and not ready:
        print("ready", flush=True)
        return True
    elif line.startswith(b"-ERR"):
        raise SystemExit(f"subscriber: {line!r}")
    return ready
