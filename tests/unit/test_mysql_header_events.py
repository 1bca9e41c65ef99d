"""Unit tests: the GTID, XID and rows events the binlog reader reads from the packet's bytes
give the attributes the library's own parser gives them (lapidus.workers.mysql.reader)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from pymysql.protocol import MysqlPacket
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import MariadbGtidEvent, XidEvent
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.table import Table

from lapidus.workers.mysql import reader


def packet(kind: int, body: bytes, *, timestamp=1796041951, server_id=7, next_pos=4242):
    """A replication packet as the server sends it: OK byte, event header, body, CRC32."""
    size = 19 + len(body) + 4
    header = struct.pack("<IBIIIH", timestamp, kind, server_id, size, next_pos, 0)
    return b"\x00" + header + body + b"\xde\xad\xbe\xef"


def library_event(data: bytes):
    control = SimpleNamespace(charset="utf8", _get_dbms=lambda: "mariadb")
    wrapped = BinLogPacketWrapper(
        MysqlPacket(data, "utf8"), {}, control, (10, 11, 0), True,
        frozenset({MariadbGtidEvent, XidEvent}), None, None, None, None, False, False, False,
        False, False)
    return wrapped.event


@pytest.mark.parametrize("seq, domain, flags", [(1, 0, 12), (2**40 + 5, 3, 1), (9, 2**31, 0)])
def test_mariadb_gtid_as_the_library_reads_it(seq, domain, flags):
    data = packet(BINLOG.MARIADB_GTID_EVENT, struct.pack("<QIB", seq, domain, flags) + b"\0" * 6)
    ours = reader._HEADER_ONLY_EVENTS[BINLOG.MARIADB_GTID_EVENT](data)
    theirs = library_event(data)
    assert type(ours) is type(theirs) is MariadbGtidEvent
    for name in ("gtid", "timestamp", "flags", "server_id", "gtid_seq_no", "domain_id"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.gtid == f"{domain}-7-{seq}"


def test_xid_as_the_library_reads_it():
    data = packet(BINLOG.XID_EVENT, struct.pack("<Q", 2**63 + 11))
    ours = reader._HEADER_ONLY_EVENTS[BINLOG.XID_EVENT](data)
    theirs = library_event(data)
    assert type(ours) is type(theirs) is XidEvent
    assert (ours.xid, ours.timestamp) == (theirs.xid, theirs.timestamp) == (2**63 + 11,
                                                                            1796041951)


# ------------------------------------------------------------------------------- rows events

def rows_packet(kind: int, table_id: int, columns: int, bitmaps: int, rows: bytes,
                extra: bytes = b"") -> bytes:
    body = table_id.to_bytes(6, "little") + (1).to_bytes(2, "little")
    if kind in (BINLOG.WRITE_ROWS_EVENT_V2, BINLOG.UPDATE_ROWS_EVENT_V2,
                BINLOG.DELETE_ROWS_EVENT_V2):
        body += (len(extra) + 2).to_bytes(2, "little") + extra
    body += bytes([columns]) + b"\x03" * bitmaps + rows
    return packet(kind, body)


def library_rows_event(data: bytes, table):
    control = SimpleNamespace(charset="utf8", _get_dbms=lambda: "mariadb")
    return reader._PacketWrapper(
        MysqlPacket(data, "utf8"), {table.table_id: table}, control, (10, 11, 0), True,
        reader.EVENTS, None, None, None, None, False, False, False, False, False).event


@pytest.mark.parametrize("kind, bitmaps, extra", [
    (BINLOG.WRITE_ROWS_EVENT_V1, 1, b""), (BINLOG.UPDATE_ROWS_EVENT_V1, 2, b""),
    (BINLOG.DELETE_ROWS_EVENT_V1, 1, b""), (BINLOG.WRITE_ROWS_EVENT_V2, 1, b""),
    (BINLOG.UPDATE_ROWS_EVENT_V2, 2, b"\x01\x05\x00\x06\x00"),
    (BINLOG.DELETE_ROWS_EVENT_V2, 1, b"\x01\x05\x00")])
def test_rows_event_header_as_the_library_reads_it(kind, bitmaps, extra):
    table = Table(4711, "crm", "items", [SimpleNamespace(data={"name": "id", "is_primary": 1}),
                                         SimpleNamespace(data={"name": "n", "is_primary": 0})])
    rows = b"\x00\x07\x00\x00\x00\x09\x00\x00\x00" * 2
    data = rows_packet(kind, 4711, 2, bitmaps, rows, extra)
    ours = reader.lean_rows(data, table, True, None)
    theirs = library_rows_event(data, table)
    assert isinstance(ours, type(theirs))
    for name in ("table_id", "schema", "table", "columns", "number_of_columns", "flags",
                 "columns_present_bitmap", "timestamp"):
        assert getattr(ours, name) == getattr(theirs, name), name
    if bitmaps == 2:
        assert ours.columns_present_bitmap2 == theirs.columns_present_bitmap2
    assert ours.raw_rows == reader.row_data(theirs) == rows


def test_a_rows_event_with_an_unknown_post_header_is_left_to_the_library():
    table = Table(1, "crm", "items", [SimpleNamespace(data={"name": "id", "is_primary": 1})])
    data = rows_packet(BINLOG.WRITE_ROWS_EVENT_V1, 1, 1, 1, b"\x00\x01\x00\x00\x00")
    lengths = [0] * 40
    lengths[BINLOG.WRITE_ROWS_EVENT_V1 - 1] = 12
    assert reader.lean_rows(data, table, True, lengths) is None
    lengths[BINLOG.WRITE_ROWS_EVENT_V1 - 1] = 8
    assert reader.lean_rows(data, table, True, lengths).raw_rows == b"\x00\x01\x00\x00\x00"
