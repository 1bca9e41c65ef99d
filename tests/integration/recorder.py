"""A client that records what a server sends it, run in a background thread of the test.

Tests are synchronous; the clients of NATS, RabbitMQ and the like are asyncio. A
:class:`BackgroundRecorder` runs its client on an event loop of its own in a daemon thread:
:meth:`BackgroundRecorder.listen` (a subclass's) connects, subscribes and hands every message
to :meth:`record`; the test reads :meth:`seen` and waits on conditions over it.
:func:`recorders` makes the fixture that starts them and closes them after the test.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, List, Optional



class BackgroundRecorder:
    """Subclasses set ``what`` (for the error when it cannot start) and implement
    :meth:`listen`."""

    what = "the server"

    def __init__(self):
        self.messages: List[Any] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: Optional[asyncio.Event] = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the test's client could not connect to {self.what}")

    async def listen(self) -> Callable[[], Awaitable[None]]:
        """Connect and subscribe; return the coroutine function that disconnects."""
        raise NotImplementedError

    def record(self, message: Any) -> None:
        with self._lock:
            self.messages.append(message)

    def seen(self) -> List[Any]:
        with self._lock:
            return list(self.messages)

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        disconnect = await self.listen()
        self._ready.set()
        await self._stop.wait()
        await disconnect()


def recorders(factory: Callable[..., BackgroundRecorder]):
    """A fixture body: ``start(...)`` -> ``factory(...)``, every one closed after the test."""
    started: List[BackgroundRecorder] = []

    def start(*args, **kwargs) -> BackgroundRecorder:
        recorder = factory(*args, **kwargs)
        started.append(recorder)
        return recorder

    yield start
    for recorder in started:
        recorder.close()
