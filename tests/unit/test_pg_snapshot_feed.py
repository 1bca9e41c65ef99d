"""PgSnapshot.feed without a database: what the stream does to a held chunk, in order."""

from __future__ import annotations

from lapidus.workers.postgresql.decoding import Begin, Change, Commit, Watermark
from lapidus.workers.postgresql.snapshot import PgSnapshot
from lapidus.workers.postgresql.transactions import TransactionAssembler
from lapidus.workers.snapshot.progress import SnapshotProgress
from lapidus.workers.snapshot.window import ChunkWindow


class Log:
    def __init__(self):
        self.lines = []

    def info(self, event, **fields):
        self.lines.append(event)

    warning = info


def snapshot(chunk_rows=3):
    progress = SnapshotProgress(0, [("public", "t")])
    snap = PgSnapshot("b", {"snapshot_chunk_rows": chunk_rows}, None, progress, Log())
    window = ChunkWindow("b:0:n:1", "public", "t", ["id"])
    window.hold([({"id": i}, {"id": i, "v": "old"}) for i in (1, 2, 3)], ["3"])
    snap.window = window
    return snap


def run(snap, messages):
    assembler = TransactionAssembler("b")
    events, cuts = [], []
    for message in messages:
        cuts.append(snap.feed(message, assembler.feed, events, assembler))
    return events, cuts


def mark(kind, lsn):
    return [Begin(lsn, "9", "2026-12-01T00:00:00.000Z"),
            Watermark(f"b:0:n:1:{kind}"),
            Commit(lsn)]


def test_changes_before_the_high_watermark_win_and_the_rest_is_read_right_there():
    snap = snapshot()
    stream = [*mark("low", 100),
              Begin(200, "10", "2026-12-01T00:00:01.000Z"),
              Change("update", "public", "t", {"id": 2}, {"id": 2, "v": "new"}, {"id": 2}),
              Commit(200),
              *mark("high", 300),
              Begin(400, "11", "2026-12-01T00:00:02.000Z"),
              Change("update", "public", "t", {"id": 3}, {"id": 3, "v": "later"}, {"id": 3}),
              Commit(400)]
    events, cuts = run(snap, stream)
    assert [(e.type, e.pk["id"]) for e in events] == [
        ("update", 2), ("read", 1), ("read", 3), ("update", 3)]
    assert [e.item["v"] for e in events] == ["new", "old", "old", "later"]
    read = events[1]
    assert read.position == "0/12C" and read.ts == "2026-12-01T00:00:00.000Z"
    assert cuts.count(True) == 1 and cuts[7] is True       # the batch ends at the high mark
    assert snap.window is None and snap.progress.last_key == ["3"]
    assert not any(e.type == "message" for e in events)


def test_an_earlier_windows_watermark_is_dropped_and_other_messages_pass():
    snap = snapshot()
    stream = [Begin(100, "9", None), Watermark("b:0:old:7:high"), Commit(100),
              Begin(150, "9", None),
              Change("message", prefix="app", content="x", transactional=True),
              Commit(150)]
    events, cuts = run(snap, stream)
    assert [e.type for e in events] == ["message"]
    assert not any(cuts) and snap.window is not None


def test_a_watermark_without_a_snapshot_is_no_event():
    assembler = TransactionAssembler("b")
    events = []
    for message in mark("high", 100):
        assembler.feed(message, events)
    assert events == []


def test_the_last_short_chunk_finishes_the_snapshot():
    snap = snapshot(chunk_rows=5)                            # 3 rows < 5: the table is done
    events, _ = run(snap, mark("low", 100) + mark("high", 200))
    assert [e.type for e in events] == ["read"] * 3
    assert snap.progress.done and "snapshot finished" in snap.log.lines
