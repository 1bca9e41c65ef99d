"""MongoSource's read loop, checkpoints and error policies, against a scripted fake driver.

The fake reproduces the parts of pymongo's ChangeStream the source relies on: server batches,
the cached resume token (the change's ``_id``, or the batch's ``postBatchResumeToken`` once the
batch is used up), one getMore per ``try_next`` on an empty buffer, and the stream closing
itself after an ``invalidate``.  The integration tests run the same paths on a real server.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from bson.timestamp import Timestamp
from pymongo.errors import AutoReconnect, OperationFailure

from lapidus.config import BackendConfig
from lapidus.workers.base import BackendError
from lapidus.workers.mongo.source import FIRST_START_FILE, MongoSource, _has_buffered

HISTORY_LOST = OperationFailure(
    "Resume of change stream was not possible, as the resume point may no longer be in the "
    "oplog.", 286, {"ok": 0, "code": 286, "codeName": "ChangeStreamHistoryLost",
                    "errmsg": "Resume of change stream was not possible, as the resume point "
                              "may no longer be in the oplog."})


def tok(name: str) -> dict:
    return {"_data": name}


def change(name: str, coll: str = "items", op: str = "insert", _id: int = 1) -> dict:
    doc = {"_id": tok(name), "operationType": op, "clusterTime": Timestamp(1705357987, 1)}
    if op != "invalidate":
        doc.update(ns={"db": "shop", "coll": coll}, documentKey={"_id": _id},
                   fullDocument={"_id": _id})
    return doc


class FakeStream:
    """``script``: a list of server replies, each ``(changes, postBatchResumeToken)`` or an
    exception to raise from that getMore.  When the script is used up, getMores come back
    empty (after ``await_s``, like maxAwaitTimeMS)."""

    def __init__(self, script=(), initial="T0", await_s=0.0):
        self.script = list(script)
        self.buffer = []
        self.pbrt = tok(initial)
        self.resume_token = tok(initial)
        self._closed = False
        self._cursor = self
        self.getmores = 0
        self.await_s = await_s

    @property
    def alive(self):
        return not self._closed

    def _has_next(self):
        return bool(self.buffer)

    def try_next(self):
        if not self.buffer:
            self.getmores += 1
            if self.script:
                reply = self.script.pop(0)
                if isinstance(reply, BaseException):
                    raise reply
                changes, pbrt = reply
                self.buffer = list(changes)
                if pbrt:
                    self.pbrt = tok(pbrt)
            else:
                time.sleep(self.await_s)
            if not self.buffer:
                self.resume_token = self.pbrt
                return None
        doc = self.buffer.pop(0)
        self.resume_token = doc["_id"] if self.buffer else self.pbrt
        if doc["operationType"] == "invalidate":
            self._closed = True
        return doc

    def close(self):
        self._closed = True


class FakeClient:
    """Hands out the given streams (or raises the given exceptions) one per ``watch()``."""

    def __init__(self, *streams, hello=None):
        self.streams = list(streams)
        self.watches = []
        self.hello = {"setName": "rs0", "maxWireVersion": 21} if hello is None else hello
        self.admin = SimpleNamespace(command=lambda name: self.hello)
        self.closed = False
        self.database = None

    def __getitem__(self, name):
        self.database = name
        return self

    def watch(self, **kwargs):
        self.watches.append(kwargs)
        item = self.streams.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self):
        self.closed = True


class Log:
    def __init__(self):
        self.lines = []

    def __getattr__(self, level):
        return lambda message, **fields: self.lines.append((level, message, fields))


def make_source(client, tmp_path, include=(), exclude=(), **options):
    options.setdefault("database", "shop")
    backend = BackendConfig(name="cms", type="mongo", options=options,
                            include_tables=tuple(include), exclude_tables=tuple(exclude))
    return MongoSource(backend, tmp_path, Log(), client_factory=lambda settings: client)


def positions(batch):
    return [e.position for e in batch.events]


def test_first_read_hands_out_the_initial_token(tmp_path):
    source = make_source(FakeClient(FakeStream(initial="T0")), tmp_path)
    source.open(None)
    batch = source.read(10, 0)
    assert batch.events == []
    assert batch.checkpoint == {"position": "T0", "resume_token": tok("T0"),
                                "start_after": False}
    assert source.read(10, 0).checkpoint is None        # nothing moved: nothing to save


def test_first_start_position_is_kept_until_a_checkpoint_is_saved(tmp_path):
    """A restart before the first checkpoint must not start from a new "now"."""
    client = FakeClient(FakeStream(initial="T0"))
    source = make_source(client, tmp_path)
    source.open(None)
    assert (tmp_path / FIRST_START_FILE).exists()
    assert "resume_after" not in client.watches[0]
    source.close()                                     # crash before anything was saved

    client = FakeClient(FakeStream(initial="T5"))
    source = make_source(client, tmp_path)
    source.open(None)
    assert client.watches[0]["resume_after"] == tok("T0")
    batch = source.read(10, 0)
    assert batch.checkpoint is not None                # handed out although nothing changed
    source.commit(batch.checkpoint)                    # the worker saved it
    assert not (tmp_path / FIRST_START_FILE).exists()


def test_a_stale_first_start_file_is_ignored_when_a_checkpoint_exists(tmp_path):
    (tmp_path / FIRST_START_FILE).write_text('{"position": {"_data": "OLD"}}')
    client = FakeClient(FakeStream())
    source = make_source(client, tmp_path)
    source.open({"resume_token": tok("T9"), "start_after": False})
    assert client.watches[0]["resume_after"] == tok("T9")
    assert not (tmp_path / FIRST_START_FILE).exists()


def test_read_returns_once_it_has_events_without_another_getmore(tmp_path):
    stream = FakeStream([([change("A"), change("B")], "P1")], await_s=5)
    source = make_source(FakeClient(stream), tmp_path)
    source.open({"resume_token": tok("T0")})
    started = time.monotonic()
    batch = source.read(100, 30)
    assert time.monotonic() - started < 2
    assert positions(batch) == ["A", "B"]
    assert stream.getmores == 1
    # The batch used up the server's reply: the post-batch token is past everything read.
    assert batch.checkpoint["resume_token"] == tok("P1")


def test_max_events_splits_a_server_batch_at_exact_tokens(tmp_path):
    stream = FakeStream([([change("A"), change("B"), change("C")], "P1")])
    source = make_source(FakeClient(stream), tmp_path)
    source.open({"resume_token": tok("T0")})
    first = source.read(2, 1)
    assert positions(first) == ["A", "B"]
    assert first.checkpoint["resume_token"] == tok("B")
    second = source.read(2, 1)
    assert positions(second) == ["C"]
    assert second.checkpoint["resume_token"] == tok("P1")


def test_an_empty_read_waits_for_its_timeout_and_moves_the_checkpoint_only_when_it_moved(
        tmp_path):
    stream = FakeStream([([], None), ([], "P2")], await_s=0.01)
    source = make_source(FakeClient(stream), tmp_path)
    source.open({"resume_token": tok("T0")})
    started = time.monotonic()
    batch = source.read(10, 0.05)
    assert time.monotonic() - started >= 0.05
    assert batch.events == [] and batch.checkpoint["resume_token"] == tok("P2")
    assert source.read(10, 0.02).checkpoint is None


def test_changes_the_filter_drops_still_move_the_checkpoint(tmp_path):
    stream = FakeStream([([change("A", coll="sessions"), change("B", coll="sessions")], "P1")])
    source = make_source(FakeClient(stream), tmp_path, exclude=["sessions"])
    source.open({"resume_token": tok("T0")})
    batch = source.read(10, 0.05)
    assert batch.events == []
    assert batch.checkpoint["resume_token"] == tok("P1")


def test_invalidate_is_delivered_then_the_stream_reopens_with_start_after(tmp_path):
    first = FakeStream([([change("A"), change("I", op="invalidate")], "PI")])
    second = FakeStream([([], "Q1"), ([change("C")], "Q2")], initial="Q0")
    client = FakeClient(first, second)
    source = make_source(client, tmp_path)
    source.open({"resume_token": tok("T0")})

    batch = source.read(100, 1)
    assert [e.type for e in batch.events] == ["insert", "schema"]
    assert batch.events[1].item == {"operation": "invalidate"}
    assert batch.checkpoint == {"position": "I", "resume_token": tok("I"), "start_after": True}

    batch = source.read(100, 0)
    assert client.watches[1]["start_after"] == tok("I")
    assert "resume_after" not in client.watches[1]
    # No change seen yet on the new stream: a restart must still use startAfter.
    assert batch.checkpoint == {"position": "Q1", "resume_token": tok("Q1"), "start_after": True}

    batch = source.read(100, 1)
    assert positions(batch) == ["C"]
    assert batch.checkpoint["start_after"] is False


def test_a_start_after_checkpoint_reopens_with_start_after(tmp_path):
    client = FakeClient(FakeStream())
    source = make_source(client, tmp_path)
    source.open({"resume_token": tok("I"), "start_after": True})
    assert client.watches[0]["start_after"] == tok("I")


def test_history_lost_at_open_fails_by_default(tmp_path):
    source = make_source(FakeClient(HISTORY_LOST), tmp_path)
    with pytest.raises(BackendError) as info:
        source.open({"resume_token": tok("OLD")})
    assert info.value.fatal
    assert "OLD" in str(info.value) and "history_lost" in str(info.value)


def test_history_lost_at_open_with_restart_from_now_delivers_a_gap_first(tmp_path):
    client = FakeClient(HISTORY_LOST, FakeStream([([change("N1")], "P1")], initial="NOW"))
    source = make_source(client, tmp_path, history_lost="restart_from_now")
    source.open({"resume_token": tok("OLD")})
    assert "resume_after" not in client.watches[1] and "start_after" not in client.watches[1]

    gap = source.read(100, 1)
    assert len(gap.events) == 1
    event = gap.events[0]
    assert (event.type, event.id, event.position, event.schema) == \
        ("gap", "cms:NOW:0", "NOW", "shop")
    assert event.item["reason"] == "history_lost"
    assert (event.item["lost_after"], event.item["resumed_at"]) == ("OLD", "NOW")
    assert gap.checkpoint["resume_token"] == tok("NOW")

    assert positions(source.read(100, 1)) == ["N1"]


def test_history_lost_while_reading_applies_the_policy(tmp_path):
    failing = FakeStream([([change("A")], "P1"), HISTORY_LOST])
    client = FakeClient(failing, FakeStream(initial="NOW"))
    source = make_source(client, tmp_path, history_lost="restart_from_now")
    source.open({"resume_token": tok("T0")})
    assert positions(source.read(100, 1)) == ["A"]
    gap = source.read(100, 1)
    assert [e.type for e in gap.events] == ["gap"]
    assert gap.events[0].item["lost_after"] == "P1"

    client = FakeClient(FakeStream([HISTORY_LOST]))
    source = make_source(client, tmp_path / "other")
    source.open({"resume_token": tok("T0")})
    with pytest.raises(BackendError) as info:
        source.read(100, 1)
    assert info.value.fatal and "history_lost" in str(info.value)


def test_connection_loss_while_reading_is_transient(tmp_path):
    stream = FakeStream([AutoReconnect("db1:27017: connection closed")])
    source = make_source(FakeClient(stream), tmp_path, host="db1")
    source.open({"resume_token": tok("T0")})
    with pytest.raises(BackendError) as info:
        source.read(10, 1)
    assert not info.value.fatal and "db1:27017" in str(info.value)


@pytest.mark.parametrize("hello", [{}, {"ismaster": True, "maxWireVersion": 21}])
def test_a_standalone_server_is_refused_with_the_fix(tmp_path, hello):
    source = make_source(FakeClient(FakeStream(), hello=hello), tmp_path)
    with pytest.raises(BackendError) as info:
        source.open(None)
    assert info.value.fatal
    assert "rs.initiate()" in str(info.value) and "--replSet" in str(info.value)


def test_mongos_is_accepted(tmp_path):
    source = make_source(FakeClient(FakeStream(), hello={"msg": "isdbgrid",
                                                         "maxWireVersion": 21}), tmp_path)
    source.open(None)


def test_pre_images_need_mongodb_6(tmp_path):
    client = FakeClient(FakeStream(), hello={"setName": "rs0", "maxWireVersion": 13})
    source = make_source(client, tmp_path, full_document_before_change="whenAvailable")
    with pytest.raises(BackendError) as info:
        source.open(None)
    assert info.value.fatal and "full_document_before_change" in str(info.value)


def test_invalid_options_are_reported_by_open_not_by_the_constructor(tmp_path):
    source = make_source(FakeClient(FakeStream()), tmp_path, history_lost="ignore")
    with pytest.raises(BackendError) as info:
        source.open(None)
    assert info.value.fatal and "history_lost is 'ignore'" in str(info.value)


def test_a_foreign_checkpoint_is_a_fatal_error(tmp_path):
    source = make_source(FakeClient(FakeStream()), tmp_path)
    with pytest.raises(BackendError) as info:
        source.open({"last_lsn": 12345})
    assert info.value.fatal and "checkpoint" in str(info.value)


def test_watch_arguments(tmp_path):
    client = FakeClient(FakeStream())
    source = make_source(client, tmp_path, exclude=["sessions"], batch_size=500,
                         full_document="whenAvailable",
                         full_document_before_change="required")
    source.open(None)
    kwargs = client.watches[0]
    assert client.database == "shop"
    assert kwargs["full_document"] == "whenAvailable"
    assert kwargs["full_document_before_change"] == "required"
    assert kwargs["batch_size"] == 500
    assert kwargs["pipeline"][0]["$match"]["$or"][1] == \
        {"$nor": [{"ns.coll": {"$regex": "^sessions$(?!\\n)"}}]}


def test_before_change_off_is_not_sent_and_no_database_watches_the_deployment(tmp_path):
    client = FakeClient(FakeStream())
    source = make_source(client, tmp_path, database=None)
    source.open(None)
    assert client.database is None
    assert "full_document_before_change" not in client.watches[0]
    assert client.watches[0]["pipeline"] == []


def test_close_is_idempotent_and_closes_the_client(tmp_path):
    client = FakeClient(FakeStream())
    source = make_source(client, tmp_path)
    source.open(None)
    source.close()
    source.close()
    assert client.closed
    with pytest.raises(BackendError):
        source.read(1, 0)


def test_status_reports_the_position(tmp_path):
    source = make_source(FakeClient(FakeStream([([change("A")], "P1")])), tmp_path)
    source.open(None)
    source.read(10, 1)
    assert source.status() == {"database": "shop", "read_position": "P1",
                               "last_change_ts": "2024-01-15T22:33:07.000Z"}


def test_the_private_driver_hook_for_buffered_changes_still_exists():
    """``_has_buffered`` relies on ``ChangeStream._cursor._has_next()`` (what pymongo itself uses
    to cache the post-batch token).  If a pymongo upgrade removes it, batching degrades to one
    change per read: this test says so first."""
    from pymongo.command_cursor import CommandCursor

    assert callable(getattr(CommandCursor, "_has_next", None))
    assert _has_buffered(SimpleNamespace(_cursor=SimpleNamespace(_has_next=lambda: True)))
    assert not _has_buffered(SimpleNamespace())
