"""One connected websocket client: what it subscribed to and where it is in each backend's
stream.

Runs in the dispatcher process, inside its asyncio loop.  A client holds no queue of its own:
its place in each backend's :class:`.replay.ReplayBuffer` is a cursor (a sequence number), and
the one rule that keeps the stream whole is that a frame is written only together with moving
the cursor past it, with no ``await`` between.  So the join between the replayed events and the
live ones has no gap and no repeat, whichever of the two paths writes:

* caught up (its cursor at the start of a new batch, its socket taking data): the sink writes
  the batch to it at once (:meth:`Hub.publish <.server.Hub.publish>`);
* behind (resuming with ``after=``, or its write buffer above the websocket library's
  ``write_limit``): its own task (:meth:`Client.run`) writes from the replay buffer in chunks,
  waiting for the socket to drain in between, until it is caught up.

A client more than ``client_max_lag`` events behind the newest one (after it was caught up
once), or whose next event already left the replay window, is closed with 1008 and a reason.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable, Dict, FrozenSet, Optional, Set, Tuple

from websockets.protocol import State

from .replay import ReplayBuffer

if TYPE_CHECKING:
    from .server import Hub

#: events written per chunk while catching up, so the loop is never held for long
CHUNK = 512
POLICY_VIOLATION = 1008


class Subscription:
    """What a client receives: the subjects asked for, within the token's grant, and the
    events of its own snapshot runs (``runs``, their labels; :mod:`.snapshots`).  Clients
    whose ``key`` is the same share the work of matching (once per event and batch, not per
    client: :meth:`Hub.publish <.server.Hub.publish>`)."""

    def __init__(self, key: Tuple, matches: Callable[[str], bool],
                 runs: FrozenSet[str] = frozenset()):
        self.key = key + (runs,) if runs else key
        self.matches = matches
        self.runs = runs

    def with_runs(self, runs: FrozenSet[str]) -> "Subscription":
        return Subscription(self.key, self.matches, runs)

    def frames(self, entries) -> Tuple[bytes, int]:
        """The frames of the matching ``entries`` joined, and how many they are.  An event of
        a snapshot run (its subject a :class:`.snapshots.RunSubject`) matches only the
        run's clients."""
        matches, runs = self.matches, self.runs
        picked = [frame for subject, frame in entries
                  if (matches(subject) if subject.__class__ is str
                      else subject.run in runs and (subject.end or matches(subject)))]
        return b"".join(picked), len(picked)


class Client:
    def __init__(self, connection, subscription: Subscription, hub: "Hub"):
        self.connection = connection
        self.subscription = subscription
        self.hub = hub
        self.cursors: Dict[str, int] = {}      # backend -> sequence number of its next event
        self.catching_up: Set[str] = set()     # backends it resumed far back in: no lag rule
        self.wake = asyncio.Event()
        self.closed = False
        self.frames = 0
        self.peer = _peer(connection)

    # -- writing ------------------------------------------------------------------------

    def writable(self) -> bool:
        connection = self.connection
        return (not self.closed and not connection.paused
                and connection.protocol.state is State.OPEN)

    def write(self, data: bytes, count: int, backend: str = "") -> None:
        """Frames already encoded (:func:`.replay.text_frame`) straight to the socket: the
        same bytes for every client, and one write per client and batch."""
        if data:
            self.connection.transport.write(data)
            if count:
                self.frames += count
                self.hub.sent(backend, count)

    def catch_up(self) -> None:
        """Write what this client has not had yet from the replay buffers, while its socket
        takes data.  Synchronous: cursors and writes move together."""
        for backend, buffer in self.hub.buffers.items():
            cursor = self.cursors.get(backend)
            if cursor is None:
                continue
            while cursor < buffer.head and self.writable():
                if cursor < buffer.base:
                    self.too_slow(f"fell out of the replay window of {backend} "
                                  f"({buffer.max_events} events)")
                    return
                end = min(buffer.head, cursor + CHUNK)
                self.write(*self.subscription.frames(buffer.entries(cursor, end)), backend)
                cursor = end
            self.cursors[backend] = cursor
            if backend in self.catching_up and buffer.head - cursor <= self.hub.max_lag:
                self.catching_up.discard(backend)

    def behind(self) -> bool:
        return any(self.cursors.get(backend, buffer.head) < buffer.head
                   for backend, buffer in self.hub.buffers.items())

    async def run(self) -> None:
        """The client's own task: catch up whenever woken or drained, until it closes."""
        connection = self.connection
        try:
            while not self.closed:
                self.catch_up()
                if self.closed:
                    return
                if connection.paused and self.behind():
                    await connection.drain()
                else:
                    await self.wake.wait()
                    self.wake.clear()
        except Exception:
            return  # the connection is gone; the handler removes the client

    # -- the slow-client rule -----------------------------------------------------------

    def check_lag(self, backend: str, buffer: ReplayBuffer) -> None:
        cursor = self.cursors.get(backend, buffer.head)
        if cursor < buffer.base:
            self.too_slow(f"fell out of the replay window of {backend} "
                          f"({buffer.max_events} events)")
        elif buffer.head - cursor > self.hub.max_lag and backend not in self.catching_up:
            self.too_slow(f"more than {self.hub.max_lag} events behind (client_max_lag)")

    def too_slow(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.hub.dropped(self, why)
        reason = f"too slow: {why}; reconnect with after=<last id>"
        self.hub.spawn(self.connection.close(POLICY_VIOLATION, reason[:120]))
        self.wake.set()


def _peer(connection) -> Optional[str]:
    try:
        address = connection.remote_address
        return f"{address[0]}:{address[1]}" if address else None
    except Exception:
        return None
