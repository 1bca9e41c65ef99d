"""The supervisor's end of the control socket (see :mod:`lapidus.control` for the protocol).

Runs in the supervisor process, inside the arbiter loop: the listening socket is one more thing
the loop waits on, and each request is answered right there (requests are tiny), so the
arbiter's state is never touched from another thread.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable, Dict, Optional

from ..control import encode_message, read_message


class ControlServer:
    def __init__(self, path: Path, handlers: Dict[str, Callable[[dict], dict]], log):
        self.path = Path(path)
        self.handlers = handlers
        self.log = log
        self.sock: Optional[socket.socket] = None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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
        sock.listen(16)
        sock.setblocking(False)
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept_and_answer(self) -> None:
        """Answer every pending connection (called when the socket is readable)."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            with conn:
                conn.setblocking(True)
                conn.settimeout(2.0)
                try:
                    request = read_message(conn)
                    if request is None:
                        continue
                    conn.sendall(encode_message(self.dispatch(request)))
                except (OSError, ValueError) as exc:
                    self.log.warning("bad control request", error=str(exc))

    def dispatch(self, request: dict) -> dict:
        command = request.get("command")
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
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
