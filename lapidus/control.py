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
import os
import socket
import stat
import struct
from typing import Any, Dict, Optional

LENGTH = struct.Struct(">I")
MAX_MESSAGE = 16 << 20


class ControlUnavailable(Exception):
    """The socket is absent or refuses: no supervisor is listening there."""


def encode_message(message: Dict[str, Any]) -> bytes:
    body = json.dumps(message, default=str).encode("utf-8")
    return LENGTH.pack(len(body)) + body


def decode_body(body: bytes) -> Dict[str, Any]:
    """A message body as its JSON object; ValueError for anything else."""
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a JSON message: {exc}") from None
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    return message


def read_message(sock: socket.socket) -> Optional[Dict[str, Any]]:
    """Read one framed message (blocking, bounded by the socket's timeout); None if the peer
    closed first; ValueError for something that is not a message."""
    header = _read_exact(sock, LENGTH.size)
    if header is None:
        return None
    (length,) = LENGTH.unpack(header)
    if length > MAX_MESSAGE:
        raise ValueError(f"control message of {length} bytes is too large")
    body = _read_exact(sock, length)
    if body is None:
        return None
    return decode_body(body)


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
    """Send one request to the supervisor at ``path`` and return its response.

    Every way of not getting an answer (no socket, refused, no answer within ``timeout``, an
    answer that is not a Lapidus control message) is a :class:`ControlUnavailable` whose text
    says which and what to check."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except ConnectionRefusedError as exc:
            try:
                mode = os.stat(path).st_mode
            except OSError:
                mode = stat.S_IFSOCK        # gone meanwhile: as refused
            if not stat.S_ISSOCK(mode):
                raise ControlUnavailable(
                    f"{path} is {'a directory' if stat.S_ISDIR(mode) else 'a regular file'}, "
                    f"not a socket: give lapidus's control socket (control.socket in its "
                    f"configuration; lapidusctl -c CONFIG finds it)") from None
            raise ControlUnavailable(
                f"cannot reach lapidus at {path}: {exc.strerror or exc}; is it running with this "
                f"configuration? (start it with 'lapidus -c CONFIG' or 'systemctl start lapidus')"
            ) from None
        except FileNotFoundError as exc:
            raise ControlUnavailable(
                f"cannot reach lapidus at {path}: {exc.strerror or exc}; is it running with this "
                f"configuration? (start it with 'lapidus -c CONFIG' or 'systemctl start lapidus')"
            ) from None
        except PermissionError:
            raise ControlUnavailable(
                f"permission denied on {path}: run lapidusctl as the user lapidus runs as "
                f"(the socket is mode 0600)") from None
        except OSError as exc:
            raise ControlUnavailable(f"cannot connect to {path}: {exc.strerror or exc}; check "
                                     f"that it is the control socket of a lapidus") from None
        try:
            sock.sendall(encode_message(message))
            response = read_message(sock)
        except socket.timeout:
            raise ControlUnavailable(
                f"lapidus at {path} did not answer within {timeout:g} s; it may be overloaded "
                f"or frozen (check 'systemctl status lapidus' and its log)") from None
        except ValueError as exc:
            raise ControlUnavailable(
                f"{path} answered something that is not a lapidus control message ({exc}); "
                f"check that it is the control socket of a lapidus of this version") from None
        except OSError as exc:
            raise ControlUnavailable(f"lapidus at {path} dropped the connection: "
                                     f"{exc.strerror or exc}") from None
        if response is None:
            raise ControlUnavailable(f"lapidus at {path} closed the connection without answering")
        return response
    finally:
        sock.close()
