"""A sink's connection to its server that reconnects for ever, with a visible state.

Runs in the dispatcher's event loop.  Shared by the redis and rabbitmq sinks: a subclass says
how to open a connection (:meth:`ReconnectingLink._open`), which errors are the settings'
fault rather than an outage (:meth:`ReconnectingLink._how_to_fix`) and what to drop when the
connection is lost (:meth:`ReconnectingLink._dropped`).  The rest is the same for every
server:

* :meth:`start` opens in the background; :meth:`wait_ready` returns once connected and logs,
  every 30 s meanwhile, how many events wait (none is dropped);
* a failed attempt is retried after the sink's ``reconnect_time_wait`` (at least 5 s when the
  settings are at fault); the same error is logged once per 30 s for an outage, once per
  5 minutes for wrong settings (with the fix);
* :meth:`lost` (a publish failed for want of a connection) marks the link down and reconnects;
* :meth:`health` is what ``lapidusctl status`` and ``/metrics`` show.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, Optional

WAITING_LOG_EVERY = 30.0
OUTAGE_LOG_EVERY = 30.0
MISCONFIGURED_LOG_EVERY = 300.0
MISCONFIGURED_RETRY = 5.0


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class ReconnectingLink:
    """One backend's connection to the server named by ``options.server``."""

    #: the server's name in log lines ("redis", "rabbitmq")
    kind = "server"

    def __init__(self, options: Any, backend: str, log: Any):
        self.options = options
        self.backend = backend
        self.log = log
        self.server = options.server
        self.generation = 0
        self.last_error: Optional[str] = None
        self._ready = asyncio.Event()
        self._down_since: Optional[float] = time.monotonic()
        self._task: Optional[asyncio.Task] = None
        self._logged: Dict[str, float] = {}      # error text -> when it was last logged
        self._closing = False

    # -- for subclasses --------------------------------------------------------------------

    async def _open(self) -> None:
        """Connect (or check the connection) once; raise on failure."""
        raise NotImplementedError

    def _how_to_fix(self, error: BaseException) -> Optional[str]:
        """The fix when ``error`` says the settings are wrong; None for an outage."""
        return None

    def _connected_fields(self) -> Dict[str, Any]:
        """Extra fields of the "connected" log line."""
        return {}

    def _dropped(self) -> None:
        """The connection was lost: let go of what belonged to it."""

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._reconnect()

    def _reconnect(self) -> None:
        if self._closing or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self._connect(),
                                         name=f"{self.kind}-connect:{self.backend}")

    async def _connect(self) -> None:
        while True:
            try:
                await self._open()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:      # anything: keep trying, never kill the dispatcher
                fix = self._how_to_fix(exc)
                wait = self.options.reconnect_time_wait
                retry_in = max(wait, MISCONFIGURED_RETRY) if fix else wait
                self._failed(exc, fix, retry_in)
                await asyncio.sleep(retry_in)
        self.generation += 1
        down_for = time.monotonic() - self._down_since if self._down_since else 0.0
        self._down_since = None
        self.last_error = None
        self._logged.clear()
        self._ready.set()
        self.log.info(f"{self.kind} connected" if self.generation == 1 else
                      f"{self.kind} reconnected", server=self.server,
                      after_seconds=round(down_for, 2), **self._connected_fields())

    def _failed(self, exc: BaseException, fix: Optional[str], retry_in: float) -> None:
        text = describe(exc)
        self.last_error = text + (f"; fix: {fix}" if fix else "")
        now = time.monotonic()
        every = MISCONFIGURED_LOG_EVERY if fix else OUTAGE_LOG_EVERY
        if now - self._logged.get(text, -1e9) < every:
            return
        self._logged[text] = now
        if fix:
            self.log.error(f"{self.kind} refuses the connection; events are held back until "
                           f"the settings are fixed", server=self.server, error=text, fix=fix,
                           retry_in=retry_in)
        else:
            self.log.warning(f"cannot connect to {self.kind}; retrying", server=self.server,
                             error=text, retry_in=retry_in)

    def lost(self, error: BaseException) -> None:
        """Publishing failed for want of a connection: down from now, reconnect."""
        if self._ready.is_set():
            self._ready.clear()
            self._down_since = time.monotonic()
            self.last_error = describe(error)
            self.log.warning(f"{self.kind} connection lost; reconnecting", server=self.server,
                             error=describe(error))
            self._dropped()
        self._reconnect()

    async def _stop_connecting(self) -> None:
        self._closing = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    # -- what the sink uses ----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self, held: int = 0) -> None:
        """Return once connected; meanwhile log every 30 s how many events wait."""
        while not self._ready.is_set():
            try:
                await asyncio.wait_for(self._ready.wait(), WAITING_LOG_EVERY)
            except asyncio.TimeoutError:
                self.log.warning(f"waiting for {self.kind}; events are held back, none is "
                                 f"dropped", server=self.server, held_events=held,
                                 down_for=self.down_seconds(), error=self.last_error)

    def down_seconds(self) -> Optional[float]:
        since = self._down_since
        return None if since is None else round(time.monotonic() - since, 1)

    def health(self) -> Dict[str, Any]:
        return {"connected": self.ready, "down_seconds": self.down_seconds(),
                "server": self.server, "last_error": self.last_error}
