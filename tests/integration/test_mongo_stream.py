"""MongoSource against a MongoDB-wire server: events, resume, invalidate, no loss across restarts.

The source is driven directly (open / read / commit, as the worker loop does); see
mongo_fixtures.py for the server (SecantusDB in-process, or ``LAPIDUS_TEST_MONGO_URI``).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import threading
import time
import uuid

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from lapidus.workers.mongo.source import FIRST_START_FILE
from tests.integration.mongo_fixtures import (Pump, mongo, options_for, sources,  # noqa: F401
                                              stable)

DOC_ID = ObjectId("65a5b2c3d4e5f60718293a4b")


def opened(sources, mongo, tmp_path, state="state", **options) -> Pump:
    include = options.pop("include", ())
    exclude = options.pop("exclude", ())
    source = sources(options_for(mongo, **options), state=state, include=include,
                     exclude=exclude)
    return Pump(source, tmp_path / state).open()


def test_insert_update_replace_delete_drop(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    items = mongo.db.items
    db = mongo.database
    # One change at a time: updateLookup reads the document when the change is read, so
    # reading after each write makes every "item" deterministic.
    items.insert_one({"_id": 1, "name": "lamp", "price": Decimal128("19.90")})
    pump.until_count(1)
    items.update_one({"_id": 1}, {"$set": {"price": Decimal128("17.50")}, "$unset": {"name": ""}})
    pump.until_count(2)
    items.replace_one({"_id": 1}, {"sku": "A-2"})
    pump.until_count(3)
    items.delete_one({"_id": 1})
    pump.until_count(4)
    items.drop()
    events = pump.until_count(5)

    common = {"backend": "cms", "schema": db, "table": "items", "txid": None}
    assert [stable(e) for e in events] == [
        dict(common, type="insert", pk={"_id": 1},
             item={"_id": 1, "name": "lamp", "price": "19.90"}, before=None),
        dict(common, type="update", pk={"_id": 1}, item={"_id": 1, "price": "17.50"},
             before={"_id": 1}, update={"set": {"price": "17.50"}, "unset": ["name"]}),
        dict(common, type="replace", pk={"_id": 1}, item={"_id": 1, "sku": "A-2"},
             before={"_id": 1}),
        dict(common, type="delete", pk={"_id": 1}, item=None, before={"_id": 1}),
        dict(common, type="schema", pk=None, item={"operation": "drop"}, before=None),
    ]
    assert len({e.id for e in events}) == 5
    now = dt.datetime.now(dt.timezone.utc)
    for event in events:
        ts = dt.datetime.fromisoformat(event.ts.replace("Z", "+00:00"))
        assert abs((now - ts).total_seconds()) < 120


def test_bson_values_arrive_as_documented(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    value = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")
    mongo.db.values.insert_one({
        "_id": DOC_ID, "i32": 7, "i64": Int64(2**62 + 1), "dbl": 2.5, "nan": math.nan,
        "inf": -math.inf, "dec": Decimal128("12345678901234567890.000000001"),
        "when": dt.datetime(2026, 11, 30, 11, 33, 35, 295000), "bin": b"\x00\xff",
        "uuid": Binary.from_uuid(value), "ts": Timestamp(1796041809, 7),
        "nested": {"list": [1, {"d": Decimal128("1.50")}], "none": None, "ok": True},
    })
    [event] = pump.until_count(1)
    assert stable(event)["item"] == {
        "_id": "65a5b2c3d4e5f60718293a4b", "i32": 7, "i64": 2**62 + 1, "dbl": 2.5,
        "nan": "NaN", "inf": "-Infinity", "dec": "12345678901234567890.000000001",
        "when": "2026-11-30T11:33:35.295Z", "bin": "AP8=",
        "uuid": "0f8fad5b-d9cb-469f-a165-70867728950e",
        "ts": {"$timestamp": {"t": 1796041809, "i": 7}},
        "nested": {"list": [1, {"d": "1.50"}], "none": None, "ok": True},
    }
    assert event.pk == {"_id": "65a5b2c3d4e5f60718293a4b"}


def test_a_transaction_shares_one_txid(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    mongo.db.lines.insert_one({"_id": 0})          # collections cannot be created in a txn
    with mongo.client.start_session() as session:
        with session.start_transaction():
            mongo.db.lines.insert_one({"_id": 1}, session=session)
            mongo.db.lines.insert_one({"_id": 2}, session=session)
            mongo.db.lines.update_one({"_id": 0}, {"$set": {"n": 2}}, session=session)
    events = pump.until_count(4)
    plain, *txn = events
    assert plain.txid is None
    assert [e.type for e in txn] == ["insert", "insert", "update"]
    assert re.match(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}:\d+$",
                    txn[0].txid), txn[0].txid
    assert {e.txid for e in txn} == {txn[0].txid}
    assert len({e.id for e in events}) == 4


def test_resume_after_close_loses_nothing_and_repeats_nothing(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    mongo.db.items.insert_many([{"_id": n} for n in (1, 2, 3)])
    pump.until_count(3)
    pump.source.close()

    # Written while no source is running.
    mongo.db.items.insert_many([{"_id": n} for n in (4, 5, 6)])
    mongo.db.items.update_one({"_id": 1}, {"$set": {"late": True}})

    second = Pump(sources(options_for(mongo)), tmp_path / "state").open()
    events = second.until_count(4)
    assert [(e.type, e.pk["_id"]) for e in events] == \
        [("insert", 4), ("insert", 5), ("insert", 6), ("update", 1)]
    assert second.quiet() == []


def test_restart_before_the_first_checkpoint_keeps_the_first_start_position(
        mongo, sources, tmp_path):
    first = sources(options_for(mongo))
    first.open(None)                   # worker started, then died before saving anything
    first.close()
    assert (tmp_path / "state" / FIRST_START_FILE).exists()

    mongo.db.items.insert_one({"_id": "while-down"})

    pump = Pump(sources(options_for(mongo)), tmp_path / "state").open()
    assert [e.pk for e in pump.until_count(1)] == [{"_id": "while-down"}]
    assert not (tmp_path / "state" / FIRST_START_FILE).exists()


def test_20k_writes_with_a_crash_in_the_middle_lose_nothing(mongo, sources, tmp_path):
    """20,000 inserts: 12,000 while the reader runs, 4,000 while it is down after a crash (an
    undelivered batch is dropped, the source closed), 4,000 after it restarted from the saved
    checkpoint.  Every change arrives exactly once, in commit order."""
    total, chunk = 20_000, 250
    phases = [(0, 12_000), (12_000, 16_000), (16_000, total)]
    reader_down, written_while_down = threading.Event(), threading.Event()
    writer_error = []

    def write(start, stop):
        for first in range(start, stop, chunk):
            mongo.client[mongo.database].bulk.insert_many(
                [{"_id": n, "v": n} for n in range(first, first + chunk)])

    def writer_main():
        try:
            write(*phases[0])
            if not reader_down.wait(120):
                raise TimeoutError("the reader never went down")
            write(*phases[1])
            written_while_down.set()
            write(*phases[2])
        except Exception as exc:                     # reported by the main thread
            writer_error.append(exc)
            written_while_down.set()

    pump = opened(sources, mongo, tmp_path)
    writer = threading.Thread(target=writer_main, name="writer")
    writer.start()
    try:
        delivered = pump.until(lambda d: len(d) >= 10_000, "10000 events", timeout=120)
        lost = pump.source.read(1000, 10.0)          # read but never delivered: the crash
        pump.source.close()
        assert lost.events, "the crash should drop an undelivered batch"
        reader_down.set()
        assert written_while_down.wait(120), "the writer never wrote while the reader was down"

        pump = Pump(sources(options_for(mongo)), tmp_path / "state").open()
        pump.delivered = delivered                   # the consumers' view goes on
        pump.until(lambda d: len(d) >= total, f"{total} events", timeout=180)
    finally:
        reader_down.set()
        writer.join(120)
    assert not writer_error, writer_error
    ids = [e.pk["_id"] for e in pump.delivered]
    assert len(ids) == total and len(set(ids)) == total
    assert ids == list(range(total))
    assert pump.quiet() == []


def test_invalidate_then_follow_the_recreated_database(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    mongo.db.items.insert_one({"_id": 1})
    mongo.client.drop_database(mongo.database)
    events = pump.until(lambda d: any(e.item == {"operation": "invalidate"} for e in d),
                        "the invalidate event")
    assert [(e.type, e.table, e.item and e.item.get("operation")) for e in events][-2:] == \
        [("schema", None, "dropDatabase"), ("schema", None, "invalidate")]
    saved = pump.store.load()
    assert saved["start_after"] is True and saved["position"] == events[-1].position
    pump.source.close()

    # Restart on the invalidate checkpoint (resumeAfter would be refused), database recreated.
    mongo.db.items.insert_one({"_id": 2})
    second = Pump(sources(options_for(mongo)), tmp_path / "state").open()
    assert [(e.type, e.pk) for e in second.until_count(1)] == [("insert", {"_id": 2})]
    assert second.store.load()["start_after"] is False


def test_invalidate_without_restart_follows_on(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    mongo.db.items.insert_one({"_id": 1})
    mongo.client.drop_database(mongo.database)
    pump.until(lambda d: any(e.item == {"operation": "invalidate"} for e in d), "invalidate")
    mongo.db.items.insert_one({"_id": 2})
    events = pump.until(lambda d: d[-1].type == "insert" and d[-1].pk == {"_id": 2},
                        "the insert after the invalidate")
    assert events[-1].schema == mongo.database


def test_rename(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    mongo.db.items.insert_one({"_id": 1})
    mongo.db.items.rename("items_2026")
    events = pump.until_count(2)
    assert stable(events[1]) == {
        "type": "schema", "backend": "cms", "schema": mongo.database, "table": "items",
        "pk": None, "item": {"operation": "rename",
                             "to": {"schema": mongo.database, "table": "items_2026"}},
        "before": None, "txid": None}


def test_filters_are_applied_and_skipped_changes_move_the_checkpoint(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path, exclude=["sessions", "audit_*"])
    pump.step()                                   # the initial checkpoint is saved
    first = pump.store.load()["position"]
    mongo.db.sessions.insert_many([{"n": n} for n in range(50)])
    mongo.db.audit_2026.insert_one({"n": 1})
    # Nothing to deliver, but the saved position moves past the excluded changes.
    pump.until(lambda d: pump.store.load()["position"] != first, "the checkpoint to move")
    assert pump.delivered == []

    mongo.db.items.insert_one({"_id": 1})
    mongo.db.audit_2026.insert_one({"n": 2})
    mongo.db.audits.insert_one({"_id": 2})
    events = pump.until_count(2)
    assert [(e.table, e.pk) for e in events] == [("items", {"_id": 1}), ("audits", {"_id": 2})]
    assert pump.quiet() == []


def test_include_filter(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path, include=[f"{mongo.database}.orders*"])
    mongo.db.items.insert_one({"_id": 1})
    mongo.db.orders_eu.insert_one({"_id": 2})
    assert [(e.table, e.pk) for e in pump.until_count(1)] == [("orders_eu", {"_id": 2})]


def test_whole_deployment(mongo, sources, tmp_path):
    first, second = mongo.other_database("a"), mongo.other_database("b")
    pump = opened(sources, mongo, tmp_path, database=None)
    mongo.client[first].x.insert_one({"_id": 1})
    mongo.client[second].y.insert_one({"_id": 2})
    events = pump.until(lambda d: {e.schema for e in d} >= {first, second}, "both databases")
    ours = [(e.schema, e.table) for e in events if e.schema in (first, second)]
    assert ours == [(first, "x"), (second, "y")]


def test_pre_images_fill_before(mongo, sources, tmp_path):
    mongo.require_version(6, "changeStreamPreAndPostImages")
    mongo.db.create_collection("stock")
    mongo.db.command("collMod", "stock", changeStreamPreAndPostImages={"enabled": True})
    pump = opened(sources, mongo, tmp_path, full_document_before_change="whenAvailable")
    stock = mongo.db.stock
    stock.insert_one({"_id": 7, "qty": 5})
    pump.until_count(1)
    stock.update_one({"_id": 7}, {"$inc": {"qty": -3}})
    pump.until_count(2)
    stock.replace_one({"_id": 7}, {"sku": "A-2"})
    pump.until_count(3)
    stock.delete_one({"_id": 7})
    events = pump.until_count(4)
    assert [(e.type, e.before, e.item) for e in events] == [
        ("insert", None, {"_id": 7, "qty": 5}),
        ("update", {"_id": 7, "qty": 5}, {"_id": 7, "qty": 2}),
        ("replace", {"_id": 7, "qty": 2}, {"_id": 7, "sku": "A-2"}),
        ("delete", {"_id": 7, "sku": "A-2"}, None),
    ]


def test_stored_post_images_are_the_document_right_after_the_update(mongo, sources, tmp_path):
    mongo.require("stored_post_images")
    mongo.require_version(6, "changeStreamPreAndPostImages")
    mongo.db.create_collection("stock")
    mongo.db.command("collMod", "stock", changeStreamPreAndPostImages={"enabled": True})
    pump = opened(sources, mongo, tmp_path, full_document="whenAvailable")
    mongo.db.stock.insert_one({"_id": 7, "qty": 5})
    mongo.db.stock.update_one({"_id": 7}, {"$set": {"qty": 2}})
    mongo.db.stock.update_one({"_id": 7}, {"$set": {"qty": 1}})
    events = pump.until_count(3)
    assert [e.item for e in events] == [{"_id": 7, "qty": 5}, {"_id": 7, "qty": 2},
                                       {"_id": 7, "qty": 1}]


def test_truncated_arrays(mongo, sources, tmp_path):
    mongo.require("truncated_arrays")
    mongo.db.items.insert_one({"_id": 1, "history": [1, 2, 3, 4]})
    pump = opened(sources, mongo, tmp_path)
    mongo.db.items.update_one({"_id": 1}, {"$pop": {"history": 1}})
    [event] = pump.until_count(1)
    assert event.update == {"set": {}, "unset": [], "truncated": {"history": 3}}


def test_read_returns_as_soon_as_a_change_arrives(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    pump.step()                                          # initial checkpoint out of the way
    writer = threading.Thread(target=lambda: mongo.db.items.insert_one({"_id": 1}))
    started = time.monotonic()
    writer.start()
    batch = pump.source.read(1000, 20.0)
    while not batch.events:                              # the insert may land after a getMore
        assert time.monotonic() - started < 10
        batch = pump.source.read(1000, 20.0)
    writer.join()
    assert time.monotonic() - started < 10               # far below the 20 s timeout


def test_an_empty_read_ends_after_its_timeout(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    pump.step()
    started = time.monotonic()
    batch = pump.source.read(1000, 0.3)
    elapsed = time.monotonic() - started
    assert batch.events == []
    assert 0.3 <= elapsed < 2.0


def test_one_server_reply_becomes_one_batch(mongo, sources, tmp_path):
    pump = opened(sources, mongo, tmp_path)
    pump.step()
    mongo.db.items.insert_many([{"_id": n} for n in range(50)])
    pump.until_count(50)
    assert max(len(b.events) for b in pump.batches) > 1     # not one change per read
    assert sum(len(b.events) for b in pump.batches) == 50


def test_connecting_with_host_and_port(mongo, sources, tmp_path):
    if mongo.external:
        options = options_for(mongo)                        # a real deployment: as given
    else:
        options = {"host": mongo.host, "port": mongo.port, "database": mongo.database}
    pump = Pump(sources(options), tmp_path / "state").open()
    mongo.db.items.insert_one({"_id": 1})
    assert [e.pk for e in pump.until_count(1)] == [{"_id": 1}]
