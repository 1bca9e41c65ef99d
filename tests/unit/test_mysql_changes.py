"""Unit tests: transactions, row indexes, resume skipping and checkpoints of ChangeStream,
plus the stream connection's idle/dead-link detection.  Library events are built without a
server (their classes, with the attributes the stream reads)."""

from __future__ import annotations

import os
import socket
import threading
import time
from types import SimpleNamespace

import pymysql
import pytest
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent
from pymysqlreplication.row_event import TableMapEvent

from lapidus.workers.mysql.changes import ChangeStream
from lapidus.workers.mysql.connection import Idle, LinkDead, WatchedConnection, _StreamBuffer
from lapidus.workers.mysql.position import Checkpoint
from lapidus.workers.mysql.reader import ExactDeleteRows, ExactUpdateRows, ExactWriteRows
from lapidus.workers.mysql.scope import Scope

T0 = 1796041951          # 2026-11-30T...Z


def make(cls, **attrs):
    event = object.__new__(cls)
    event.__dict__.update(attrs)
    return event


def gtid(seq, standalone=False):
    return make(MariadbGtidEvent, gtid=f"0-1-{seq}", flags=1 if standalone else 12,
                timestamp=T0)


def table_map(table="items", table_id=7, schema="crm"):
    columns = [SimpleNamespace(type=FIELD_TYPE.LONG, name="id", unsigned=False),
               SimpleNamespace(type=FIELD_TYPE.VARCHAR, name="name", character_set_name="utf8")]
    meta = SimpleNamespace(simple_primary_key_list=[0], primary_keys_with_prefix={})
    return make(TableMapEvent, table_id=table_id, schema=schema, table=table, columns=columns,
                optional_metadata=meta)


def inserts(ids, table="items", table_id=7):
    rows = [{"values": {"id": i, "name": f"n{i}"}, "none_sources": {}} for i in ids]
    return make(ExactWriteRows, table_id=table_id, schema="crm", table=table,
                columns=table_map(table, table_id).columns, _RowsEvent__rows=rows)


def xid():
    return make(XidEvent, xid=1)


def ddl_event(sql):
    packet = SimpleNamespace(event_size=100, log_pos=1000)
    return make(QueryEvent, query=sql, schema=b"crm", timestamp=T0, packet=packet)


def stream(resume=None, scope=None, start="0-1-9"):
    return ChangeStream("crm", "mariadb", scope or Scope("crm"), gtid=start,
                        file="mariadb-bin.000001", pos=4, resume=resume)


def feed_all(changes, events, take=1000, file="mariadb-bin.000001"):
    out = []
    for event in events:
        changes.feed(event, file, 500)
        out += changes.take(take)
    return out


def one_transaction(seq=10, ids=range(100)):
    return [gtid(seq), table_map(), inserts(list(ids)), xid()]


def test_rows_of_one_transaction_share_its_gtid_and_count_up():
    changes = stream()
    events = feed_all(changes, one_transaction(ids=range(3)))
    assert [e.id for e in events] == ["crm:0-1-10:0", "crm:0-1-10:1", "crm:0-1-10:2"]
    assert {e.position for e in events} == {"0-1-10"} and {e.txid for e in events} == {"0-1-10"}
    assert events[0].pk == {"id": 0} and events[0].item == {"id": 0, "name": "n0"}
    assert events[0].ts == "2026-11-30T12:32:31Z"
    assert changes.checkpoint().to_json()["gtid"] == "0-1-10"
    assert "tx" not in changes.checkpoint().to_json()


def test_checkpoint_inside_a_transaction_names_the_last_taken_row():
    changes = stream()
    for event in one_transaction()[:3]:
        changes.feed(event, "f", 1)
    first = changes.take(37)
    assert len(first) == 37 and len(changes.pending) == 63
    cp = changes.checkpoint()
    assert (cp.gtid, cp.tx, cp.index) == ("0-1-9", "0-1-10", 36)


def test_between_transactions_once_every_taken_row_has_its_transaction_ended():
    """What a batch's at_boundary says: true exactly when the checkpoint has no ``tx``."""
    changes = stream()
    assert changes.between_transactions                      # nothing read yet
    gtid_event, table, rows, end = one_transaction(ids=range(10))
    changes.feed(gtid_event, "f", 1)
    changes.feed(table, "f", 1)
    assert changes.between_transactions                      # begun, nothing of it taken
    changes.feed(rows, "f", 1)
    changes.take(10)
    assert not changes.between_transactions                  # all rows taken, no XID yet
    changes.feed(end, "f", 2)
    assert changes.between_transactions and changes.checkpoint().tx is None
    gtid_event, table, rows, end = one_transaction(seq=11, ids=range(5))
    for event in (gtid_event, table, rows):
        changes.feed(event, "f", 3)
    changes.take(4)
    assert not changes.between_transactions and changes.checkpoint().tx == "0-1-11"
    changes.take(1)
    assert not changes.between_transactions                  # a batch cut before the XID
    changes.feed(end, "f", 4)
    assert changes.between_transactions


def test_resume_skips_exactly_the_delivered_rows_once():
    first = stream()
    for event in one_transaction()[:3]:
        first.feed(event, "f", 1)
    first.take(37)
    saved = first.checkpoint().to_json()

    second = stream(resume=Checkpoint.from_json(saved), start=saved["gtid"])
    events = feed_all(second, one_transaction() + [gtid(11), table_map(), inserts([500]), xid()])
    assert [e.id for e in events] == [f"crm:0-1-10:{i}" for i in range(37, 100)] + ["crm:0-1-11:0"]
    assert second.checkpoint().to_json()["gtid"] == "0-1-11"


def test_resume_under_another_scope_replays_the_whole_transaction():
    first = stream()
    for event in one_transaction()[:3]:
        first.feed(event, "f", 1)
    first.take(10)
    saved = Checkpoint.from_json(first.checkpoint().to_json())
    second = stream(resume=saved, scope=Scope("crm", exclude=("other",)))
    assert len(feed_all(second, one_transaction())) == 100


def test_checkpoint_while_skipping_still_points_inside_the_transaction():
    saved = Checkpoint("mariadb", "0-1-9", "f", 4, "0-1-10", 49, Scope("crm").fingerprint())
    second = stream(resume=saved)
    second.feed(gtid(10), "f", 1)
    cp = second.checkpoint()
    assert (cp.tx, cp.index) == ("0-1-10", 49)


def test_update_and_delete_carry_before():
    changes = stream()
    update = make(ExactUpdateRows, table_id=7, schema="crm", table="items",
                  columns=table_map().columns,
                  _RowsEvent__rows=[{"before_values": {"id": 1, "name": "a"},
                                     "before_none_sources": {},
                                     "after_values": {"id": 1, "name": "b"},
                                     "after_none_sources": {}}])
    delete = make(ExactDeleteRows, table_id=7, schema="crm", table="items",
                  columns=table_map().columns,
                  _RowsEvent__rows=[{"values": {"id": 1, "name": "b"}, "none_sources": {}}])
    events = feed_all(changes, [gtid(10), table_map(), update, delete, xid()])
    assert [(e.type, e.item, e.before, e.pk) for e in events] == [
        ("update", {"id": 1, "name": "b"}, {"id": 1, "name": "a"}, {"id": 1}),
        ("delete", None, {"id": 1, "name": "b"}, {"id": 1})]
    assert [e.id for e in events] == ["crm:0-1-10:0", "crm:0-1-10:1"]


def test_standalone_ddl_is_a_schema_event_and_ends_its_transaction():
    changes = stream()
    events = feed_all(changes, [gtid(10, standalone=True),
                                ddl_event("ALTER TABLE items ADD x INT")])
    assert [(e.type, e.schema, e.table, e.item, e.id) for e in events] == [
        ("schema", "crm", "items", {"sql": "ALTER TABLE items ADD x INT"}, "crm:0-1-10:0")]
    assert changes.checkpoint().to_json()["gtid"] == "0-1-10"


def test_ddl_outside_the_scope_is_dropped_but_advances_the_position():
    changes = stream()
    events = feed_all(changes, [gtid(10, standalone=True),
                                ddl_event("ALTER TABLE shop.t ADD x INT"),
                                gtid(11, standalone=True), ddl_event("GRANT SELECT ON *.* TO u")])
    assert events == [] and changes.checkpoint().gtid == "0-1-11"


def test_truncate_event():
    events = feed_all(stream(), [gtid(10, standalone=True), ddl_event("TRUNCATE TABLE items")])
    assert [(e.type, e.table, e.item) for e in events] == [("truncate", "items", None)]


def test_table_map_without_column_names_is_fatal():
    bad = table_map()
    bad.columns[0].name = None
    changes = stream()
    changes.feed(gtid(10), "f", 1)
    with pytest.raises(Exception, match="binlog_row_metadata=FULL"):
        changes.feed(bad, "f", 1)


# ----------------------------------------------------------------------------- MySQL flavors
# No MySQL server here: these follow MySQL's documented event order (GTID, BEGIN, rows, XID;
# GTID + statement for DDL; BEGIN ... XID without GTIDs).

UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"


def mysql_gtid(gno):
    return make(GtidEvent, sid=bytes.fromhex(UUID.replace("-", "")), gno=gno, timestamp=T0)


def query(sql, end):
    return make(QueryEvent, query=sql, schema=b"crm", timestamp=T0,
                packet=SimpleNamespace(event_size=100, log_pos=end))


def mysql_stream(gtid, resume=None):
    return ChangeStream("crm", "mysql", Scope("crm"), gtid=gtid, file="binlog.000007", pos=4,
                        resume=resume)


def test_mysql_gtid_transactions_and_ddl():
    changes = mysql_stream(f"{UUID}:1-4")
    events = feed_all(changes, [mysql_gtid(5), query("BEGIN", 500), table_map(),
                                inserts([1, 2]), xid(),
                                mysql_gtid(6), query("ALTER TABLE items ADD x INT", 900)])
    assert [e.id for e in events] == [f"crm:{UUID}:5:0", f"crm:{UUID}:5:1", f"crm:{UUID}:6:0"]
    assert events[0].txid == f"{UUID}:5" and events[2].type == "schema"
    assert changes.checkpoint().gtid == f"{UUID}:1-6"


def test_without_gtids_transactions_are_named_by_file_and_start_offset():
    changes = mysql_stream(None)
    for event in [query("BEGIN", 1000), table_map(), inserts([1, 2])]:
        changes.feed(event, "binlog.000007", 1000)
    first = changes.take(1)
    assert first[0].id == "crm:binlog.000007:900:0" and first[0].txid is None
    assert first[0].position == "binlog.000007:900"
    saved = changes.checkpoint()
    assert (saved.gtid, saved.file, saved.pos, saved.tx, saved.index) == \
        (None, "binlog.000007", 4, "binlog.000007:900", 0)
    changes.take(10)
    changes.feed(xid(), "binlog.000007", 2000)
    assert (changes.checkpoint().file, changes.checkpoint().pos) == ("binlog.000007", 2000)

    resumed = mysql_stream(None, resume=saved)
    events = feed_all(resumed, [query("BEGIN", 1000), table_map(), inserts([1, 2]), xid()],
                      file="binlog.000007")
    assert [e.id for e in events] == ["crm:binlog.000007:900:1"]


# ----------------------------------------------------------------------------- connection

def watched_stream(dead_after):
    """A WatchedConnection in streaming state over a socketpair (no server)."""
    ours, theirs = socket.socketpair()
    conn = WatchedConnection(defer_connect=True, dead_after=dead_after)
    conn._sock = ours
    conn._current_timeout = None      # what pymysql's connect() would have set
    conn._write_bytes(b"\x0b\x00\x00\x00\x12" + b"\x00" * 10)   # a COM_BINLOG_DUMP request
    theirs.recv(100)
    return conn, theirs


def test_idle_at_the_deadline_without_consuming_anything():
    conn, server = watched_stream(dead_after=30)
    conn.deadline = time.monotonic() + 0.05
    started = time.monotonic()
    with pytest.raises(Idle):
        conn.read_payload()
    assert 0.04 <= time.monotonic() - started < 0.5
    server.sendall(b"\x01\x00\x00\x01\x00")      # one packet: length 1, seq 1, payload 0x00
    conn.deadline = time.monotonic() + 1
    conn._next_seq_id = 1
    assert conn.read_payload() == b"\x00"
    server.close()


def test_silence_longer_than_dead_after_is_a_dead_link():
    conn, server = watched_stream(dead_after=0.01)
    conn._stream.last_received = time.monotonic() - 1
    conn.deadline = time.monotonic()
    with pytest.raises(LinkDead):
        conn.read_payload()
    server.close()


def test_the_worker_s_wake_up_pipe_ends_a_wait_without_consuming_anything():
    """The idle wait lasts until the next keep-alive (seconds): a signal ends it at once, as
    Idle, and the stream goes on where it was; bytes on the stream still win."""
    conn, server = watched_stream(dead_after=30)
    wake_read, wake_write = os.pipe()
    conn.wake_fd = wake_read
    conn.deadline = time.monotonic() + 10
    os.write(wake_write, b"\x0a")
    started = time.monotonic()
    with pytest.raises(Idle):
        conn.read_payload()
    assert time.monotonic() - started < 1.0
    server.sendall(b"\x01\x00\x00\x01\x00")      # the pipe is still readable: the packet wins
    conn._next_seq_id = 1
    assert conn.read_payload() == b"\x00"
    conn.wake_fd = None
    os.read(wake_read, 10)
    os.close(wake_read), os.close(wake_write)
    server.close()


def test_payloads_of_16_mib_and_more_come_whole():
    conn, server = watched_stream(dead_after=30)
    conn.deadline = time.monotonic() + 5
    big = bytes(range(256)) * (2**24 // 256)          # 16 MiB: split at 2**24 - 1
    first, rest = big[:2**24 - 1], big[2**24 - 1:]

    def send():
        server.sendall(b"\xff\xff\xff\x01" + first + len(rest).to_bytes(3, "little") + b"\x02"
                       + rest + b"\x03\x00\x00\x03abc")
    sender = threading.Thread(target=send)
    sender.start()
    conn._next_seq_id = 1
    assert conn.read_payload() == big
    assert conn.read_payload() == b"abc"
    sender.join()
    server.close()


def test_a_packet_out_of_sequence_or_an_error_packet_raises_pymysql_s_error():
    conn, server = watched_stream(dead_after=30)
    conn.deadline = time.monotonic() + 5
    server.sendall(b"\x01\x00\x00\x05\x00")        # seq 5 where 1 is due
    conn._next_seq_id = 1
    with pytest.raises(pymysql.err.InternalError, match="sequence number wrong"):
        conn.read_payload()
    server.close()
    conn, server = watched_stream(dead_after=30)
    conn.deadline = time.monotonic() + 5
    error = b"\xff" + (1236).to_bytes(2, "little") + b"#HY000" + b"binlog purged"
    server.sendall(len(error).to_bytes(3, "little") + b"\x01" + error)
    conn._next_seq_id = 1
    with pytest.raises(pymysql.err.OperationalError, match="binlog purged"):
        conn.read_payload()
    server.close()


def test_stream_buffer_reports_what_it_holds():
    a, b = socket.socketpair()
    buffer = _StreamBuffer(a)
    b.sendall(b"abcdef")
    assert buffer.read(2) == b"ab" and buffer.pending() == 4
    assert buffer.read(4) == b"cdef" and buffer.pending() == 0
    a.close(), b.close()
