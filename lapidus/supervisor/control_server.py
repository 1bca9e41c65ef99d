"""The supervisor's end of the control socket (see :mod:`lapidus.control` for the protocol).

Runs in the supervisor process, inside the arbiter loop: the listening socket and its clients
are polled by the loop (:class:`LoopListener`), and each complete request is answered right
there (requests are tiny), so the arbiter's state is never touched from another thread.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable, Dict, Optional

from ..control import LENGTH, MAX_MESSAGE, decode_body, encode_message
from .listener import LoopListener


class SocketInUse(Exception):
    """Another live Lapidus answers on this control socket."""


class ControlServer(LoopListener):
    def __init__(self, path: Path, handlers: Dict[str, Callable[[dict], dict]], log):
        super().__init__(log)
        self.path = Path(path)
        self.handlers = handlers

    def open(self) -> None:
        """Listen on the socket path; a stale socket file (nobody listening) is replaced, a
        live one is refused: unlinking it would leave the other Lapidus unreachable and send
        its operator's lapidusctl to this one."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self._someone_listens():
            raise SocketInUse(
                f"another lapidus is already listening on control socket {self.path}; stop it "
                f"first, or give this configuration its own control.socket")
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Created with umask 077 so there is no moment at which others could connect.
        old = os.umask(0o077)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.listen(sock)

    def _someone_listens(self) -> bool:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(self.path))
            return True
        except OSError:   # absent, refused (stale file), not a socket
            return False
        finally:
            probe.close()

    def parse(self, received: bytes) -> Optional[dict]:
        if len(received) < LENGTH.size:
            return None
        (length,) = LENGTH.unpack_from(received)
        if length > MAX_MESSAGE:
            raise ValueError(f"control message of {length} bytes is too large")
        if len(received) < LENGTH.size + length:
            return None
        return decode_body(received[LENGTH.size:LENGTH.size + length])

    def respond(self, request: dict) -> bytes:
        return encode_message(self.dispatch(request))

    def error_response(self, message: str) -> bytes:
        return encode_message({"ok": False, "code": "bad_request", "error": message})

    def dispatch(self, request: dict) -> dict:
        command = request.get("command") if isinstance(request, dict) else None
        handler = self.handlers.get(command)
        if handler is None:
            return {"ok": False, "code": "unknown_command",
                    "error": f"unknown command {command!r} (expected: "
                             f"{', '.join(sorted(self.handlers))})"}
        try:
            return handler(request)
        except KeyError as exc:
            return {"ok": False, "code": "unknown_backend", "error": str(exc).strip("'\"")}

    def close(self) -> None:
        was_open = self.sock is not None
        super().close()
        if was_open:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
