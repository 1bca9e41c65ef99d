"""The source interface every backend worker implements.

A *source* runs in its worker process, after fork: it connects to one database, checks the
server's settings, and hands out batches of events in commit order together with the
checkpoint that becomes true once those events are delivered.  The generic worker loop
(:mod:`lapidus.workers.runner`) ships the batches to the dispatcher, waits for the sinks'
confirmation and only then calls :meth:`Source.commit` and saves the checkpoint.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, List, Optional

from ..events import Event


#: the fix of every "position lost" error (a dropped slot, a purged binlog, a lost oplog
#: position): a fresh start with an initial snapshot (docs/operations.md)
RECOVER_LOST_POSITION = (
    "move the backend's state directory (<state_dir>/<backend>/) away and start it again "
    'with snapshot = "initial": a new position, then every row as it is now, no gap '
    '(docs/operations.md, "Recovering a lost position")')


class BackendError(Exception):
    """A problem with a backend, phrased for the operator: the thing, the reason, the fix.

    ``fatal=True`` means retrying cannot help (bad configuration, wrong password, a role or
    user that does not exist, missing privilege or server setting, a position the server no
    longer has): the worker exits and the supervisor marks the backend FATAL.  ``fatal=False``
    is transient (server down, refusing connections, starting up or shutting down, too many
    connections, connection lost mid-stream): the worker itself waits and opens the source
    again from the confirmed checkpoint (:mod:`lapidus.workers.waiting`), never a crash.
    """

    def __init__(self, message: str, *, fatal: bool = False):
        super().__init__(message)
        self.fatal = fatal

    def for_one_attempt(self) -> str:
        """The message for a program that tries once (``lapidusctl``), without the worker's
        closing "(retrying)"."""
        text = str(self)
        return text[:-len(RETRYING)] if text.endswith(RETRYING) else text


#: how a transient problem's message ends: the worker waits and tries again
RETRYING = " (retrying)"


@dataclass
class Batch:
    """Events read from the source, in commit order.

    ``checkpoint`` is a JSON-serialisable value that is safe to persist once every event in
    this batch (and all earlier batches) has been confirmed by the sinks.  A batch may carry no
    events but a new checkpoint (for example after skipping filtered rows).

    ``at_boundary``: every event read so far belongs to a source transaction whose end was
    read (the checkpoint stands between transactions), so no later event joins a transaction
    of this batch.  False when the source cannot tell or a transaction is open; a sink that
    applies whole transactions then waits for a later batch (docs/sync.md).
    """

    events: List[Event] = field(default_factory=list)
    checkpoint: Any = None
    at_boundary: bool = False


class Source(abc.ABC):
    """One backend's change stream.  Runs in the worker process."""

    def __init__(self, backend, state_dir, log):
        self.backend = backend          # lapidus.config.BackendConfig
        self.state_dir = state_dir      # pathlib.Path private to this backend
        self.log = log                  # structlog logger bound to the backend name

    @abc.abstractmethod
    def open(self, checkpoint: Optional[Any]) -> None:
        """Connect, check the server and position the stream after ``checkpoint``.

        ``checkpoint`` is the last value confirmed from a delivered :class:`Batch`, or ``None``
        on the first start.  Raises :class:`BackendError` with a clear message on failure;
        :meth:`read` raises a transient one when the connection is lost mid-stream.
        """

    @abc.abstractmethod
    def read(self, max_events: int, timeout: float) -> Batch:
        """Return the next events (at most ``max_events``), waiting at most ``timeout`` seconds
        for the first one.  Returns an empty batch when nothing arrived in time; never waits
        for a batch to fill once it has an event (no added latency)."""

    #: Set by the worker loop before :meth:`open`: a file descriptor that becomes readable
    #: when the loop has something else to do (a signal arrived: stop, a backfill request;
    #: :mod:`lapidus.workers.wakeup`).  A read that watches it returns at once, empty.
    wake_fd: Optional[int] = None

    #: Set by the worker loop before :meth:`open`: a batch may hold a snapshot chunk as one
    #: :class:`lapidus.events.ReadChunk` (its events already encoded) instead of an
    #: :class:`Event` per row.  Off for other readers of a source (:func:`lapidus.api.stream`
    #: yields events).
    encoded_reads: bool = False

    def idle_wait(self) -> float:
        """The longest one :meth:`read` may wait while nothing is in flight.

        A source whose read also returns when :attr:`wake_fd` is readable, and which needs
        no periodic look of its own while idle (it watches its child processes through file
        descriptors too), answers ``math.inf``: an idle worker then sleeps until its next
        keep-alive report.  The default, a second, keeps the loop's old once-a-second
        cadence (backfill requests and stats are looked at every second)."""
        return 1.0

    def commit(self, checkpoint: Any) -> None:
        """Called, in order, once everything up to ``checkpoint`` is delivered and saved.

        Sources use it to release resources (PostgreSQL deletes spool segments)."""

    def tick(self) -> None:
        """Called about every 0.2 s while the worker waits for the sinks (backpressure) instead
        of reading: keep child processes and local limits in hand (PostgreSQL supervises
        pg_recvlogical and pauses it when the spool is full)."""

    def status(self) -> dict:
        """Extra fields for ``lapidusctl status`` (lag, source position ...)."""
        return {}

    def suspend(self) -> None:
        """Let go of the server before a reconnect (the worker opens the source again).

        The same as :meth:`close` unless a source keeps something across reconnects that a
        final stop releases (PostgreSQL keeps a temporary slot)."""
        self.close()

    def share_state(self, store) -> None:
        """Cluster mode: ``store`` (:class:`lapidus.cluster.checkpoints.FencedCheckpointStore`)
        holds the checkpoint in the cluster bucket; a source that keeps anything else it
        resumes from in its state directory moves it there (``store.marker(name)``), since the
        next owner may run on another host.  Called before :meth:`open`."""

    # -- snapshots (docs/snapshots.md) ----------------------------------------------------

    #: the progress of the current or last snapshot run, put in the checkpoint as
    #: ``"snapshot"``; None for a backend that never ran one
    snapshot_progress = None
    #: the run in progress (a :class:`~.snapshot.run.SnapshotRun` of the source's kind), or None
    snapshot = None

    def snapshot_running(self) -> bool:
        progress = self.snapshot_progress
        return progress is not None and not progress.done

    def start_backfill(self, n: int, table: str, where: Optional[str],
                       sink: Optional[str] = None) -> str:
        """Begin backfill ``n`` of ``table`` (``table`` or ``schema.table``), rows matching
        ``where`` (SQL; a JSON filter on MongoDB) or all; returns ``schema.table``.  With
        ``sink``, the run is that sink's alone (:mod:`lapidus.sink_runs`).

        Called by the worker loop only while no run is in progress.  Raises
        :class:`~.snapshot.run.SnapshotRefused` for a table that is unknown, not streamed,
        keyless, or a ``where`` the server rejects.  The run's progress becomes
        :attr:`snapshot_progress`; after a restart :meth:`open` resumes it from the
        checkpoint."""
        from .snapshot.run import SnapshotRefused
        raise SnapshotRefused(f'backend "{self.backend.name}": backfills are not built for '
                              f"{self.backend.type} backends yet")

    def cancel_snapshot(self) -> None:
        """Stop the current run (``lapidusctl backfill --cancel``); what it emitted stands."""
        if self.snapshot is not None:
            self.snapshot.cancel()
        self.snapshot = None

    def target(self) -> str:
        """``HOST:PORT`` (or what names the server) for "waiting for ..." in the status."""
        options = getattr(self.backend, "options", None) or {}
        return f'{options.get("host", "127.0.0.1")}:{options.get("port", "")}'.rstrip(":")

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and child processes.  Must be safe to call twice, and
        :meth:`open` may be called again after it (a reconnect reuses the source)."""
