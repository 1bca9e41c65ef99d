"""How far a snapshot is: its part of the worker's checkpoint, and its status fields.

Runs in the worker process.  The state is plain JSON inside the source's checkpoint
(``"snapshot"`` key), advanced only when a chunk's ``read`` events are in the batch that
carries the new checkpoint: the worker saves a checkpoint once the sinks confirmed its
batch, so after a crash the snapshot resumes after the last *delivered* chunk.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple


class SnapshotProgress:
    """Tables in snapshot order; those before ``index`` are done; ``last_key`` is the last key
    (source's raw form) of the last emitted chunk of ``tables[index]``, None before its first.
    """

    def __init__(self, n: int, tables: Sequence[Tuple[str, str]], index: int = 0,
                 last_key: Optional[List[Any]] = None, rows: int = 0, table_rows: int = 0,
                 where: Optional[str] = None, cancelled: bool = False,
                 sink: Optional[str] = None):
        self.n = n                      # 0: the initial snapshot; 1, 2, ...: backfills
        self.where = where              # a backfill's condition (SQL, or a MongoDB filter)
        self.sink = sink                # the run is this sink's alone (lapidus.sink_runs)
        self.cancelled = cancelled
        self.tables = [tuple(t) for t in tables]
        self.index = index
        self.last_key = last_key
        self.rows = rows                # read rows emitted so far, all tables
        self.table_rows = table_rows    # of the current table
        self.estimates: Dict[Tuple[str, str], Optional[int]] = {}
        self._started = time.monotonic()
        self._rows_at_start = rows

    # -- checkpoint ----------------------------------------------------------------------

    def state(self) -> dict:
        if self.done:
            state = {"n": self.n, "done": True, "rows": self.rows}
            if self.cancelled:
                state["cancelled"] = True
            if self.sink is not None:
                state["sink"] = self.sink
            return state
        state = {"n": self.n, "done": False, "tables": [list(t) for t in self.tables],
                 "index": self.index, "last_key": self.last_key, "rows": self.rows,
                 "table_rows": self.table_rows}
        if self.where is not None:
            state["where"] = self.where
        if self.sink is not None:
            state["sink"] = self.sink
        return state

    @classmethod
    def from_state(cls, state: dict) -> "SnapshotProgress":
        if state.get("done"):
            return cls(state.get("n", 0), [], 0, None, state.get("rows", 0),
                       cancelled=bool(state.get("cancelled")), sink=state.get("sink"))
        return cls(state.get("n", 0), state.get("tables", []), state.get("index", 0),
                   state.get("last_key"), state.get("rows", 0), state.get("table_rows", 0),
                   where=state.get("where"), sink=state.get("sink"))

    # -- moving on -----------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.index >= len(self.tables)

    @property
    def table(self) -> Optional[Tuple[str, str]]:
        return None if self.done else self.tables[self.index]

    def chunk_emitted(self, last_key: Optional[List[Any]], emitted: int,
                      selected: int, chunk_rows: int) -> None:
        """A chunk's rows are in the outgoing batch: a short chunk ends the table."""
        self.rows += emitted
        self.table_rows += emitted
        if selected < chunk_rows or last_key is None:
            self.index += 1
            self.last_key = None
            self.table_rows = 0
        else:
            self.last_key = last_key

    def cancel(self) -> None:
        self.index = len(self.tables)
        self.last_key = None
        self.cancelled = True

    # -- status --------------------------------------------------------------------------

    def status(self) -> dict:
        """``snapshot`` field of the worker's stats (``lapidusctl status --json``)."""
        elapsed = max(time.monotonic() - self._started, 1e-6)
        rate = round((self.rows - self._rows_at_start) / elapsed, 1)
        if self.done:
            out = {"n": self.n, "state": "cancelled" if self.cancelled else "done",
                   "rows": self.rows}
            if self.sink is not None:
                out["sink"] = self.sink
            return out
        schema, table = self.tables[self.index]
        return {"n": self.n, "state": "running", "table": f"{schema}.{table}",
                "where": self.where, "sink": self.sink,
                "tables_done": self.index, "tables": len(self.tables),
                "table_rows": self.table_rows,
                "table_rows_estimated": self.estimates.get((schema, table)),
                "rows": self.rows, "rows_per_second": rate}


class RunAtOpen:
    """Which snapshot run a source's ``open`` starts from its checkpoint (worker process).

    One per source, kept across reconnects (it says "has no effect" once per process):

    * a checkpoint with a ``"snapshot"`` state: that run's progress (a finished one too, so
      the checkpoint keeps it; an unfinished one, initial or backfill, is resumed);
    * no checkpoint and ``snapshot = "initial"``: a new initial run over ``list_tables()``;
    * otherwise none.
    """

    def __init__(self, options: dict, log):
        self.initial = (options.get("snapshot") or "never") != "never"
        self.log = log
        self._said_ignored = False

    def progress(self, checkpoint: Any, list_tables) -> Optional[SnapshotProgress]:
        state = checkpoint.get("snapshot") if isinstance(checkpoint, dict) else None
        if state is not None:
            progress = SnapshotProgress.from_state(state)
            if not progress.done:
                self.log.info("snapshot resumed", n=progress.n, table=".".join(progress.table),
                              last_key=progress.last_key, rows=progress.rows)
            return progress
        if checkpoint is None and self.initial:
            progress = SnapshotProgress(0, list_tables())
            self.log.info("snapshot started", tables=len(progress.tables))
            return progress
        if self.initial and not self._said_ignored:
            self._said_ignored = True
            self.log.info('snapshot = "initial" has no effect: this backend already has a '
                          "checkpoint (it streamed before), and the initial snapshot runs "
                          "only on a first start; re-read a table's rows with "
                          "lapidusctl backfill")
        return None
