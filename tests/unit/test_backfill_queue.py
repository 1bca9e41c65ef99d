"""The backfill request files and the worker's handling of them, without a database."""

from __future__ import annotations

from lapidus.workers.snapshot.backfills import Backfills
from lapidus.workers.snapshot.progress import SnapshotProgress
from lapidus.workers.snapshot.requests import BackfillQueue
from lapidus.workers.snapshot.run import SnapshotRefused


class Log:
    def __init__(self):
        self.lines = []

    def info(self, event, **fields):
        self.lines.append((event, fields))

    warning = info


class Source:
    """Runs one backfill at a time like a real source; refuses tables named "bad"."""

    def __init__(self):
        self.snapshot_progress = None
        self.cancelled = []

    def start_backfill(self, n, table, where, sink=None):
        if table == "bad":
            raise SnapshotRefused(f'backfill of "{table}": no such table')
        self.snapshot_progress = SnapshotProgress(n, [("public", table)], where=where,
                                                  sink=sink)
        return f"public.{table}"

    def cancel_snapshot(self):
        self.cancelled.append(self.snapshot_progress.n)
        self.snapshot_progress.cancel()


def test_numbers_grow_and_survive_a_lost_sequence_file(tmp_path):
    queue = BackfillQueue(tmp_path)
    assert [queue.add("a", None).n, queue.add("b", "x > 1").n] == [1, 2]
    (tmp_path / "backfills" / "sequence").unlink()
    assert queue.add("c", None).n == 3                     # never below a file on disk
    assert [(r.n, r.table, r.where) for r in queue.pending()] == [
        (1, "a", None), (2, "b", "x > 1"), (3, "c", None)]
    assert [r.n for r in queue.cancel("b")] == [2]
    assert [r.n for r in queue.pending()] == [1, 3]


def test_one_run_at_a_time_refusals_and_forgetting_only_after_a_saved_checkpoint(tmp_path):
    queue, source, log = BackfillQueue(tmp_path), Source(), Log()
    backfills = Backfills(queue, log)
    for table in ("bad", "a", "b"):
        queue.add(table, None)
    backfills.poll(source, None)
    assert source.snapshot_progress.n == 2                 # 1 refused, 2 runs, 3 waits
    assert [r["n"] for r in queue.refused()] == [1]
    assert backfills.status()["queued"][0]["n"] == 3
    source.snapshot_progress.chunk_emitted(None, 10, 0, 100)   # 2 finishes (not yet saved)
    backfills.poll(source, {"snapshot": {"n": 1, "done": True}})
    assert source.snapshot_progress.n == 3
    assert [r.n for r in queue.pending()] == [2, 3]        # 2 stays until a save says done
    backfills.poll(source, {"snapshot": {"n": 2, "done": True}})
    assert [r.n for r in queue.pending()] == [3]


def test_a_removed_request_cancels_its_run(tmp_path):
    queue, source = BackfillQueue(tmp_path), Source()
    backfills = Backfills(queue, Log())
    queue.add("a", None)
    backfills.poll(source, None)
    queue.cancel()
    backfills.poll(source, None)
    assert source.cancelled == [1] and source.snapshot_progress.state() == {
        "n": 1, "done": True, "rows": 0, "cancelled": True}


def test_refusals_are_kept_to_the_newest(tmp_path):
    queue = BackfillQueue(tmp_path)
    for _ in range(5):
        queue.refuse(queue.add("x", None), "no", keep=3)
    assert [r["n"] for r in queue.refused()] == [3, 4, 5]
