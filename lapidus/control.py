"""The control protocol between ``lapidusctl`` and the supervisor.

A unix stream socket (mode 0600, owned by the service user).  Each message is a 4-byte
big-endian length followed by a UTF-8 JSON object.  One request, one response, then the
connection closes.

Requests:  ``{"command": "status"}``, ``{"command": "restart", "backend": NAME|null}``,
           ``{"command": "stop", "backend": NAME}``, ``{"command": "start", "backend": NAME}``
Responses: ``{"ok": true, ...}`` or ``{"ok": false, "error": "...", "code": "unknown_backend"}``
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any, Dict, Optional

LENGTH = struct.Struct(">I")
MAX_MESSAGE = 16 << 20


class ControlUnavailable(Exception):
    """The socket is absent or refuses: no supervisor is listening there."""


def encode_message(message: Dict[str, Any]) -> bytes:
    body = json.dumps(message, default=str).encode("utf-8")
    return LENGTH.pack(len(body)) + body


def read_message(sock: socket.socket) -> Optional[Dict[str, Any]]:
    """Read one framed message (blocking); None if the peer closed first."""
    header = _read_exact(sock, LENGTH.size)
    if header is None:
        return None
    (length,) = LENGTH.unpack(header)
    if length > MAX_MESSAGE:
        raise ValueError(f"control message of {length} bytes is too large")
    body = _read_exact(sock, length)
    if body is None:
        return None
    return json.loads(body)


def _read_exact(sock: socket.socket, size: int) -> Optional[bytes]:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def request(path: str, message: Dict[str, Any], timeout: float = 10.0) -> Dict[str, Any]:
    """Send one request to the supervisor at ``path`` and return its response."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ControlUnavailable(
                f"cannot reach lapidus at {path}: {exc.strerror or exc}; is it running with this "
                f"configuration? (start it with 'lapidus -c CONFIG' or 'systemctl start lapidus')"
            ) from None
        except PermissionError:
            raise ControlUnavailable(
                f"permission denied on {path}: run lapidusctl as the user lapidus runs as "
                f"(the socket is mode 0600)") from None
        sock.sendall(encode_message(message))
        response = read_message(sock)
        if response is None:
            raise ControlUnavailable(f"lapidus at {path} closed the connection without answering")
        return response
    finally:
        sock.close()
