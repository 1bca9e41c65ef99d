"""systemd's notify protocol (sd_notify), without native dependencies.

Runs in the supervisor process.  With ``Type=notify`` systemd passes ``NOTIFY_SOCKET``; Lapidus
sends ``READY=1`` once every backend has reported ready or failed, ``STATUS=...`` lines for
``systemctl status``, ``WATCHDOG=1`` from its main loop (so a wedged supervisor is restarted by
systemd), and ``STOPPING=1`` on shutdown.  Without ``NOTIFY_SOCKET`` every call does nothing.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Optional


class Notifier:
    def __init__(self, environ=os.environ):
        self.address: Optional[str] = environ.get("NOTIFY_SOCKET") or None
        if self.address and self.address.startswith("@"):
            self.address = "\0" + self.address[1:]     # abstract socket namespace
        usec = environ.get("WATCHDOG_USEC")
        pid = environ.get("WATCHDOG_PID")
        self.watchdog_interval: Optional[float] = None
        if usec and usec.isdigit() and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2   # ping at half the timeout
        self._last_ping = 0.0
        self.ready_sent = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> None:
        if not self.address:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.sendto("\n".join(lines).encode(), self.address)
        except OSError:
            pass  # systemd went away; nothing useful to do
        finally:
            sock.close()

    def ready(self, status: str) -> None:
        if not self.ready_sent:
            self.ready_sent = True
            self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def watchdog(self) -> None:
        """Called from the main loop only, so pings stop when the loop is stuck."""
        if self.watchdog_interval is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_interval:
            self._last_ping = now
            self.send("WATCHDOG=1")

    def next_ping(self) -> Optional[float]:
        """Monotonic time the next WATCHDOG=1 is due (None: no watchdog): the loop must wake
        for it even when nothing else happens."""
        if self.watchdog_interval is None:
            return None
        return self._last_ping + self.watchdog_interval

    def stopping(self) -> None:
        self.send("STOPPING=1")
