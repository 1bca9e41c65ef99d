"""What the snapshot tests of every source (PostgreSQL, MySQL, MongoDB) share: the consumer's
fold, a concurrent writer, waiting on the real Lapidus with its log at a failure, the
snapshot's status row, and a backfill held so that the writer's changes fall inside it.

The folding guarantee (docs/snapshots.md): a consumer that applies the events in arrival
order (read/insert/update -> the row, delete -> gone, truncate -> empty) ends with exactly
the table's content, whatever is written meanwhile and whatever process is killed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
from typing import Callable

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import backend_status, ctl


def fold(events, table="t", key: Callable[[dict], object] = lambda pk: pk["id"]):
    """The consumer's copy of ``table``: key(pk) -> item (events as dicts, from stdout).
    read/insert/update/replace set the item (an update whose item is null, its document
    deleted before MongoDB's lookup, is skipped: the delete follows it), delete removes,
    truncate empties."""
    copy = {}
    for e in events:
        if e["table"] != table:
            continue
        if e["type"] in ("read", "insert", "update", "replace"):
            if e["item"] is not None:
                copy[key(e["pk"])] = e["item"]
        elif e["type"] == "delete":
            copy.pop(key(e["pk"]), None)
        elif e["type"] == "truncate":
            copy.clear()
    return copy


class ConcurrentWriter(threading.Thread):
    """Random inserts, updates and deletes until stopped, on a connection of its own:
    subclasses give :meth:`connect` and :meth:`write` (one statement of the kind drawn).
    ``pause`` (seconds) paces the writes, for tests whose sink pays for every change (a
    JetStream cluster, a sync target) and would otherwise spend minutes behind the writer."""

    def __init__(self, top: int, seed: int = 7, pause: float = 0.0):
        super().__init__(daemon=True)
        self.top, self.random = top, random.Random(seed)
        self.pause = pause
        self.halt = threading.Event()
        self.done = 0
        self.error = None

    def connect(self):
        raise NotImplementedError

    def write(self, cur, kind: str, i: int) -> None:
        """``kind`` is ``update``, ``delete`` or ``insert`` (of ``i + top``)."""
        raise NotImplementedError

    def run(self):
        try:
            conn = self.connect()
        except Exception as exc:   # reported by stop(), not lost in the thread
            self.error = exc
            return
        try:
            cur = conn.cursor()
            while not self.halt.is_set():
                i = self.random.randint(1, self.top)
                draw = self.random.random()
                kind = "update" if draw < 0.5 else "delete" if draw < 0.75 else "insert"
                self.write(cur, kind, i)
                self.done += 1
                if self.pause:
                    self.halt.wait(self.pause)
        except Exception as exc:
            self.error = exc
        finally:
            conn.close()

    def wait_for_changes(self, count: int, timeout: float = 30.0) -> None:
        """Return once ``count`` more changes than now are committed.  A test that holds a
        snapshot run meanwhile (reads nothing, or freezes the dispatcher) so places them
        inside the run, however fast the run is."""
        target = self.done + count
        wait_until(lambda: self.done >= target or self.error is not None, timeout,
                   message=f"{count} more changes by the writer")
        assert self.error is None, self.error

    def stop(self) -> None:
        """Halt and join; the writer's own failure, if any, fails the test."""
        self.halt.set()
        self.join(10)
        assert self.error is None, self.error


def until(proc, predicate, timeout, what, backend="pg", interval=0.05):
    """wait_until, failing with the backend's status and the Lapidus log at the failure."""
    try:
        return wait_until(predicate, timeout, interval=interval, message=what)
    except pytest.fail.Exception:
        pytest.fail(f"timed out after {timeout}s waiting for {what}; status: "
                    f"{backend_status(proc.config_path, backend)}\nlog:\n{proc.log()[-4000:]}")


def snapshot_state(proc, backend="pg"):
    row = backend_status(proc.config_path, backend)
    return (row.get("snapshot") or {}) if row else {}


# The backend settings of a test that uses kill_worker_mid_snapshot: one batch in flight, and
# small (a chunk is sent whole), so that it fits in the worker's socket to the frozen
# dispatcher and the worker, held by backpressure instead of a blocked send, goes on
# reporting its progress.
MID_SNAPSHOT_WINDOW = {"max_inflight_batches": 1, "batch_size": 200, "snapshot_chunk_rows": 200}

# The same for rows of many columns (the sync tests' tables): a batch of 200 of them may not fit
# in the socket, and a worker blocked in its send to the frozen dispatcher reports nothing.
WIDE_ROWS_WINDOW = {**MID_SNAPSHOT_WINDOW, "batch_size": 20}


def backfill_under_writer(proc, writer: ConcurrentWriter, backend: str, table: str,
                          changes: int = 100):
    """``lapidusctl backfill BACKEND TABLE --wait`` with ``changes`` of the writer's changes
    inside the run, however fast it is: the dispatcher is frozen (SIGSTOP) before the request,
    so the worker is held one batch into the run (MID_SNAPSHOT_WINDOW); once the run shows
    ``running`` and the writer has made its changes, the dispatcher goes on.  Returns
    lapidusctl's (code, out, err)."""
    result = []
    dispatcher = proc.dispatcher_pid()
    os.kill(dispatcher, signal.SIGSTOP)
    try:
        asking = threading.Thread(target=lambda: result.append(
            ctl(proc.config_path, "backfill", backend, table, "--wait")), daemon=True)
        asking.start()
        until(proc, lambda: snapshot_state(proc, backend).get("state") == "running", 30,
              "the backfill running", backend)
        writer.wait_for_changes(changes)
    finally:
        os.kill(dispatcher, signal.SIGCONT)
    asking.join(120)
    assert result, "lapidusctl backfill --wait did not return"
    return result[0]


def kill_worker_mid_snapshot(proc, backend: str, table: str, at_rows: int = 60_000,
                             run_sql: Callable[..., None] | None = None,
                             delivered: Callable[[], int] | None = None,
                             finish_within: float = 90) -> tuple[dict, dict]:
    """kill -9 the worker of ``backend`` ``at_rows`` rows into its snapshot or backfill of
    ``table`` (one table), after changing rows the chunks already read (``run_sql(*statements)``,
    when given); wait until the new worker says it resumed from a chunk and the run is done.
    Returns the run's status row as it was before the kill, and the "snapshot resumed" record.

    ``delivered()`` counts the rows the sinks have, reads or not (a synced copy's rows); by
    default, the read events in the stdout sink's file, and then the status must show at least
    ``at_rows`` read before the kill.  The backend runs with MID_SNAPSHOT_WINDOW's (or
    WIDE_ROWS_WINDOW's) ``max_inflight_batches`` and ``batch_size``."""
    # On a quiet host a 200k-row snapshot takes about a second, less than a status report's
    # period: so the dispatcher is frozen once ``at_rows`` rows are delivered, which holds the
    # worker one batch further on (MID_SNAPSHOT_WINDOW), mid-snapshot, until the kill.
    if delivered is None:
        wait_reads_written(proc, at_rows, 60)
        reported = at_rows
    else:
        wait_until(lambda: delivered() >= at_rows, 60, interval=0.005,
                   message=f"{at_rows} rows delivered")
        reported = 1
    dispatcher = proc.worker_pid("dispatch")
    os.kill(dispatcher, signal.SIGSTOP)
    try:
        running = until(proc, lambda: (lambda s: s if s.get("rows", 0) >= reported else None)(
            snapshot_state(proc, backend)), 60, "a part of the snapshot", backend)
        assert running["state"] == "running" and running["table"] == table
        assert running["tables"] == 1 and running["rows_per_second"] > 0
        if run_sql is not None:
            run_sql("UPDATE t SET v = 'changed' WHERE id % 1000 = 0",
                    "DELETE FROM t WHERE id % 1000 = 1")
        old = proc.worker_pid(backend)
        os.kill(old, signal.SIGKILL)
    finally:
        os.kill(dispatcher, signal.SIGCONT)
    wait_until(lambda: proc.worker_pid(backend) != old, 30, message="a new worker")
    until(proc, lambda: "snapshot resumed" in proc.log(), 30, "the snapshot to resume", backend)
    resumed = [json.loads(line) for line in proc.log().splitlines()
               if '"snapshot resumed"' in line][0]
    assert resumed["last_key"] and int(resumed["rows"]) > 0
    until(proc, lambda: snapshot_state(proc, backend).get("state") == "done", finish_within,
          "the snapshot to finish", backend)
    return running, resumed


def wait_reads_written(proc, count: int, timeout: float) -> None:
    """Until the stdout sink's file of ``proc`` holds ``count`` read events, counted as they
    are written (each look reads only what is new, so it can look every few milliseconds)."""
    seen = {"reads": 0, "offset": 0}

    def enough() -> bool:
        try:
            with open(proc.stdout_path, "rb") as f:
                f.seek(seen["offset"])
                data = f.read()
        except FileNotFoundError:
            return False
        complete = data[:data.rfind(b"\n") + 1]      # a line being written is read next time
        seen["offset"] += len(complete)
        seen["reads"] += complete.count(b'"type":"read"')
        return seen["reads"] >= count
    wait_until(enough, timeout, interval=0.005, message=f"{count} read events written")


def resumed_reads(events, rows: int = 200_000) -> int:
    """The read events of a snapshot of ``rows`` rows resumed from a chunk after a kill -9.

    Only what was emitted but not yet in a saved checkpoint at the kill is read again
    (checkpoints every 0.2 s, plus the chunks in flight); from zero it would be 1.3 times
    ``rows`` or more. The writer deletes some rows meanwhile."""
    reads = sum(1 for e in events if e["type"] == "read")
    assert rows * 0.95 <= reads < rows * 1.2, reads
    return reads
