"""PgOutputDecoder against hand-built pgoutput protocol version 1 messages.

The builders below follow PostgreSQL's "Logical Replication Message Formats" byte for byte
(and the shapes recorded from PostgreSQL 15 through pg_recvlogical: each message followed by
one newline).  No server needed.
"""

from __future__ import annotations

import decimal
import json
import struct

import pytest

from lapidus.filters import TableFilter
from lapidus.workers.postgresql.decoding import (
    Begin, Change, Commit, RelationChanged, Watermark)
from lapidus.workers.postgresql.pgoutput import (
    PgOutputDecoder, ProtocolError, commit_time, message_content, quote_name, split_messages)
from lapidus.workers.postgresql.pgoutput_relations import RelationLog
from lapidus.workers.postgresql.transactions import TransactionAssembler
from lapidus.workers.postgresql.types import TypeMap
from lapidus.workers.snapshot import WATERMARK_PREFIX

UNCHANGED = object()      # a 'u' column: unchanged TOAST value

INT4, INT8, TEXT, NUMERIC, FLOAT8, BYTEA, BOOL, JSONB, INT4_ARRAY, TIMESTAMPTZ = (
    23, 20, 25, 1700, 701, 17, 16, 3802, 1007, 1184)


# -- message builders ------------------------------------------------------------------------

def cstring(text: str) -> bytes:
    return text.encode() + b"\0"


def begin(final_lsn: int, ts_us: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, ts_us, xid)


def commit(lsn: int, end_lsn: int, ts_us: int) -> bytes:
    return b"C" + b"\0" + struct.pack(">QQq", lsn, end_lsn, ts_us)


def relation(relid: int, schema: str, table: str, columns, identity: str = "d") -> bytes:
    """columns: (name, type OID, part of the key)."""
    out = b"R" + struct.pack(">I", relid) + cstring(schema) + cstring(table)
    out += identity.encode() + struct.pack(">H", len(columns))
    for name, oid, key in columns:
        out += bytes([1 if key else 0]) + cstring(name) + struct.pack(">Ii", oid, -1)
    return out


def pg_type(oid: int, schema: str, name: str) -> bytes:
    return b"Y" + struct.pack(">I", oid) + cstring(schema) + cstring(name)


def tuple_data(values) -> bytes:
    out = struct.pack(">H", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is UNCHANGED:
            out += b"u"
        else:
            raw = value.encode() if isinstance(value, str) else value
            out += b"t" + struct.pack(">I", len(raw)) + raw
    return out


def insert(relid: int, values) -> bytes:
    return b"I" + struct.pack(">I", relid) + b"N" + tuple_data(values)


def update(relid: int, values, old=None, old_kind: bytes = b"K") -> bytes:
    out = b"U" + struct.pack(">I", relid)
    if old is not None:
        out += old_kind + tuple_data(old)
    return out + b"N" + tuple_data(values)


def delete(relid: int, old, old_kind: bytes = b"K") -> bytes:
    return b"D" + struct.pack(">I", relid) + old_kind + tuple_data(old)


def truncate(*relids: int, options: int = 0) -> bytes:
    return b"T" + struct.pack(">IB", len(relids), options) + \
        b"".join(struct.pack(">I", r) for r in relids)


def logical_message(prefix: str, content: bytes, lsn: int, transactional: bool = True) -> bytes:
    return b"M" + bytes([1 if transactional else 0]) + struct.pack(">Q", lsn) + \
        cstring(prefix) + struct.pack(">I", len(content)) + content


def origin(lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", lsn) + cstring(name)


def spool(*messages: bytes) -> bytes:
    """What pg_recvlogical writes: each message followed by one newline."""
    return b"".join(m + b"\n" for m in messages)


# -- a decoder without a server --------------------------------------------------------------

class FakeCatalog:
    def __init__(self):
        self.type_map = TypeMap()

    def converter(self, oid):
        return self.type_map.converter(oid)


class FakeRelations:
    """CatalogRelations without a server: primary keys by OID, no fallback descriptions."""

    def __init__(self, primary_keys=None, described=None):
        self.primary_keys = primary_keys or {}
        self.described = described or {}
        self.asked = []

    def primary_key(self, relid):
        self.asked.append(relid)
        return self.primary_keys.get(relid)

    def describe(self, relid):
        return self.described.get(relid)


def make_decoder(table_filter=None, relations=None, **kwargs) -> PgOutputDecoder:
    return PgOutputDecoder(FakeCatalog(), table_filter or TableFilter(), "lapidus_pub",
                           relations=relations or FakeRelations(), **kwargs)


ITEMS = 16390
ITEMS_COLUMNS = [("id", INT4, True), ("name", TEXT, False), ("price", NUMERIC, False),
                 ("body", TEXT, False)]
ITEMS_R = relation(ITEMS, "public", "items", ITEMS_COLUMNS)

TS_US = 848_406_513_126_894     # 2026-11-19 12:28:33.126894 UTC, microseconds since 2000


def decode_all(decoder, *messages):
    return [decoder.decode(m) for m in messages]


# -- transaction frames ----------------------------------------------------------------------

def test_begin_carries_final_lsn_xid_and_commit_time_in_utc():
    assert make_decoder().decode(begin(0x21C6768, TS_US, 731)) == Begin(
        0x21C6768, "731", "2026-11-19T12:28:33.126894Z")


def test_commit_time_is_written_like_postgresql_prints_it():
    # trailing zeros dropped, no fraction for whole seconds (as on the wal2json path)
    assert commit_time(0) == "2000-01-01T00:00:00Z"
    assert commit_time(500_000) == "2000-01-01T00:00:00.5Z"
    assert commit_time(-1) == "1999-12-31T23:59:59.999999Z"


def test_commit_carries_the_commit_lsn():
    assert make_decoder().decode(commit(0x21C6768, 0x21C6798, TS_US)) == Commit(0x21C6768)


def test_origin_and_type_messages_produce_nothing_but_types_are_remembered():
    decoder = make_decoder()
    assert decoder.decode(origin(0x100, "upstream")) is None
    assert decoder.decode(pg_type(16389, "public", "mood")) is None
    assert decoder.types[16389] == ("public", "mood")


# -- rows ------------------------------------------------------------------------------------

def test_insert_maps_text_values_through_the_type_converters():
    decoder = make_decoder()
    cols = [("id", INT8, True), ("n", NUMERIC, False), ("f", FLOAT8, False),
            ("b", BYTEA, False), ("ok", BOOL, False), ("j", JSONB, False),
            ("a", INT4_ARRAY, False), ("ts", TIMESTAMPTZ, False), ("t", TEXT, False)]
    decoder.decode(relation(1, "public", "t", cols))
    change = decoder.decode(insert(1, [
        "-9223372036854775808", "12345678901234567890.000000001", "NaN", "\\x0a0d", "t",
        '{"a": 1.50, "b": [1, 12345678901234567890123]}', "{1,2,NULL}",
        "2026-11-30 12:28:33.125557+00", "a\nb"]))
    assert change == Change("insert", "public", "t", pk={"id": -2 ** 63}, item={
        "id": -2 ** 63,
        "n": "12345678901234567890.000000001",
        "f": "NaN",
        "b": "Cg0=",
        "ok": True,
        "j": {"a": decimal.Decimal("1.50"), "b": [1, decimal.Decimal("12345678901234567890123")]},
        "a": [1, 2, None],
        "ts": "2026-11-30T12:28:33.125557Z",
        "t": "a\nb",
    })


@pytest.mark.parametrize("text, value", [
    ("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity"), ("1.5", 1.5),
    ("-0", -0.0)])
def test_float_special_values_keep_their_names(text, value):
    decoder = make_decoder()
    decoder.decode(relation(2, "public", "f", [("id", INT4, True), ("v", FLOAT8, False)]))
    assert decoder.decode(insert(2, ["1", text])).item["v"] == value


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1.50", "0.000"])
def test_numeric_stays_the_exact_text(text):
    decoder = make_decoder()
    decoder.decode(relation(3, "public", "n", [("id", INT4, True), ("v", NUMERIC, False)]))
    assert decoder.decode(insert(3, ["1", text])).item["v"] == text


def test_nulls_are_none_for_every_type():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    change = decoder.decode(insert(ITEMS, ["1", None, None, None]))
    assert change.item == {"id": 1, "name": None, "price": None, "body": None}


def test_update_with_unchanged_toast_lists_the_column_and_leaves_it_out_of_item():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    change = decoder.decode(update(ITEMS, ["1", "b", "2.00", UNCHANGED]))
    assert change.type == "update"
    assert change.item == {"id": 1, "name": "b", "price": "2.00"}
    assert change.unchanged == ["body"]
    # no old tuple (key unchanged): like wal2json, before is the key taken from the new row
    assert change.before == {"id": 1}
    assert change.pk == {"id": 1}


def test_update_carrying_every_column_has_no_unchanged_list():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    assert decoder.decode(update(ITEMS, ["1", "b", "2.00", "x"])).unchanged is None


def test_update_of_the_key_carries_the_old_key_as_before():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    # a K tuple has every column; the ones outside the key are 'n'
    change = decoder.decode(update(ITEMS, ["2", "b", "1.00", "x"], old=["1", None, None, None]))
    assert change.before == {"id": 1}
    assert change.pk == {"id": 2}


def test_replica_identity_full_gives_the_whole_old_row_and_pk_from_the_catalog():
    relations = FakeRelations(primary_keys={7: ("id",)})
    decoder = make_decoder(relations=relations)
    # FULL flags every column as part of the identity
    decoder.decode(relation(7, "public", "full", [("id", INT4, True), ("v", TEXT, True)], "f"))
    change = decoder.decode(update(7, ["1", "new"], old=["1", "old"], old_kind=b"O"))
    assert change.before == {"id": 1, "v": "old"}
    assert change.item == {"id": 1, "v": "new"}
    assert change.pk == {"id": 1}
    assert relations.asked == [7]
    deleted = decoder.decode(delete(7, ["1", "new"], old_kind=b"O"))
    assert (deleted.type, deleted.item, deleted.before, deleted.pk) == (
        "delete", None, {"id": 1, "v": "new"}, {"id": 1})


def test_replica_identity_index_pk_is_still_the_primary_key():
    decoder = make_decoder(relations=FakeRelations(primary_keys={8: ("id",)}))
    decoder.decode(relation(8, "public", "idx", [("id", INT4, False), ("u", INT4, True)], "i"))
    change = decoder.decode(update(8, ["1", "2"]))
    assert change.before == {"u": 2}
    assert change.pk == {"id": 1}
    # a delete has only the index columns: the pk value is unknown (as through wal2json)
    assert decoder.decode(delete(8, [None, "2"])).pk == {"id": None}


def test_table_without_key_has_no_pk_and_no_before():
    decoder = make_decoder()
    decoder.decode(relation(9, "public", "nokey", [("a", INT4, False), ("b", TEXT, False)]))
    change = decoder.decode(insert(9, ["1", "x"]))
    assert change.pk is None
    assert decoder.decode(update(9, ["1", "y"])).before is None


def test_delete_with_key_only_keeps_only_the_key_columns():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    change = decoder.decode(delete(ITEMS, ["5", None, None, None]))
    assert change == Change("delete", "public", "items", pk={"id": 5}, item=None,
                            before={"id": 5})


def test_composite_key_in_column_order():
    decoder = make_decoder()
    decoder.decode(relation(10, "s", "pairs", [("a", INT4, True), ("x", TEXT, False),
                                               ("b", TEXT, True)]))
    assert decoder.decode(insert(10, ["1", "v", "k"])).pk == {"a": 1, "b": "k"}


def test_a_newer_relation_message_replaces_the_older_one():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    assert decoder.decode(insert(ITEMS, ["1", "a", "1.00", "x"])).item["price"] == "1.00"
    # ALTER TABLE: price became text, a column was added
    decoder.decode(relation(ITEMS, "public", "items", [
        ("id", INT4, True), ("name", TEXT, False), ("price", TEXT, False), ("body", TEXT, False),
        ("added", INT4, False)]))
    change = decoder.decode(insert(ITEMS, ["2", "b", "cheap", "y", "7"]))
    assert change.item == {"id": 2, "name": "b", "price": "cheap", "body": "y", "added": 7}


def test_a_renamed_table_is_named_by_its_newest_relation_message():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    decoder.decode(relation(ITEMS, "shop", "products", ITEMS_COLUMNS))
    assert decoder.decode(insert(ITEMS, ["1", "a", "1", "x"])).table == "products"


def test_change_whose_column_count_differs_from_its_relation_is_an_error():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    with pytest.raises(ProtocolError, match="public.items: a change has 2 columns"):
        decoder.decode(insert(ITEMS, ["1", "a"]))


def test_change_before_any_relation_message_uses_the_catalog_with_a_warning():
    from lapidus.workers.postgresql.pgoutput import parse_relation
    warnings = []
    described = parse_relation(ITEMS_R)
    decoder = make_decoder(relations=FakeRelations(described={ITEMS: described}),
                           warn=lambda message, **kw: warnings.append((message, kw)))
    assert decoder.decode(insert(ITEMS, ["1", "a", "1", "x"])).item["id"] == 1
    assert warnings and warnings[0][1]["table"] == "public.items"


def test_change_for_a_relation_nobody_knows_is_an_error():
    decoder = make_decoder()
    with pytest.raises(ProtocolError, match="relation OID 4242"):
        decoder.decode(insert(4242, ["1"]))


# -- truncate and filters --------------------------------------------------------------------

def test_truncate_of_one_table_is_one_change():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    assert decoder.decode(truncate(ITEMS)) == Change("truncate", "public", "items")


def test_truncate_of_several_tables_is_one_change_per_table_in_order():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    decoder.decode(relation(11, "public", "other", [("id", INT4, True)]))
    assert decoder.decode(truncate(11, ITEMS, options=1)) == [
        Change("truncate", "public", "other"), Change("truncate", "public", "items")]


def test_filtered_tables_decode_to_none_but_their_relations_are_kept():
    decoder = make_decoder(TableFilter(exclude=["items"]))
    assert decoder.decode(ITEMS_R) is None
    assert decoder.decode(insert(ITEMS, ["1", "a", "1", "x"])) is None
    assert decoder.decode(update(ITEMS, ["1", "a", "1", "x"])) is None
    assert decoder.decode(delete(ITEMS, ["1", None, None, None])) is None
    assert decoder.decode(truncate(ITEMS)) is None
    decoder.decode(relation(11, "public", "other", [("id", INT4, True)]))
    assert decoder.decode(truncate(ITEMS, 11)) == Change("truncate", "public", "other")


# -- logical messages ------------------------------------------------------------------------

def test_transactional_message():
    change = make_decoder().decode(logical_message("audit", b"hello", 0x500))
    assert change == Change("message", prefix="audit", content="hello", transactional=True,
                            lsn=0x500)


def test_non_transactional_message_carries_its_own_lsn():
    change = make_decoder().decode(logical_message("p", b"x", 0x21C75A0, transactional=False))
    assert (change.transactional, change.lsn) == (False, 0x21C75A0)


def test_message_content_utf8_newlines_and_non_utf8():
    assert make_decoder().decode(
        logical_message("p", "a\nb ✓ 🦀".encode(), 1)).content == "a\nb ✓ 🦀"
    # not UTF-8 (pg_logical_emit_message's bytea form): PostgreSQL's bytea hex text
    assert message_content(b"\xff\x00") == "\\xff00"
    assert message_content(b"") == ""


def test_users_messages_can_be_turned_off_but_are_asked_for_on_postgresql_14():
    # asked for even with messages = false: a backfill's watermarks are messages
    for decoder in (make_decoder(), make_decoder(messages=False)):
        assert decoder.plugin_options() == [
            "proto_version=1", "publication_names=lapidus_pub", "messages=true"]
    off = make_decoder(messages=False)
    assert off.decode(logical_message("p", b"x", 1)) is None
    assert "messages=true" not in make_decoder(server_version=130012).plugin_options()


def test_a_snapshot_watermark_is_never_a_message_event():
    for decoder in (make_decoder(), make_decoder(messages=False)):
        mark = decoder.decode(logical_message(WATERMARK_PREFIX, b"b:0:n:1:high", 7))
        assert mark == Watermark("b:0:n:1:high")


def test_publication_names_are_quoted_when_they_need_it():
    assert quote_name("lapidus_shop") == "lapidus_shop"
    assert quote_name("Shop Pub") == '"Shop Pub"'
    assert quote_name('a"b') == '"a""b"'


# -- framing ---------------------------------------------------------------------------------

def session():
    """One of every message type, values with newlines, bytes 0x0A inside lengths."""
    ten = "x" * 10                              # its length field holds the byte 0x0A
    return [
        begin(0x1000, TS_US, 700), origin(0x10, "o"), pg_type(16389, "public", "mood"),
        ITEMS_R, insert(ITEMS, ["1", "a\nb", "\n", ten]),
        update(ITEMS, ["2", "\n\n", None, UNCHANGED], old=["1", None, None, None]),
        delete(ITEMS, ["2", None, None, None]), truncate(ITEMS),
        logical_message("p\n", b"line\nline", 0x0A0A0A0A), commit(0x1000, 0x1030, TS_US),
        logical_message("nt", b"\n", 0x2000, transactional=False),
    ]


def test_split_returns_every_message_without_its_newline():
    messages = session()
    data = spool(*messages)
    frames, used = make_decoder().split(data)
    assert frames == messages
    assert used == len(data)


def test_split_at_every_chunk_boundary_gives_the_same_frames():
    messages = session()
    data = spool(*messages)
    decoder = make_decoder()
    for cut in range(len(data) + 1):
        first, used = decoder.split(data[:cut])
        rest, used_rest = decoder.split(data[used:])
        assert list(first) + list(rest) == messages, cut
        assert used + used_rest == len(data)
        # the bytes used always end right after a newline: a frame boundary
        assert used == 0 or data[used - 1:used] == b"\n"


def test_split_byte_by_byte_like_a_slow_writer():
    messages = session()
    data = spool(*messages)
    decoder, pending, frames = make_decoder(), b"", []
    for i in range(len(data)):
        pending += data[i:i + 1]
        got, used = decoder.split(pending)
        frames += got
        pending = pending[used:]
    assert frames == messages and pending == b""


def decoded_whole(decoder, data: bytes) -> list:
    """What decode() gives for each frame of ``data`` (framed by split)."""
    frames, _ = decoder.split(data)
    return [decoder.decode(frame) for frame in frames]


def test_decode_run_at_every_chunk_boundary_gives_what_framing_then_decoding_gives():
    data = spool(*session())
    expected = decoded_whole(make_decoder(), data)
    for cut in range(len(data) + 1):
        decoder = make_decoder()
        first, used = decoder.decode_run(data[:cut], 0, 1000, (1, 0))
        rest, end = decoder.decode_run(data, used, 1000, (1, 0))
        assert [m for m, _ in first + rest] == expected, cut
        assert end == len(data)
        assert sum(size for _, size in first + rest) == len(data)
        # what is used always ends right after a newline: a frame boundary
        assert used == 0 or data[used - 1:used] == b"\n"


def test_decode_run_takes_at_most_limit_messages_and_says_where_it_stopped():
    messages = session()
    data = spool(*messages)
    decoder, got, pos = make_decoder(), [], 0
    while True:
        run, pos = decoder.decode_run(data, pos, 2, (1, 0))
        if not run:
            break
        assert len(run) <= 2
        got += run
    assert [size for _, size in got] == [len(m) + 1 for m in messages]
    assert [m for m, _ in got] == decoded_whole(make_decoder(), data)


def test_decode_run_waits_for_a_value_cut_inside_and_refuses_a_whole_bad_one():
    decoder = make_decoder()
    decoder.decode(ITEMS_R)
    row = insert(ITEMS, ["12345", "a", "1", "x"])
    value = row.index(b"12345")
    for cut in (value, value + 2, len(row)):
        # a half (or empty) integer is never turned into an error or an event, nor is a
        # whole message whose newline is still to come
        assert decoder.decode_run(row[:cut], 0, 10, (1, 0)) == ([], 0), cut
    [(change, size)], used = decoder.decode_run(row + b"\n", 0, 10, (1, 0))
    assert change.item["id"] == 12345 and size == used == len(row) + 1
    bad = insert(ITEMS, ["x1", "a", "1", "x"])                  # not an integer
    with pytest.raises(ValueError):
        decoder.decode_run(bad + b"\n", 0, 10, (1, 0))


def test_decode_run_refuses_a_message_without_its_newline():
    decoder = make_decoder()
    with pytest.raises(ProtocolError, match="not followed by the newline"):
        decoder.decode_run(begin(1, 0, 1) + b"X" + begin(2, 0, 2) + b"\n", 0, 10, (1, 0))
    decoder.decode(ITEMS_R)
    row = insert(ITEMS, ["1", "a", "1", "x"])
    with pytest.raises(ProtocolError, match="not followed by the newline"):
        decoder.decode_run(row + b"X" + row + b"\n", 0, 10, (1, 0))


def test_message_complete_but_its_newline_not_yet_written_stays():
    message = insert(ITEMS, ["1", "a", "1", "x"])
    assert split_messages(message) == ([], 0)
    assert split_messages(message + b"\n") == ([message], len(message) + 1)


def test_consumed_bytes_are_len_of_frame_plus_one():
    messages = session()
    frames, used = split_messages(spool(*messages))
    assert used == sum(len(f) + 1 for f in frames)


def test_unknown_message_type_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="unknown pgoutput message type"):
        split_messages(b"S\0\0\0\1\n")          # 'S' stream start: protocol version 2 only


def test_missing_newline_after_a_message_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="not followed by the newline"):
        split_messages(begin(1, 0, 1) + b"X" + begin(2, 0, 2) + b"\n")


def test_binary_column_kind_is_framed_but_refused_when_decoded():
    decoder = make_decoder()
    decoder.decode(relation(12, "public", "b", [("id", INT4, True)]))
    message = b"I" + struct.pack(">I", 12) + b"N" + struct.pack(">H", 1) + b"b" + \
        struct.pack(">I", 4) + b"\0\0\0\1"
    assert split_messages(message + b"\n") == ([message], len(message) + 1)
    with pytest.raises(ProtocolError, match="column kind"):
        decoder.decode(message)


# -- a whole session through the transaction assembler ---------------------------------------

def test_session_becomes_events_with_ids_from_the_commit_lsn():
    decoder, assembler, events = make_decoder(), TransactionAssembler("pg"), []
    frames, _ = decoder.split(spool(*session()))
    for frame in frames:
        message = decoder.decode(frame)
        for each in (message if isinstance(message, list) else [message]):
            if each is not None:
                assembler.feed(each, events)
    assert [(e.id, e.type) for e in events] == [
        ("pg:0/1000:0", "insert"), ("pg:0/1000:1", "update"), ("pg:0/1000:2", "delete"),
        ("pg:0/1000:3", "truncate"), ("pg:0/1000:4", "message"), ("pg:0/2000:0", "message")]
    assert events[0].item == {"id": 1, "name": "a\nb", "price": "\n", "body": "x" * 10}
    assert events[1].unchanged == ["body"] and events[1].before == {"id": 1}
    assert events[0].ts == "2026-11-19T12:28:33.126894Z" and events[0].txid == "700"
    assert events[4].prefix == "p\n" and events[4].content == "line\nline"
    assert events[5].content == "\n" and events[5].txid is None


# -- the durable relation log ----------------------------------------------------------------

def log_relation(decoder: PgOutputDecoder, frame: bytes, position) -> None:
    """Decode ``frame`` as the spool reader would find it at ``position`` (segment, offset)."""
    data = b"\0" * position[1] + spool(frame)
    messages, used = decoder.decode_run(data, position[1], 10, (position[0], 0))
    # nothing, or the schema change a changed description shows (test_a_changed_relation...)
    assert len(messages) == 1 and messages[0][1] == len(frame) + 1 and used == len(data)
    assert messages[0][0] is None or isinstance(messages[0][0], RelationChanged)


def test_a_changed_relation_is_a_schema_change_outside_the_change_index():
    decoder = make_decoder()
    assert decoder.decode(ITEMS_R) is None                      # first sight: no news
    assert decoder.decode(ITEMS_R) is None                      # resent unchanged
    newer = relation(ITEMS, "public", "items",
                     [c for c in ITEMS_COLUMNS if c[0] != "body"] + [("added", INT4, False)])
    change = decoder.decode(newer)
    assert isinstance(change, RelationChanged)
    assert (change.schema, change.table, change.item["added"], change.item["dropped"]) == (
        "public", "items", ["added"], ["body"])
    assembler, out = TransactionAssembler("b"), []
    for message in (Begin(0x100, "7", None), change,
                    decoder.decode(insert(ITEMS, ["1", "a", "1", "7"])), Commit(0x100)):
        assembler.feed(message, out)
    assert [(e.type, e.id) for e in out] == [("schema", "b:0/100:relation:16390"),
                                             ("insert", "b:0/100:0")]


def test_a_ddl_capture_message_is_a_schema_change_of_its_table():
    content = json.dumps({"command": "ALTER TABLE", "object_type": "table",
                          "object": "public.items", "schema": "public", "table": "items",
                          "columns": [{"name": "id", "type": "integer"}], "sql": "ALTER ..."})
    decoder = make_decoder(messages=False)
    change = decoder.decode(logical_message("lapidus-ddl", content.encode(), 5))
    assert (change.type, change.schema, change.table, change.item["source"]) == (
        "schema", "public", "items", "ddl_capture")
    decoder.decode(ITEMS_R)
    # the relation message that follows repeats what the capture said: no second event
    assert decoder.decode(relation(ITEMS, "public", "items",
                                   ITEMS_COLUMNS + [("x", INT4, False)])) is None
    excluded = make_decoder(table_filter=TableFilter(exclude=["items"]))
    assert excluded.decode(logical_message("lapidus-ddl", content.encode(), 5)) is None


def test_relation_frames_are_logged_with_their_spool_position(tmp_path):
    path = tmp_path / "relations.jsonl"
    decoder = make_decoder(log=RelationLog(path, None))
    log_relation(decoder, ITEMS_R, (3, 100))
    log_relation(decoder, ITEMS_R, (3, 200))    # resent unchanged: not logged again
    assert [json.loads(line)["offset"] for line in path.read_text().splitlines()] == [100]
    # a worker resuming after the frame (its segment may be gone) still knows the table
    again = make_decoder(log=RelationLog(path, (4, 0)))
    assert again.decode(insert(ITEMS, ["1", "a", "1", "x"])).table == "items"


def test_relation_log_keeps_what_was_in_force_at_the_resume_position(tmp_path):
    path = tmp_path / "relations.jsonl"
    decoder = make_decoder(log=RelationLog(path, None))
    log_relation(decoder, ITEMS_R, (1, 0))
    newer = relation(ITEMS, "public", "items", ITEMS_COLUMNS + [("added", INT4, False)])
    log_relation(decoder, newer, (2, 500))
    # resuming between the two: the older description, and the newer is dropped from the file
    resumed = make_decoder(log=RelationLog(path, (2, 100)))
    assert resumed.decode(insert(ITEMS, ["1", "a", "1", "x"])).item["body"] == "x"
    assert len(path.read_text().splitlines()) == 1
    # resuming after both: the newer one
    log_relation(make_decoder(log=RelationLog(path, None)), newer, (2, 500))
    resumed = make_decoder(log=RelationLog(path, (2, 501)))
    assert resumed.decode(insert(ITEMS, ["1", "a", "1", "x", "7"])).item["added"] == 7


def test_relation_log_is_emptied_when_the_spool_is_read_from_its_start(tmp_path):
    path = tmp_path / "relations.jsonl"
    log_relation(make_decoder(log=RelationLog(path, None)), ITEMS_R, (1, 0))
    assert RelationLog(path, None).frames() == []
    assert path.read_text() == ""


def test_relation_log_ignores_a_last_line_torn_by_a_crash(tmp_path):
    path = tmp_path / "relations.jsonl"
    log_relation(make_decoder(log=RelationLog(path, None)), ITEMS_R, (1, 0))
    with open(path, "ab") as f:
        f.write(b'{"segment": 1, "offset": 9, "fra')
    assert RelationLog(path, (2, 0)).frames() == [ITEMS_R]


def test_relation_log_damaged_in_the_middle_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "relations.jsonl"
    path.write_text('garbage\n{"segment": 1, "offset": 0, "frame": "00"}\n')
    with pytest.raises(ValueError, match="relations.jsonl: line 1 is damaged"):
        RelationLog(path, (2, 0))
