"""Clients that connect with ``snapshot=1``: the runs made for them, and how they hear of them.

Runs in the dispatcher process, inside its asyncio loop.  For each table its patterns name
(``public.items.>`` names ``public.items``), on each backend it asks for, the client gets a
snapshot run of its own: a backfill request that names the websocket sink
(lapidus.sink_runs), run by the worker with the watermark method like any backfill, whose
``read`` events reach this sink only and, here, only that client.  The client's stream starts
at the live head when it connects, and the run's ``read`` events come in it where the worker
put them, between the changes: so a client that applies what it receives in order (read,
insert, update: the row; delete: gone) ends with each table's current rows, as a backfill's
consumer does (docs/snapshots.md).  Frames of type ``snapshot`` tell it how each run goes:
``queued`` at once, then ``done`` (in the stream, after the run's last ``read`` event),
``refused`` (with the worker's reason) or ``cancelled`` (by ``lapidusctl backfill --cancel``).

Clients that ask for a table whose run for another client is still queued (not started)
join that run instead of queueing one more.  A run is asked for synchronously, on the loop
(:class:`lapidus.supervisor.sink_snapshots.SnapshotRequests`, a few fsyncs): its number, and
so the client it belongs to, is then known before any of its events can arrive.  A client
that goes away cancels its runs (those no other client shares).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple

import orjson

from ...events import Record
from ...sink_runs import run_label
from ..subjects import decode_token
from .replay import text_frame

if TYPE_CHECKING:
    from .clients import Client

#: seconds between looks for refused or cancelled runs, while some are queued
SETTLED_EVERY = 1.0


class RunSubject(str):
    """The subject of an event of a client's run, as the replay buffer keeps it: matched only
    by the clients of that run (:meth:`.clients.Subscription.frames`); the run's end matches
    them whatever their patterns."""

    def __new__(cls, subject: str, run: str, end: bool = False):
        made = super().__new__(cls, subject)
        made.run = run
        made.end = end
        return made


def tables_of(patterns: Optional[Sequence[str]]) -> List[str]:
    """``schema.table`` of each pattern (in order, once each); ValueError with the reason when
    a pattern does not name one table."""
    if not patterns:
        raise ValueError("snapshot=1 needs subjects that name the tables, such as "
                         "subjects=public.items.>")
    tables = []
    for pattern in patterns:
        tokens = pattern.split(".")
        if len(tokens) < 3 or any(t in ("*", ">") for t in tokens[:2]) \
                or tokens[0].startswith("_"):
            raise ValueError(f'snapshot=1: "{pattern}" does not name one table; give '
                             f"schema.table.> (or schema.table.<key>) for each table to read")
        table = f"{decode_token(tokens[0])}.{decode_token(tokens[1])}"
        if table not in tables:
            tables.append(table)
    return tables


class Run:
    __slots__ = ("backend", "n", "label", "table", "clients")

    def __init__(self, backend: str, n: int, label: str, table: str):
        self.backend = backend
        self.n = n
        self.label = label
        self.table = table
        self.clients: Set["Client"] = set()


def state_frame(run: Run, state: str, **fields) -> bytes:
    return text_frame(orjson.dumps({"type": "snapshot", "state": state,
                                    "backend": run.backend, "table": run.table, "n": run.n,
                                    **fields}))


class SnapshotRuns:
    """The runs of one hub's clients, per backend (one instance per :class:`.server.Hub`)."""

    def __init__(self, log):
        self.log = log
        self.requests: Dict[str, object] = {}    # backend -> its SnapshotRequests
        self.runs: Dict[str, Dict[str, Run]] = {}    # backend -> label -> run

    def attach(self, backend: str, requests) -> None:
        """The sink of ``backend`` is here; runs of an earlier listener (or dispatcher) are
        nobody's any more: cancel them."""
        if requests is None:
            return
        self.requests[backend] = requests
        mine = self.runs.setdefault(backend, {})
        leftovers = requests.leftovers(run.n for run in mine.values())
        if leftovers:
            requests.cancel(leftovers)
            self.log.info("websocket snapshot runs of clients gone cancelled",
                          backend=backend, runs=leftovers)

    def unavailable(self, backends: Sequence[str]) -> Optional[str]:
        for backend in backends:
            requests = self.requests.get(backend)
            if requests is None:
                return f"snapshot runs are not available for backend {backend}"
            if requests.unavailable:
                return requests.unavailable
        return None

    def start(self, client: "Client", backends: Sequence[str], tables: Sequence[str]
              ) -> Tuple[List[str], bytes]:
        """Ask for a run per backend and table for ``client``: its run labels, and the
        ``queued`` frames to send it first.  OSError (the request files cannot be written)
        after cancelling the runs already asked for."""
        labels, frames = [], []
        try:
            for backend in backends:
                requests = self.requests[backend]
                for table in tables:
                    run = self._joinable(backend, table, requests)
                    if run is None:
                        n = requests.request(table)
                        run = Run(backend, n, run_label(n, requests.sink), table)
                        self.runs.setdefault(backend, {})[run.label] = run
                    run.clients.add(client)
                    labels.append(run.label)
                    frames.append(state_frame(run, "queued"))
                requests.wake()
        except OSError:
            self.gone(client)
            raise
        return labels, b"".join(frames)

    def _joinable(self, backend: str, table: str, requests) -> Optional[Run]:
        """A run of ``table`` for other clients that has not started yet: clients that
        connect together share one read of the table instead of queueing one each."""
        candidates = {run.n: run for run in self.runs.get(backend, {}).values()
                      if run.table == table and run.clients}
        if not candidates:
            return None
        waiting = requests.not_started(list(candidates))
        return candidates[waiting[-1]] if waiting else None

    def wanted(self, backend: str, label: str) -> bool:
        run = self.runs.get(backend, {}).get(label)
        return run is not None and bool(run.clients)

    def end_subject_and_frame(self, backend: str, label: str, record: Record
                              ) -> Tuple[RunSubject, bytes]:
        """The ``done`` frame of a run whose end event arrived; the run is over."""
        run = self.runs[backend].pop(label)
        rows = (orjson.loads(record.data).get("item") or {}).get("rows")
        self.log.info("websocket snapshot run done", backend=backend, n=run.n, table=run.table,
                      rows=rows)
        return RunSubject("", label, end=True), state_frame(run, "done", rows=rows)

    def gone(self, client: "Client") -> None:
        """``client`` disconnected: its runs that nobody else waits for are cancelled."""
        for backend, runs in self.runs.items():
            cancelled = []
            for label, run in list(runs.items()):
                run.clients.discard(client)
                if not run.clients:
                    del runs[label]
                    cancelled.append(run.n)
            if cancelled:
                self.requests[backend].cancel(cancelled)
                self.log.info("websocket snapshot runs cancelled: their client left",
                              backend=backend, runs=cancelled)

    def queued(self) -> bool:
        return any(self.runs.values())

    def check_settled(self) -> None:
        """Runs that will not end: refused by the worker (a table it does not stream ...) or
        cancelled by an operator (``lapidusctl backfill --cancel``); tell their clients."""
        for backend, runs in self.runs.items():
            if not runs:
                continue
            settled = self.requests[backend].settled(run.n for run in runs.values())
            for label, run in list(runs.items()):
                if run.n not in settled:
                    continue
                del runs[label]
                reason = settled[run.n]
                frame = (state_frame(run, "cancelled") if reason is None
                         else state_frame(run, "refused", reason=reason))
                for client in run.clients:
                    client.write(frame, 0)
                self.log.info("websocket snapshot run " + ("cancelled" if reason is None
                                                           else "refused"),
                              backend=backend, n=run.n, table=run.table, reason=reason)


__all__ = ("RunSubject", "SnapshotRuns", "tables_of")
