"""A sink's own snapshot runs, as the dispatcher asks for them (lapidus.sink_runs).

Runs in the dispatcher process.  The dispatcher gives one :class:`SnapshotRequests` to each
sink that asks for runs (``Sink.asks_for_snapshots``: the websocket sink, for clients that
connect with ``snapshot=1``).  A run is a backfill request in the backend's queue
(:class:`lapidus.workers.snapshot.requests.BackfillQueue`) that names the sink, so the worker
takes it in turn with the other backfills, resumes it after a crash, and reports it in
``lapidusctl status``; a cancel removes the file and the worker stops the run.

The file operations write and fsync: the sink calls :meth:`request`, :meth:`cancel` and
:meth:`refused` off the event loop (``asyncio.to_thread``), and :meth:`wake` on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

from ..workers.snapshot.requests import BackfillQueue


class SnapshotRequests:
    def __init__(self, state_dir: str, backend: str, sink: str,
                 wake: Callable[[str], None], unavailable: Optional[str] = None):
        self.backend = backend
        self.sink = sink
        self.queue = BackfillQueue(Path(state_dir) / backend)
        self._wake = wake
        #: None, or why no run can be asked for (the sink refuses its clients with it)
        self.unavailable = unavailable

    def request(self, table: str) -> int:
        """Queue a run of ``table`` (``table`` or ``schema.table``) for the sink; its number."""
        return self.queue.add(table, None, sink=self.sink).n

    def wake(self) -> None:
        """Have the worker look at its requests now rather than at its next keep-alive."""
        self._wake(self.backend)

    def cancel(self, numbers: Iterable[int]) -> None:
        self.queue.cancel(runs=list(numbers))

    def settled(self, numbers: Iterable[int]) -> Dict[int, Optional[str]]:
        """The runs among ``numbers`` whose request is gone: n -> the worker's reason for a
        refused one (unknown table ...), None for one cancelled by someone else
        (``lapidusctl backfill --cancel``).  A run that ends keeps its request until the
        sink has had its end, so it is never among them."""
        wanted = set(numbers) - {r.n for r in self.queue.pending()}
        if not wanted:
            return {}
        reasons = {r.get("n"): str(r.get("reason")) for r in self.queue.refused()}
        return {n: reasons.get(n) for n in wanted}

    def not_started(self, numbers: Iterable[int]) -> List[int]:
        """The runs among ``numbers`` that provably have not started: still queued behind an
        older request (the worker runs the oldest first, one at a time, and a run's request
        stays until its end is confirmed), so a client that joins one now sees every change
        its chunks are read between."""
        pending = [r.n for r in self.queue.pending()]
        return [n for n in numbers if n in pending and pending[0] < n]

    def leftovers(self, keep: Iterable[int] = ()) -> List[int]:
        """This sink's queued or running runs that are not in ``keep``: asked for by an
        earlier dispatcher or listener whose clients are gone."""
        kept = set(keep)
        return [r.n for r in self.queue.pending() if r.sink == self.sink and r.n not in kept]
