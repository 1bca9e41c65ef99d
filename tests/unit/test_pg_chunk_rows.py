"""chunkrows: a snapshot chunk converted column by column gives exactly the values of the
decoders' per-value conversion (the rule it replaced), NULLs and key order included."""

from __future__ import annotations

from lapidus.workers.postgresql.chunkrows import IDENTITY_FOR_TEXT, chunk_rows
from lapidus.workers.postgresql.types import TypeMap
from lapidus.workers.snapshot.events import pk_text

# int4, text, numeric, bool, bytea, timestamptz, jsonb, int4[], text[], float8, an unknown OID
OIDS = [23, 25, 1700, 16, 17, 1184, 3802, 1007, 1009, 701, 999999]
NAMES = ["id", "t", "n", "b", "raw", "at", "doc", "ints", "texts", "f", "odd"]
RAW = [
    ("1", "a", "1.50", "t", "\\x00ff", "2026-01-01 00:00:00+00", '{"a": 1.0}', "{1,NULL}",
     '{"x y",NULL,""}', "NaN", "(1,2)"),
    ("2", None, None, None, None, None, None, None, None, None, None),
    ("3", "", "-0.00", "f", "\\x", "2026-01-01 05:30:00.5+05:30", "[]", "{}", "{}", "1e300",
     ""),
]


def reference(raw, names, converters, key_names):
    """The per-value conversion snapshots used before (and the decoders use), with each
    row's key text."""
    rows = []
    for values in raw:
        item = {name: None if value is None else convert(value)
                for name, convert, value in zip(names, converters, values)}
        pk = {name: item[name] for name in key_names}
        rows.append((pk_text(list(pk.values())), (pk, item)))
    return rows


def test_columns_convert_exactly_like_values_and_nulls_stay_none():
    converters = [TypeMap().converter(oid) for oid in OIDS]
    got = chunk_rows(RAW, NAMES, converters, [0])
    want = reference(RAW, NAMES, converters, ["id"])
    assert got == want
    items = [item for _, (_, item) in got]
    assert [type(v) for v in items[0].values()] == [type(v) for v in want[0][1][1].values()]
    assert list(items[0]) == NAMES and items[1]["t"] is None
    assert items[0]["at"] == "2026-01-01T00:00:00Z" and items[2]["at"] == "2026-01-01T00:00:00.5Z"
    assert [text for text, _ in got] == ["[1]", "[2]", "[3]"]


def test_a_composite_key_is_in_key_order_not_column_order():
    converters = [TypeMap().converter(oid) for oid in OIDS]
    got = chunk_rows(RAW, NAMES, converters, [1, 0])
    assert got == reference(RAW, NAMES, converters, ["t", "id"])
    assert list(got[0][1][0]) == ["t", "id"] and got[0][1][0] == {"t": "a", "id": 1}
    assert [text for text, _ in got] == ['["a",1]', "[null,2]", '["",3]']


def test_text_columns_are_not_touched_and_an_empty_chunk_is_empty():
    converters = [TypeMap().converter(oid) for oid in OIDS]
    assert {converters[1], converters[2], converters[10]} <= IDENTITY_FOR_TEXT
    assert chunk_rows([], NAMES, converters, [0]) == []


def test_a_timestamptz_column_converts_like_the_converter_for_every_form():
    from lapidus.workers.postgresql.chunkrows import _timestamptz_column
    from lapidus.workers.postgresql.types import to_timestamptz
    values = ["2026-01-01 00:00:00+00", "2026-01-01 00:00:00.123456+00", "infinity",
              "-infinity", "0044-03-15 12:00:00+00 BC", "10000-01-01 05:29:59+05:30",
              "2026-06-01 12:00:00-07", "1900-01-01 00:00:00+00:19:32", "12345-01-01 00:00:00+00",
              "2026-01-01 00:00:00 UTC", None]
    assert _timestamptz_column(values) == [None if v is None else to_timestamptz(v)
                                           for v in values]


def test_any_column_name_is_a_key_and_never_code_and_wide_tables_work():
    names = ["v1", "v0", "a'b\"c\\", "__import__('os').getcwd()", "x\ny", "ü €", "", "for",
             "{v0}"] + [f"c{i}" for i in range(300)]
    raw = [tuple(f"{r}.{i}" for i in range(len(names))) for r in range(3)]
    converters = [TypeMap().converter(25)] * len(names)
    got = chunk_rows(raw, names, converters, [2, 0])
    assert got == reference(raw, names, converters, ["a'b\"c\\", "v1"])
    assert list(got[0][1][1]) == names and got[1][1][1]["{v0}"] == "1.8"
    assert chunk_rows([("1",), ("2",)], ["id"], [int], [0]) == [
        ("[1]", ({"id": 1}, {"id": 1})), ("[2]", ({"id": 2}, {"id": 2}))]
    # a one-column key that is not an int: its text is pk_text's
    assert [t for t, _ in chunk_rows([("ü",), ('"',)], ["k"], [str], [0])] == ['["ü"]', '["\\""]']


# -- chunk lines: the same rows as finished JSON lines ------------------------------------------

class Log:
    def info(self, event, **fields):
        pass


def encoded_chunk(raw, names, converters, key_index, schema="public", table="t", sink=None,
                  backend="b"):
    """A chunk through PgSnapshot's encoded run (the worker loop's): held as lines, emitted
    at its high watermark as one ReadChunk; and the records the event path gives for the same
    rows."""
    from lapidus.events import ReadChunk, batch_fields
    from lapidus.sink_runs import run_label
    from lapidus.workers.postgresql.snapshot import PgSnapshot, _TableShape
    from lapidus.workers.snapshot.events import read_events
    from lapidus.workers.snapshot.progress import SnapshotProgress
    from lapidus.workers.snapshot.window import ChunkWindow

    progress = SnapshotProgress(3, [(schema, table)], sink=sink)
    snap = PgSnapshot(backend, {}, None, progress, Log(), encoded=True)
    shape = _TableShape(list(names), [0] * len(names),
                        [(names[i], "text") for i in key_index], list(converters))
    lines = snap._lines(shape, raw, schema, table)
    snap.window = ChunkWindow("w", schema, table, shape.key_names)
    snap.window.hold_keyed(lines, None)
    emitted = []
    snap.emit_window(emitted, "0/16B3F48", "2026-12-07T05:00:00.123Z")
    rows = chunk_rows(raw, names, converters, key_index)
    want = batch_fields(read_events(backend, run_label(3, sink), schema, table, rows,
                                    "0/16B3F48", "2026-12-07T05:00:00.123Z"))
    assert [text for text, _ in lines] == [text for text, _ in rows]   # the window's keys
    chunk, *after = emitted        # a run for one sink ends with its end event
    assert chunk.__class__ is ReadChunk and len(after) == (sink is not None)
    assert (chunk.type, chunk.schema, chunk.table, chunk.ts) == \
        ("read", schema, table, "2026-12-07T05:00:00.123Z")
    assert batch_fields([chunk]) == chunk.records
    return chunk.records, want


def test_lines_are_byte_for_byte_the_records_of_the_events_for_every_kind_of_value():
    converters = [TypeMap().converter(oid) for oid in OIDS]
    got, want = encoded_chunk(RAW, NAMES, converters, [0])
    assert got == want
    assert got[0][6].startswith(b'{"id":"b:read:3:public.t:[1]","type":"read"')
    got, want = encoded_chunk(RAW, NAMES, converters, [1, 0])        # composite, NULL in it
    assert got == want and got[1][4] == ("", "2")


def test_strings_that_need_escaping_odd_names_and_a_run_for_one_sink():
    names = ["k", "a'b\"c\\", "%s", "x\ny", "ü €", "", "{v0}"]
    raw = [('q"uote', "back\\slash", "%d%%", "tab\there", "ü €\u2028", "\x01", "{}"),
           ("plain", None, "", "new\nline", "é", "", "\x7f")]
    converters = [TypeMap().converter(25)] * len(names)
    got, want = encoded_chunk(raw, names, converters, [0], schema='s"c%', table="t\\%s",
                              sink="websocket", backend="b%d")
    assert got == want
    got, want = encoded_chunk(raw, names, converters, [2, 0])
    assert got == want


def test_an_int_key_and_null_integers_and_every_int_width():
    # int8, int2, int4, oid: PostgreSQL's text is the JSON number
    converters = [TypeMap().converter(oid) for oid in (20, 21, 23, 26)]
    raw = [("-9223372036854775808", "-32768", None, "4294967295"),
           ("9223372036854775807", None, "0", "0")]
    got, want = encoded_chunk(raw, ["id", "s", "i", "o"], converters, [0])
    assert got == want and got[0][4] == ("-9223372036854775808",)


def test_an_empty_chunk_emits_nothing_and_counts_no_row():
    from lapidus.workers.postgresql.snapshot import PgSnapshot
    from lapidus.workers.snapshot.progress import SnapshotProgress
    from lapidus.workers.snapshot.window import ChunkWindow
    snap = PgSnapshot("b", {}, None, SnapshotProgress(0, [("public", "t")]), Log(),
                      encoded=True)
    snap.window = ChunkWindow("w", "public", "t", ["id"])
    snap.window.hold_keyed([], None)
    events = []
    snap.emit_window(events, "0/1", None)
    assert events == [] and snap.progress.rows == 0 and snap.progress.done


def test_a_clean_string_column_is_left_for_the_template_to_quote():
    from lapidus.workers.postgresql.chunkrows import json_column
    from lapidus.workers.postgresql.types import to_text
    from lapidus.workers.snapshot.lines import AS_GIVEN, QUOTED
    clean = ("a", "b c", "é")
    assert json_column(clean, to_text) == (clean, QUOTED)
    assert json_column(("a", None), to_text) == (['"a"', "null"], AS_GIVEN)
    assert json_column(('a"', "b"), to_text) == (['"a\\""', '"b"'], AS_GIVEN)
    assert json_column(("t", "f"), TypeMap().converter(16)) == (["true", "false"], AS_GIVEN)


def test_numbers_and_booleans_are_cut_from_one_array_and_other_values_go_one_by_one():
    from decimal import Decimal

    from lapidus.events import encode_value
    from lapidus.workers.snapshot.lines import json_texts
    for column in ([1, None, -2, 2 ** 63], [True, None, False], [1.5, float("nan"), 1e300],
                   [Decimal("12345678901234567890.000000001"), None],
                   [[1, 2], None, {"a": "x,y"}], ["a", 1, None], [b"\x00,", "x"]):
        texts, place = json_texts(column)
        assert [place % t for t in texts] == [encode_value(v).decode() for v in column]
