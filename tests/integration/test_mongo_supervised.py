"""MongoDB through the real supervisor, worker and dispatcher into stdout."""

from __future__ import annotations

import os
import signal
import threading

from tests.conftest import wait_until
from tests.integration.mongo_fixtures import POSITION, TIMESTAMP, mongo  # noqa: F401 (fixture)


def mongo_backend(target, **options) -> dict:
    backend = {"name": "cms", "type": "mongo", "uri": target.uri, "database": target.database}
    backend.update(options)
    return backend


def without_source_fields(event: dict) -> dict:
    assert POSITION.match(event["position"]), event
    assert TIMESTAMP.match(event["ts"]), event
    assert event["id"] == f'cms:{event["position"]}:0'
    return {k: v for k, v in event.items() if k not in ("id", "position", "ts")}


def test_insert_update_replace_delete_drop_through_the_supervisor(lapidus_factory, mongo):
    items = mongo.db.items
    items.insert_one({"_id": 0, "warm": "up"})   # the collection exists before streaming
    proc = lapidus_factory({"backends": [mongo_backend(mongo)], "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"')
    # One change at a time: updateLookup reads the document when the change is read, so a
    # delete that came first would leave the update's item empty (as on a real mongod).
    items.insert_one({"_id": 1, "name": "lamp", "price": 19})
    proc.wait_events(1)
    items.update_one({"_id": 1}, {"$set": {"price": 17}, "$unset": {"name": ""}})
    proc.wait_events(2)
    items.replace_one({"_id": 1}, {"sku": "A-2"})
    proc.wait_events(3)
    items.delete_one({"_id": 1})
    items.drop()
    events = proc.wait_events(5)
    common = {"backend": "cms", "schema": mongo.database, "table": "items", "txid": None}
    assert [without_source_fields(e) for e in events] == [
        dict(common, type="insert", pk={"_id": 1}, item={"_id": 1, "name": "lamp", "price": 19},
             before=None),
        dict(common, type="update", pk={"_id": 1}, item={"_id": 1, "price": 17},
             before={"_id": 1}, update={"set": {"price": 17}, "unset": ["name"]}),
        dict(common, type="replace", pk={"_id": 1}, item={"_id": 1, "sku": "A-2"},
             before={"_id": 1}),
        dict(common, type="delete", pk={"_id": 1}, item=None, before={"_id": 1}),
        dict(common, type="schema", pk=None, item={"operation": "drop"}, before=None),
    ]


def test_kill_worker_in_the_middle_of_20k_writes_loses_nothing(lapidus_factory, mongo):
    total = 20_000
    proc = lapidus_factory({"backends": [mongo_backend(mongo)], "plugins": {"stdout": {}},
                            "supervisor": {"backoff_initial": 0.1}})
    proc.wait_log('"streaming"')

    def write():
        docs = mongo.db.docs
        for start in range(0, total, 100):
            docs.insert_many([{"_id": i, "n": i} for i in range(start, start + 100)])

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    wait_until(lambda: len(proc.events()) > 3_000, 120, message="3k events before the kill")
    os.kill(proc.worker_pid("cms"), signal.SIGKILL)
    writer.join(300)
    assert not writer.is_alive()

    def complete():
        ids = {e["pk"]["_id"] for e in proc.events() if e["type"] == "insert"}
        return ids if len(ids) >= total else None

    ids = wait_until(complete, 180, interval=0.5, message=f"all {total} inserts")
    assert ids == set(range(total))
    # a change seen twice is the same event (same id, same content)
    by_id = {}
    for event in proc.events():
        assert by_id.setdefault(event["id"], event) == event
    assert proc.log().count('"streaming"') >= 2   # the worker really was restarted
