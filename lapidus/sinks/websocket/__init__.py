"""The websocket sink: live events to websocket clients (browsers), with a replay window.

Runs in the dispatcher process, inside its asyncio loop; one instance per backend, attached to
one listener per address (:mod:`.server`), which several backends may share.  Contract
(lapidus.sinks.base.Sink): :meth:`WebsocketSink.send` returns as soon as the batch is in the
backend's replay window (:mod:`.replay`); the hub writes it to the caught-up clients at once or,
under load, within a few milliseconds (:meth:`.server.Hub.added`).
It never waits for a client: the backend's position does not depend on websocket clients, a
slow client is closed (1008) rather than obeyed, and the window lives in the dispatcher's
memory.  This is live delivery with a replay window, not a durable queue (durable consumers
use JetStream).  Within the window a client misses nothing: it resumes with ``after=<id>``,
or is told by a ``gap`` frame that it cannot.

Modules: ``options`` (validation, no websockets import), ``patterns`` (subject wildcards),
``replay`` (the window, frames), ``clients`` (one client's cursors and the slow-client rule),
``snapshots`` (``snapshot=1``: the runs made for clients), ``server`` (the listener, the
handshake, publishing).  Documented in docs/sinks.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence

from ...events import Record
from ...sink_runs import END, run_of
from ..base import Sink, SinkError
from ..optionkit import start_without_extra
from ..subjects import SubjectBuilder
from .options import WebsocketOptions, validate
from .replay import text_frame
from .snapshots import RunSubject

if TYPE_CHECKING:       # websockets is imported lazily: validation must work without it
    from .server import Hub


class WebsocketSink(Sink):
    shared = False
    merge_batches = True     # a delivery costs the same for one batch or several
    asks_for_snapshots = True   # snapshot=1 (.snapshots)

    def __init__(self, options: Mapping[str, Any], backend: str):
        super().__init__(options, backend)
        self.settings = WebsocketOptions.parse(options)
        self.subjects = SubjectBuilder(backend)
        self.hub: Optional["Hub"] = None
        self._start_error: Optional[str] = None

    @classmethod
    def validate(cls, options: Mapping[str, Any]) -> list:
        return validate(options)

    async def start(self) -> None:
        """Listen (or join the listener of another backend with the same options)."""
        if self.hub is None:
            try:
                from .server import hub_for
            except ImportError as exc:
                self._start_error = start_without_extra("websocket", exc)
                raise SinkError(self._start_error) from None
            self.hub = hub_for(self.settings, self.backend, self.snapshot_requests)
        try:
            await self.hub.start()
        except Exception as exc:
            # let go of the listener: the dispatcher makes a new sink for its next attempt
            self._start_error = str(exc)
            await self.close()
            raise

    async def send(self, records: Sequence[Record]) -> None:
        hub = self.hub
        if hub is None or hub.server is None:
            await self.start()
            hub = self.hub
        buffer = hub.buffers[self.backend]
        if getattr(records, "routed", False):
            repeats = self._add_routed(records, buffer, hub)
        else:
            subject = self.subjects.subject
            add = buffer.add
            repeats = 0
            for record in records:
                if not add(record.id, subject(record), text_frame(record.data)):
                    repeats += 1
        if repeats:
            hub.repeats_skipped[self.backend] += repeats
        hub.added()

    def _add_routed(self, records: Sequence[Record], buffer, hub: "Hub") -> int:
        """:meth:`send` for records that may hold events of the clients' snapshot runs
        (lapidus.sink_runs): those go into the window marked as their run's, or nowhere
        when their client is gone; the end of a run becomes its ``done`` frame."""
        backend, runs, subject = self.backend, hub.snapshots, self.subjects.subject
        repeats = 0
        for record in records:
            label = run_of(record, backend)
            if label is None:
                added = buffer.add(record.id, subject(record), text_frame(record.data))
            elif not runs.wanted(backend, label):
                continue            # its client left (the run is being cancelled)
            elif record.type == END:
                added = buffer.add(record.id, *runs.end_subject_and_frame(backend, label,
                                                                          record))
            else:
                added = buffer.add(record.id, RunSubject(subject(record), label),
                                   text_frame(record.data))
            if not added:
                repeats += 1
        return repeats

    def health(self) -> Optional[Dict[str, Any]]:
        if self.hub is None:
            return {"connected": False, "down_seconds": None, "last_error": self._start_error,
                    "server": self.settings.url}
        return self.hub.health(self.backend)

    async def close(self) -> None:
        if self.hub is not None:
            hub, self.hub = self.hub, None
            await hub.detach(self.backend)


__all__ = ("WebsocketSink", "WebsocketOptions", "validate")
