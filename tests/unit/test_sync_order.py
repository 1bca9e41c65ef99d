"""The sync sink's ordering of positions, its cursor's admission rule and its options (no
database): what exactly-once rests on."""

from __future__ import annotations

import json

import pytest

from lapidus.events import Record
from lapidus.sinks.sync.options import SyncOptions, validate
from lapidus.sinks.sync.order import UnorderedPosition, completes_itself, order_of
from lapidus.sinks.sync import state
from lapidus.sinks.sync.state import Cursor


def rec(id_, type_="insert", position="0/10"):
    return Record(id_, type_, "public", "t", ("1",), position, b"{}")


def test_positions_order_within_their_stream():
    assert order_of("0/1928C90") == ("lsn", 0x1928C90)
    assert order_of("1/0")[1] > order_of("0/FFFFFFFF")[1]
    assert order_of("0-1-42") == ("gtid:0", 84)
    assert order_of("1-7-3")[0] == "gtid:1"
    uuid = "3E11FA47-71CA-11E1-9E33-C80AA9429562"
    assert order_of(f"{uuid}:9") == (f"uuid:{uuid.lower()}", 18)
    a, b = order_of("mysql-bin.000003:1234"), order_of("mysql-bin.000010:4")
    assert a[0] == b[0] and a[1] < b[1]
    with pytest.raises(UnorderedPosition, match="PostgreSQL and MySQL/MariaDB"):
        order_of("826591C6A1000000012B022C0100296E5A1004")
    with pytest.raises(UnorderedPosition, match="several domains"):
        order_of("0-1-5,1-1-7")


def test_a_mysql_snapshot_chunk_sorts_between_its_neighbour_transactions():
    """A MariaDB chunk carries the GTID committed before it; without GTIDs, the file:pos
    where the next transaction starts: either way it is after the one, before the other."""
    assert order_of("0-1-41")[1] < order_of("0-1-41", "read")[1] < order_of("0-1-42")[1]
    before, after = order_of("bin.000003:900"), order_of("bin.000003:1234")
    chunk = order_of("bin.000003:1234", "read")
    assert before[1] < chunk[1] < after[1] and chunk[0] == after[0]
    assert order_of("0/10", "read") == order_of("0/10")       # PostgreSQL: its own LSN


def test_only_snapshot_rows_and_plain_messages_complete_themselves():
    assert completes_itself("read", b"{}") and completes_itself("gap", b"{}")
    assert completes_itself("message", b'{"transactional":false}')
    assert not completes_itself("message", b'{"transactional":true}')
    assert not completes_itself("insert", b"{}")


def test_cursor_drops_what_the_target_holds():
    cursor = Cursor()
    assert cursor.admits(rec("pg:0/10:0"), "lsn", 0x10)
    cursor.applied("lsn", 0x10, [], partial=False)
    assert not cursor.admits(rec("pg:0/10:0"), "lsn", 0x10)      # the same transaction
    assert not cursor.admits(rec("pg:0/8:0"), "lsn", 0x8)        # an older one
    assert cursor.admits(rec("pg:0/20:0"), "lsn", 0x20)
    assert cursor.admits(rec("crm:0-1-1:0"), "gtid:0", 1)       # another stream: its own key


def test_a_snapshot_chunk_applied_in_parts_goes_on_with_its_other_rows():
    cursor = Cursor()
    cursor.applied("lsn", 0x30, ["pg:read:0:public.t:[1]"], partial=True)
    assert not cursor.admits(rec("pg:read:0:public.t:[1]", "read"), "lsn", 0x30)
    assert cursor.admits(rec("pg:read:0:public.t:[2]", "read"), "lsn", 0x30)
    cursor.applied("lsn", 0x40, [], partial=False)
    assert not cursor.admits(rec("pg:read:0:public.t:[2]", "read"), "lsn", 0x30)


def test_held_events_are_not_taken_twice():
    cursor = Cursor()
    held = [rec("pg:0/50:0"), rec("pg:0/50:1")]
    cursor.hold(held, ("lsn", 0x50))
    assert not cursor.admits(held[1], "lsn", 0x50)
    assert cursor.admits(rec("pg:0/50:2"), "lsn", 0x50)          # the transaction goes on
    copy = cursor.copy()
    copy.hold([], None)
    assert cursor.pending == held and not copy.pending


def test_options():
    assert validate({"dsn": "dbname=x"}) == []
    keys = [k for k, _ in validate({"colour": 1, "batch_transactions": 0,
                                    "tables": {"a": {"table": "b", "colums": {}}}})]
    assert keys == ["colour", "dsn", "batch_transactions", "tables.a.colums"]
    parsed = SyncOptions.parse({"dsn": "x", "tables": {"items": "products",
                                                       "public.o": {"columns": {"a": "b"}}}})
    assert parsed.table_map("public", "items").table == "products"
    assert parsed.table_map("public", "o").columns == {"a": "b"}
    assert parsed.table_map("other", "o").columns == {}


def test_a_large_open_chunk_group_stops_keeping_its_ids(monkeypatch):
    """An idle MariaDB source's snapshot is one group: past OPEN_IDS_MAX ids the list is no
    longer kept (nor rewritten at each commit), and its rows are admitted again."""
    monkeypatch.setattr(state, "OPEN_IDS_MAX", 3)
    cursor = Cursor()
    cursor.applied("gtid:0", 9, [f"crm:read:0:d.t:[{i}]" for i in range(2)], partial=True)
    assert not cursor.admits(rec("crm:read:0:d.t:[1]", "read"), "gtid:0", 9)
    assert json.loads(cursor.open_json())["ids"] == ["crm:read:0:d.t:[0]", "crm:read:0:d.t:[1]"]
    cursor.applied("gtid:0", 9, [f"crm:read:0:d.t:[{i}]" for i in range(2, 5)], partial=True)
    assert cursor.admits(rec("crm:read:0:d.t:[1]", "read"), "gtid:0", 9)
    assert json.loads(cursor.open_json()) == {"stream": "gtid:0", "key": 9, "ids": None}
    again = Cursor()
    again.load_open(json.loads(cursor.open_json()))
    assert again.open_untracked and again.copy().open_untracked
    cursor.applied("gtid:0", 10, [], partial=False)                # a transaction after it
    assert not cursor.admits(rec("crm:read:0:d.t:[1]", "read"), "gtid:0", 9)
    assert not cursor.open_untracked and cursor.open_json() is None
