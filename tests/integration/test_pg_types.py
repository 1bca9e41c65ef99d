"""One type suite for both PostgreSQL decoders, through the real ``lapidus`` process.

A table with a column of each interesting PostgreSQL type gets rows at the types' limits and
special values, then an update that leaves a 1 MB TOASTed text unchanged.  The expected event
JSON is written once, below, as JSON text; each decoder must produce exactly it.  JSON numbers
are compared by their text (``1.50`` is not ``1.5``), integers by value (exact at any size).

Known, documented differences are listed in WAL2JSON_DIFFERENCES with the reason: wal2json 2.5
writes NaN and infinities of ``real``, ``double precision`` and ``numeric`` columns as JSON
``null`` (docs/types-postgresql.md, "Decoder notes").  pgoutput has no differences.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import pg_backend

SCHEMA = [
    "CREATE TYPE mood AS ENUM ('happy', 'sad')",
    "CREATE DOMAIN positive_numeric AS numeric CHECK (VALUE > 0)",
    """CREATE TABLE types (
        id int PRIMARY KEY,
        i2 smallint, i4 integer, i8 bigint,
        num numeric, num_big numeric, num_scale numeric(10,2),
        r real, d double precision,
        by bytea, by_empty bytea, by_nl bytea,
        t text, vc varchar(20), ch char(5), b boolean,
        dt date, tm time, ttz timetz, ts timestamp, tstz timestamptz, iv interval,
        u uuid, j json, jb jsonb,
        ai int[], at text[], an numeric[], a2 int[],
        e mood, dom positive_numeric, m money, ip inet,
        big text)""",
    # uncompressed out-of-line storage: the 1 MB value is TOASTed as it is
    "ALTER TABLE types ALTER COLUMN big SET STORAGE EXTERNAL",
]

COLUMNS = ("id, i2, i4, i8, num, num_big, num_scale, r, d, by, by_empty, by_nl, t, vc, ch, b, "
           "dt, tm, ttz, ts, tstz, iv, u, j, jb, ai, at, an, a2, e, dom, m, ip, big")

BIG = "lapidus " * (1 << 17)       # 1 MiB

ROWS = [
    # 1: limits and ordinary values of every type
    ("1", "32767", "2147483647", "9223372036854775807",
     "12345678901234567890.000000001", "1" + "0" * 60 + ".5", "12345678.90",
     "3.4028235e+38", "1.7976931348623157e+308",
     "\\x00ff0a", "", "\\x0a",
     'line1\nline2\ttab "quoted" \\ back ünïcödé 🦀', "hello", "ab", "true",
     "2026-11-30", "11:33:35.295384", "11:33:35.295384-08", "2026-11-30 11:33:35.295384",
     "2026-11-30 11:33:35.295384+05:30", "1 year 2 mons 3 days 04:05:06.789",
     "0fe79cee-d852-422f-a8db-703b11434d98",
     '{"b": 12345678901234567890123, "a": 1.50, "n": null, "s": "x\\ny", "arr": [1, true]}',
     '{"big": 123456789012345678901234567890.123456789, "nested": {"list": [1, "two", null]}}',
     "{1,NULL,3}", '{"a b","c,d",NULL,"NULL","line\nbreak"}',
     "{1.50,NaN,12345678901234567890.1}", "{{1,2},{3,4}}",
     "happy", "1.50", "12.34", "192.168.0.1/24", BIG),
    # 2: lower limits; NaN
    ("2", "-32768", "-2147483648", "-9223372036854775808", "NaN", "-0.000001", "-99999999.99",
     "NaN", "NaN", None, None, None, "", "", "", "false",
     "infinity", "00:00:00", "00:00:00+00", "-infinity", "infinity", "-00:00:01",
     None, "[]", "{}", "{}", "{}", "{Infinity,-Infinity}", None,
     "sad", "NaN", "-0.01", "::1", None),
    # 3: Infinity
    ("3", None, None, None, "Infinity", None, None, "Infinity", "Infinity") + (None,) * 25,
    # 4: -Infinity
    ("4", None, None, None, "-Infinity", None, None, "-Infinity", "-Infinity") + (None,) * 25,
    # 5: NULL everywhere
    ("5",) + (None,) * 33,
]

# The expected items, written once.  "big" of row 1 is BIG (set below, not spelt out).
EXPECTED_ITEMS = {
    1: """{
  "id": 1, "i2": 32767, "i4": 2147483647, "i8": 9223372036854775807,
  "num": "12345678901234567890.000000001",
  "num_big": "1000000000000000000000000000000000000000000000000000000000000.5",
  "num_scale": "12345678.90",
  "r": 3.4028235e+38, "d": 1.7976931348623157e+308,
  "by": "AP8K", "by_empty": "", "by_nl": "Cg==",
  "t": "line1\\nline2\\ttab \\"quoted\\" \\\\ back ünïcödé 🦀", "vc": "hello", "ch": "ab   ",
  "b": true,
  "dt": "2026-11-30", "tm": "11:33:35.295384", "ttz": "11:33:35.295384-08",
  "ts": "2026-11-30T11:33:35.295384", "tstz": "2026-11-30T06:03:35.295384Z",
  "iv": "1 year 2 mons 3 days 04:05:06.789",
  "u": "0fe79cee-d852-422f-a8db-703b11434d98",
  "j": {"b": 12345678901234567890123, "a": 1.50, "n": null, "s": "x\\ny", "arr": [1, true]},
  "jb": {"big": 123456789012345678901234567890.123456789, "nested": {"list": [1, "two", null]}},
  "ai": [1, null, 3], "at": ["a b", "c,d", null, "NULL", "line\\nbreak"],
  "an": ["1.50", "NaN", "12345678901234567890.1"], "a2": [[1, 2], [3, 4]],
  "e": "happy", "dom": "1.50", "m": "$12.34", "ip": "192.168.0.1/24", "big": null
}""",
    2: """{
  "id": 2, "i2": -32768, "i4": -2147483648, "i8": -9223372036854775808,
  "num": "NaN", "num_big": "-0.000001", "num_scale": "-99999999.99",
  "r": "NaN", "d": "NaN",
  "by": null, "by_empty": null, "by_nl": null,
  "t": "", "vc": "", "ch": "     ", "b": false,
  "dt": "infinity", "tm": "00:00:00", "ttz": "00:00:00+00", "ts": "-infinity",
  "tstz": "infinity", "iv": "-00:00:01",
  "u": null, "j": [], "jb": {}, "ai": [], "at": [], "an": ["Infinity", "-Infinity"], "a2": null,
  "e": "sad", "dom": "NaN", "m": "-$0.01", "ip": "::1", "big": null
}""",
    3: """{"num": "Infinity", "r": "Infinity", "d": "Infinity"}""",
    4: """{"num": "-Infinity", "r": "-Infinity", "d": "-Infinity"}""",
    5: "{}",
}

WAL2JSON_NAN_REASON = ("wal2json 2.5 writes NaN and infinities of real, double precision and "
                       "numeric as JSON null (no option to send them as strings)")
# (row id, column) -> (what arrives through wal2json instead, why)
WAL2JSON_DIFFERENCES = {
    (row, column): (None, WAL2JSON_NAN_REASON)
    for row, columns in {2: ("num", "r", "d"), 3: ("num", "r", "d"),
                         4: ("num", "r", "d")}.items()
    for column in columns
}
PGOUTPUT_DIFFERENCES: dict = {}


class Number(str):
    """A JSON number kept as its text: equal only to a Number with the same digits."""

    def __eq__(self, other):
        return isinstance(other, Number) and str.__eq__(self, other)

    def __ne__(self, other):
        return not self == other

    __hash__ = str.__hash__

    def __repr__(self):
        return f"Number({str(self)})"


def exact_json(text):
    return json.loads(text, parse_float=Number)


def expected_item(row: int, differences: dict) -> dict:
    """Every column, NULL unless the row's expectation says otherwise, differences applied."""
    names = [c.strip() for c in COLUMNS.split(",")]
    item = {name: None for name in names}
    item["id"] = row
    item.update(exact_json(EXPECTED_ITEMS[row]))
    if row == 1:
        item["big"] = BIG
    for (diff_row, column), (value, _reason) in differences.items():
        if diff_row == row:
            item[column] = value
    return item


def stdout_events(proc) -> list:
    if not proc.stdout_path.exists():
        return []
    return [exact_json(line) for line in proc.stdout_path.read_bytes().splitlines() if line]


def wait_stdout_events(proc, count: int, timeout: float = 60.0) -> list:
    from tests.conftest import wait_until
    return wait_until(lambda: (lambda ev: ev if len(ev) >= count else None)(stdout_events(proc)),
                      timeout, message=f"{count} events; log:\n{proc.log()[-3000:]}")


@pytest.mark.parametrize("decoder, differences", [
    ("pgoutput", PGOUTPUT_DIFFERENCES),
    ("wal2json", WAL2JSON_DIFFERENCES),
])
def test_every_type_arrives_as_documented(decoder, differences, lapidus_factory, pg_db):
    pg_db.sql(*SCHEMA)
    proc = lapidus_factory({"backends": [pg_backend(pg_db, decoder=decoder)],
                            "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"')
    placeholders = ", ".join(["%s"] * len(ROWS[0]))
    with pg_db.conn.cursor() as cur:
        for row in ROWS:
            cur.execute(f"INSERT INTO types ({COLUMNS}) VALUES ({placeholders})", row)
        # the TOASTed value is not rewritten, so it is not in the WAL
        cur.execute("UPDATE types SET i4 = 0 WHERE id = 1")
    events = wait_stdout_events(proc, len(ROWS) + 1)
    assert len(events) == len(ROWS) + 1
    assert f'"plugin": "{decoder}"' in proc.log()

    for event in events[:len(ROWS)]:
        row = event["pk"]["id"]
        assert event["type"] == "insert"
        want = expected_item(row, differences)
        assert event["item"].keys() == want.keys()
        wrong = {column: (event["item"][column], want[column]) for column in want
                 if event["item"][column] != want[column]
                 or type(event["item"][column]) is not type(want[column])}
        assert not wrong, f"row {row}: (got, expected) {wrong}"

    update = events[-1]
    assert update["type"] == "update"
    assert update["unchanged"] == ["big"]
    want = expected_item(1, differences)
    del want["big"]
    want["i4"] = 0
    assert update["item"] == want
    assert update["before"] == {"id": 1}


def test_wal2json_differences_are_only_the_documented_nan_and_infinity_limit():
    """Every difference has a reason, and is a NaN/infinity of real, double or numeric."""
    special = {"NaN", "Infinity", "-Infinity"}
    for (row, column), (value, reason) in WAL2JSON_DIFFERENCES.items():
        assert reason == WAL2JSON_NAN_REASON
        assert value is None
        assert column in ("num", "r", "d")
        assert exact_json(EXPECTED_ITEMS[row])[column] in special
    assert PGOUTPUT_DIFFERENCES == {}
