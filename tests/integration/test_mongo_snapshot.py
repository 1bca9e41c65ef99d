"""Initial snapshots and backfills on MongoDB (SecantusDB by default, see mongo_fixtures).

The folding guarantee (docs/snapshots.md, section MongoDB): a consumer that applies the
events in arrival order (read/insert/update/replace -> the document, delete -> gone) ends with
exactly the collection's content, whatever is written meanwhile and whatever is killed.  The
supervised tests go through the real supervisor, worker and stdout; the backfill tests drive
:class:`MongoSource` directly (the worker loop does not start backfills yet).
"""

from __future__ import annotations

import collections
import datetime
import json
import math
import random
import threading
import uuid

import pymongo
import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp

from lapidus.workers.base import BackendError
from lapidus.workers.mongo.bson_json import document_to_json
from lapidus.workers.snapshot.run import SnapshotRefused
from tests.conftest import wait_until
from tests.integration import snapshot_helpers
from tests.integration.mongo_fixtures import (Pump, mongo, mongo_process,  # noqa: F401
                                              options_for, sources)

BACKEND = "cms"


def fold(events, collection="docs"):
    """The consumer's copy of the collection: _id (JSON form) -> item."""
    return snapshot_helpers.fold(events, collection, lambda pk: json.dumps(pk["_id"]))


def content(mongo, collection="docs", where=None):
    """The collection as the fold holds it."""
    return {json.dumps(document_to_json(doc)["_id"]): document_to_json(doc)
            for doc in mongo.db[collection].find(where or {})}


def until(proc, predicate, timeout, what):
    # every poll of the status starts a lapidusctl process: not too often on a busy machine
    return snapshot_helpers.until(proc, predicate, timeout, what, BACKEND, interval=0.3)


def snapshot_state(proc):
    return snapshot_helpers.snapshot_state(proc, BACKEND)


def fill(mongo, count, collection="docs"):
    """``count`` documents with int ``_id`` 1..count (the writer adds string ids: two BSON
    type brackets the chunks must cross in sort order)."""
    docs = mongo.db[collection]
    for start in range(1, count + 1, 5000):
        docs.insert_many([{"_id": i, "v": f"r{i}", "grp": i % 3, "n": Int64(i)}
                          for i in range(start, min(start + 5000, count + 1))])


class Writer(threading.Thread):
    """Random updates, deletes and inserts on ``docs`` until stopped (its own client)."""

    def __init__(self, mongo, top: int, seed: int = 7):
        super().__init__(daemon=True)
        self.uri, self.database, self.top = mongo.uri, mongo.database, top
        self.random = random.Random(seed)
        self.halt = threading.Event()
        self.done = 0
        self.error = None

    def run(self):
        client = pymongo.MongoClient(self.uri)
        docs = client[self.database].docs
        try:
            while not self.halt.is_set():
                i = self.random.randint(1, self.top)
                kind = self.random.random()
                if kind < 0.5:      # grp is never changed: the filtered backfill relies on it
                    docs.update_one({"_id": i}, {"$set": {"v": f"u{self.done}"},
                                                 "$inc": {"n": 1}})
                elif kind < 0.75:
                    docs.delete_one({"_id": i})
                else:
                    docs.replace_one({"_id": f"i{i}"}, {"v": f"i{self.done}", "grp": i % 3},
                                     upsert=True)
                self.done += 1
        except Exception as exc:   # reported by stop(), not lost in the thread
            self.error = exc
        finally:
            client.close()

    def stop(self) -> None:
        """Halt and join; the writer's own failure, if any, fails the test."""
        self.halt.set()
        self.join(10)
        assert self.error is None, self.error


def backend(mongo, **options) -> dict:
    out = {"name": BACKEND, "type": "mongo", "uri": mongo.uri, "database": mongo.database,
           "snapshot": "initial"}
    out.update(options)
    return out


def wait_sentinel(proc, mongo, timeout=60):
    """Insert a document after everything else and wait for it: the stream is complete."""
    mongo.db.docs.insert_one({"_id": -1, "v": "sentinel"})
    return until(
        proc, lambda: (lambda ev: ev if any(e["type"] == "insert" and e["pk"] == {"_id": -1}
                                            for e in ev) else None)(proc.events()),
        timeout, "the sentinel document on stdout")


def test_initial_snapshot_under_a_concurrent_writer_folds_to_the_collection(
        mongo_process, lapidus_factory):
    mongo = mongo_process
    fill(mongo, 20_000)
    mongo.db.other.insert_many([{"_id": i} for i in range(1, 11)])
    mongo.db.skipped.insert_one({"_id": 1})
    writer = Writer(mongo, 20_000)
    writer.start()
    try:
        proc = lapidus_factory({
            "backends": [backend(mongo, snapshot_chunk_rows=5000, exclude_tables=["skipped"])],
            "plugins": {"stdout": {}}})
        until(proc, lambda: snapshot_state(proc).get("state") == "done", 90,
              "the snapshot to finish")
    finally:
        writer.stop()
    assert writer.done > 100                 # the writer really ran during the snapshot
    events = wait_sentinel(proc, mongo)
    assert fold(events) == content(mongo)
    assert fold(events, "other") == {str(i): {"_id": i} for i in range(1, 11)}
    assert not any(e["table"] in ("skipped", "lapidus_watermarks") for e in events)
    # the writer's changes are interleaved with the reads
    kinds = [e["type"] for e in events if e["table"] == "docs"]
    first, last = kinds.index("read"), len(kinds) - 1 - kinds[::-1].index("read")
    assert sum(k != "read" for k in kinds[first:last]) > 50
    reads = [e for e in events if e["type"] == "read"]
    assert all(e["before"] is None and e["txid"] is None for e in reads)
    assert reads[0]["id"] == f"{BACKEND}:read:0:{mongo.database}.docs:[1]"
    assert len({e["id"] for e in reads}) == len(reads)
    # both _id brackets were read in chunks: numbers, then the writer's strings
    read_ids = [e["pk"]["_id"] for e in reads if e["table"] == "docs"]
    assert isinstance(read_ids[0], int) and isinstance(read_ids[-1], str)
    assert "snapshot finished" in proc.log()


def test_kill_9_mid_snapshot_resumes_from_a_chunk(mongo_process, lapidus_factory):
    mongo = mongo_process
    # 20k documents, not PostgreSQL's 200k: SecantusDB scans the whole collection for every
    # chunk's find (no _id index ranges; 50-300 us a document, depending on the machine's
    # load), so a chunk costs time in proportion to the collection: 30k already took 75 s
    # on a busy machine, 200k would take many minutes
    total, chunk = 20_000, 4000
    fill(mongo, total)
    writer = Writer(mongo, total, seed=11)
    proc = lapidus_factory({
        "backends": [backend(mongo, snapshot_chunk_rows=chunk, max_inflight_batches=1,
                             batch_size=200)],
        "plugins": {"stdout": {}}, "supervisor": {"backoff_initial": 0.1}})
    writer.start()
    try:
        running, resumed = snapshot_helpers.kill_worker_mid_snapshot(
            proc, BACKEND, f"{mongo.database}.docs", at_rows=2 * chunk)
        # estimated when the run began, the writer already at work
        assert abs(running["table_rows_estimated"] - total) < 2000
    finally:
        writer.stop()
    # the last _id of the last confirmed chunk, in Extended JSON
    last = int(resumed["last_key"][0]["$numberInt"])
    assert last >= chunk and int(resumed["rows"]) >= chunk - 1000
    events = wait_sentinel(proc, mongo)
    assert fold(events) == content(mongo)
    # resumed after that chunk, not from zero: no document up to it was read twice
    ids = [e["pk"]["_id"] for e in events if e["type"] == "read"]
    early = collections.Counter(i for i in ids if isinstance(i, int) and i <= last)
    assert len(early) > chunk - 1000 and set(early.values()) == {1}
    assert len(ids) > total - 5000


def test_a_finished_snapshot_is_never_repeated(mongo, sources, tmp_path):
    fill(mongo, 300)
    source = sources(options_for(mongo, snapshot="initial", snapshot_chunk_rows=100))
    pump = Pump(source, tmp_path / "state").open()
    pump.until(lambda d: not source.snapshot_running() and len(d) >= 300, "the snapshot")
    assert source.status()["snapshot"] == {"n": 0, "state": "done", "rows": 300}
    assert pump.store.load()["snapshot"] == {"n": 0, "done": True, "rows": 300}
    source.close()
    again = Pump(sources(options_for(mongo, snapshot="initial")), tmp_path / "state").open()
    mongo.db.docs.insert_one({"_id": 1000})
    events = again.until(lambda d: any(e.pk == {"_id": 1000} for e in d), "the new document")
    assert [e.type for e in events] == ["insert"]


def test_read_documents_carry_every_type_exactly_as_an_insert_maps_it(mongo, sources, tmp_path):
    # (no date outside years 1-9999: SecantusDB 0.7.0b3 cannot store one)
    document = {
        "dec": Decimal128("1.50"), "nan": float("nan"), "inf": -math.inf, "long": Int64(2**40),
        "oid": ObjectId("65a1b2c3d4e5f60718293a4b"), "when": datetime.datetime(2026, 1, 2, 3, 4, 5,
                                                                                 678000),
        "bin": Binary(b"\x00\x01\xff"),
        "uuid": Binary(uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e").bytes, 4),
        "ts": Timestamp(1700000000, 3), "re": Regex("^a.b", "im"), "code": Code("x + 1"),
        "min": MinKey(), "max": MaxKey(), "nested": {"a": [1, {"b": None}, "s", True]},
    }
    mongo.db.types.insert_one(dict(document, _id=1))
    source = sources(options_for(mongo, snapshot="initial"))
    pump = Pump(source, tmp_path / "state").open()
    pump.until(lambda d: not source.snapshot_running() and d, "the read event")
    mongo.db.types.insert_one(dict(document, _id=2))
    events = pump.until(lambda d: len(d) >= 2, "the insert event")
    read, insert = events
    assert (read.type, insert.type) == ("read", "insert")
    assert read.item.pop("_id") == 1 and insert.item.pop("_id") == 2
    assert json.dumps(read.item, sort_keys=True) == json.dumps(insert.item, sort_keys=True)
    assert read.item["dec"] == "1.50" and read.item["oid"] == "65a1b2c3d4e5f60718293a4b"


def test_an_objectid_and_its_hex_string_are_two_documents_in_the_held_chunk(mongo, sources,
                                                                            tmp_path):
    """The window keys documents by their BSON _id: a change of one evicts it, not the other,
    though both have the same JSON pk."""
    oid = ObjectId("65a1b2c3d4e5f60718293a4b")
    mongo.db.docs.insert_many([{"_id": oid, "v": "object id"}, {"_id": str(oid), "v": "text"}])
    source = sources(options_for(mongo, snapshot="initial"))
    pump = Pump(source, tmp_path / "state").open()
    snapshot = source.snapshot
    collection = snapshot.collection

    def changed_while_the_window_is_open(db, coll):
        # a write committed after the window opened and before the find: in the stream
        # before the high watermark
        mongo.db.docs.update_one({"_id": oid}, {"$set": {"v": "changed"}})
        snapshot.collection = collection
        return collection(db, coll)

    snapshot.collection = changed_while_the_window_is_open
    events = pump.until(lambda d: not source.snapshot_running() and len(d) >= 2, "the snapshot")
    assert [(e.type, e.item["v"]) for e in events] == [("update", "changed"), ("read", "text")]
    assert events[1].id == f'{BACKEND}:read:0:{mongo.database}.docs:["{oid}"]'


def test_an_objectid_and_its_hex_string_get_two_read_ids(mongo, sources, tmp_path):
    """One id per document: JetStream's dedup would drop the second of two equal ids."""
    oid = ObjectId("65a1b2c3d4e5f60718293a4b")
    mongo.db.docs.insert_many([{"_id": oid, "v": "object id"}, {"_id": str(oid), "v": "text"}])
    source = sources(options_for(mongo, snapshot="initial"))
    pump = Pump(source, tmp_path / "state").open()
    events = pump.until(lambda d: not source.snapshot_running() and len(d) >= 2, "the snapshot")
    head = f"{BACKEND}:read:0:{mongo.database}.docs:"
    assert sorted((e.id, e.item["v"]) for e in events) == [
        (head + f'["{oid}"]', "text"), (head + f'[{{"$oid":"{oid}"}}]', "object id")]
    assert [e.pk for e in events] == [{"_id": str(oid)}] * 2


# -- backfills ----------------------------------------------------------------------------


def streaming(sources, mongo, tmp_path, **options):
    source = sources(options_for(mongo, **options), exclude=["secret"])
    pump = Pump(source, tmp_path / "state").open()
    pump.step()                                   # the first checkpoint: streaming
    return source, pump


def backfill_until_done(source, pump, n, table, where=None):
    assert source.start_backfill(n, table, where) == f"{pump.source.database}.docs"
    assert source.status()["snapshot"]["state"] == "running"
    assert source.status()["snapshot"]["table_rows_estimated"] > 0
    pump.until(lambda d: not source.snapshot_running(), f"backfill {n}", timeout=60,
               max_events=1000)
    assert pump.store.load()["snapshot"]["n"] == n


def to_dicts(events):
    return [{"table": e.table, "type": e.type, "pk": e.pk, "item": e.item} for e in events]


def test_a_backfill_under_a_concurrent_writer_folds_to_the_collection(mongo_process, sources,
                                                                     tmp_path):
    mongo = mongo_process
    fill(mongo, 4000)
    source, pump = streaming(sources, mongo, tmp_path, snapshot_chunk_rows=250)
    writer = Writer(mongo, 4000, seed=3)
    writer.start()
    try:
        # under way before the backfill, so that its changes meet every chunk
        wait_until(lambda: writer.done >= 20 or writer.error, 30, message="the writer")
        backfill_until_done(source, pump, 1, "docs")
    finally:
        writer.stop()
    assert writer.done > 40                  # it really wrote while the chunks were held
    mongo.db.docs.insert_one({"_id": -1})
    events = to_dicts(pump.until(lambda d: any(e.pk == {"_id": -1} for e in d), "sentinel"))
    assert fold(events) == content(mongo)
    reads = [e for e in pump.delivered if e.type == "read"]
    # (the writer may have deleted _id 1 before the backfill read it)
    first = json.dumps([reads[0].pk["_id"]], separators=(",", ":"))
    assert reads[0].id == f"{BACKEND}:read:1:{mongo.database}.docs:{first}"

    # a filtered backfill (n = 2) reads only the matching documents; grp never changes
    where = '{"grp": 1, "n": {"$gte": {"$numberLong": "0"}}}'
    before = len(pump.delivered)
    writer = Writer(mongo, 4000, seed=4)
    writer.start()
    try:
        backfill_until_done(source, pump, 2, f"{mongo.database}.docs", where)
    finally:
        writer.stop()
    second = [e for e in pump.delivered[before:] if e.type == "read"]
    assert second and all(e.item["grp"] == 1 for e in second)
    assert all(e.id.startswith(f"{BACKEND}:read:2:") for e in second)
    mongo.db.docs.insert_one({"_id": -2})
    events = to_dicts(pump.until(lambda d: any(e.pk == {"_id": -2} for e in d), "sentinel"))
    copy = {k: v for k, v in fold(events).items() if v.get("grp") == 1}
    assert copy == content(mongo, where={"grp": 1})


def test_a_run_made_for_one_sink_is_marked_as_its_own_and_ends_with_its_end_event(
        mongo, sources, tmp_path):
    """A websocket client's snapshot=1 on MongoDB (lapidus.sink_runs): its ids carry the
    sink, and its last event says the collection was read to the end."""
    fill(mongo, 1200)
    source, pump = streaming(sources, mongo, tmp_path, snapshot_chunk_rows=250)
    source.start_backfill(3, "docs", None, sink="websocket")
    pump.until(lambda d: not source.snapshot_running(), "the run", timeout=60)
    reads = [e for e in pump.delivered if e.type == "read"]
    head = f"{BACKEND}:read:3@websocket:{mongo.database}.docs:"
    assert len(reads) == 1200 and all(e.id.startswith(head) for e in reads)
    (end,) = [e for e in pump.delivered if e.type == "snapshot"]
    assert end.id == f"{BACKEND}:snapshot:3@websocket" and end.item == {"rows": 1200}
    assert pump.delivered[-1] == end
    assert source.status()["snapshot"]["sink"] == "websocket"


def test_a_cancelled_backfill_stops_and_says_so(mongo, sources, tmp_path):
    fill(mongo, 3000)
    source, pump = streaming(sources, mongo, tmp_path, snapshot_chunk_rows=500)
    source.start_backfill(1, "docs", None)
    pump.until(lambda d: len(d) >= 500, "the first chunk")
    source.cancel_snapshot()
    assert source.status()["snapshot"]["state"] == "cancelled"
    mongo.db.docs.insert_one({"_id": -1})
    pump.until(lambda d: any(e.pk == {"_id": -1} for e in d), "the sentinel")
    assert sum(e.type == "read" for e in pump.delivered) < 3000
    assert pump.store.load()["snapshot"] == {"n": 1, "done": True, "rows": 500,
                                             "cancelled": True}


@pytest.mark.parametrize("table, where, says", [
    ("nothing", None, "cannot backfill nothing: no such collection"),
    ("secret", None, "include_tables / exclude_tables leave it out"),
    ("lapidus_watermarks", None, "snapshot watermark collection"),
    ("docs", "{grp: 1", "not JSON"),
    ("docs", "[1, 2]", "a JSON document (object) is needed"),
    ("docs", '{"$foo": 1}', "the server rejects the filter"),
])
def test_a_backfill_that_cannot_run_is_refused_clearly(mongo, sources, tmp_path, table, where,
                                                        says):
    fill(mongo, 10)
    mongo.db.secret.insert_one({"_id": 1})
    mongo.db.lapidus_watermarks.insert_one({"_id": "x"})
    source, pump = streaming(sources, mongo, tmp_path)
    with pytest.raises(SnapshotRefused) as refused:
        source.start_backfill(1, table, where)
    assert says in str(refused.value) and f'backend "{BACKEND}"' in str(refused.value)
    assert source.snapshot_progress is None
    mongo.db.docs.insert_one({"_id": -1})     # the backend streams on
    assert [e.type for e in pump.until(lambda d: d, "the insert")] == ["insert"]


def test_a_second_backfill_while_one_runs_is_refused(mongo, sources, tmp_path):
    fill(mongo, 1000)
    source, _ = streaming(sources, mongo, tmp_path, snapshot_chunk_rows=100)
    source.start_backfill(1, "docs", None)
    with pytest.raises(SnapshotRefused, match="snapshot run 1 is still in progress"):
        source.start_backfill(2, "docs", None)


def test_switched_on_after_the_first_start_it_does_nothing(mongo, sources, tmp_path):
    fill(mongo, 10)
    first = Pump(sources(options_for(mongo)), tmp_path / "state").open()
    first.step()                                  # a checkpoint without a snapshot
    first.source.close()
    source = sources(options_for(mongo, snapshot="initial"))
    pump = Pump(source, tmp_path / "state").open()
    assert source.snapshot_progress is None and "snapshot" not in source.status()
    mongo.db.docs.insert_one({"_id": 11})
    assert [e.type for e in pump.until(lambda d: d, "the insert")] == ["insert"]


def test_a_chunk_past_its_timeout_fails_the_backend_clearly(mongo, sources):
    fill(mongo, 5000)                 # scanning them takes far longer than 1 ms
    source = sources(options_for(mongo, snapshot="initial", snapshot_chunk_timeout=0.001))
    source.open(None)
    with pytest.raises(BackendError) as failed:
        source.read(100, 0.2)
    message = str(failed.value)
    assert failed.value.fatal and f"{mongo.database}.docs" in message
    assert "snapshot_chunk_timeout (0.001 s)" in message and "snapshot_chunk_rows" in message


def test_lapidusctl_backfill_with_a_json_filter_and_its_refusals(mongo_process, lapidus_factory):
    mongo = mongo_process
    fill(mongo, 300)
    proc = lapidus_factory({"backends": [backend(mongo, snapshot="never")],
                            "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"', 60)
    from tests.integration.conftest import ctl
    code, out, err = ctl(proc.config_path, "backfill", BACKEND, "docs", "--where",
                         '{"grp": 1}', "--wait")
    assert code == 0, err + proc.log()[-2000:]
    assert "backfill 1 of cms docs done: 100 rows" in out
    reads = [e for e in proc.events() if e["type"] == "read"]
    assert sorted(e["pk"]["_id"] for e in reads) == list(range(1, 301, 3))
    assert all(e["id"].startswith("cms:read:1:") for e in reads)
    code, _, err = ctl(proc.config_path, "backfill", BACKEND, "docs", "--where", "{grp: 1")
    assert code == 2 and "docs" in err
    code, _, err = ctl(proc.config_path, "backfill", BACKEND, "nosuch")
    assert code == 2 and "nosuch" in err
