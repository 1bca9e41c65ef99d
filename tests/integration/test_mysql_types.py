"""Integration: every MariaDB column type through MysqlSource, compared as whole events.

Values are checked two ways: against the literal JSON the contract promises (EVENTS.md,
docs/types-mysql.md), and, for temporal and DECIMAL columns, against the server's own text
(``CAST(col AS CHAR)``), an oracle independent of the binlog decoder.
"""

from __future__ import annotations

import json
import re

import pytest

from lapidus.events import encode

# The fixtures come in as a plugin, so test arguments do not shadow imported names.
pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import DATABASE, read_count  # noqa: E402

pytestmark = pytest.mark.integration

TABLE = """CREATE TABLE types (
  id INT PRIMARY KEY,
  t_tiny TINYINT, t_tiny_u TINYINT UNSIGNED, t_small SMALLINT, t_small_u SMALLINT UNSIGNED,
  t_medium MEDIUMINT, t_medium_u MEDIUMINT UNSIGNED, t_int INT, t_int_u INT UNSIGNED,
  t_big BIGINT, t_big_u BIGINT UNSIGNED,
  t_dec DECIMAL(65,30), t_dec2 DECIMAL(10,2), t_float FLOAT, t_double DOUBLE,
  t_bit1 BIT(1), t_bit64 BIT(64),
  t_date DATE, t_time TIME(6), t_time0 TIME, t_datetime DATETIME(6), t_datetime0 DATETIME,
  t_ts TIMESTAMP(6) NULL, t_year YEAR,
  t_char CHAR(10), t_varchar VARCHAR(100), t_text TEXT,
  t_binary BINARY(4), t_varbinary VARBINARY(10), t_blob BLOB,
  t_enum ENUM('small','medium','large'), t_set SET('a','b','c','d'),
  t_json JSON, t_geom GEOMETRY)"""

COLUMNS = ("id t_tiny t_tiny_u t_small t_small_u t_medium t_medium_u t_int t_int_u t_big t_big_u "
           "t_dec t_dec2 t_float t_double t_bit1 t_bit64 t_date t_time t_time0 t_datetime "
           "t_datetime0 t_ts t_year t_char t_varchar t_text t_binary t_varbinary t_blob t_enum "
           "t_set t_json t_geom").split()

MIN_ROW = """INSERT INTO types VALUES (1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0,
 -9223372036854775808, 0,
 '-99999999999999999999999999999999999.999999999999999999999999999999', '-12345678.90',
 -0.1, -1.7976931348623157e308, 0, 0,
 '1000-01-01', '-838:59:59.000000', '-838:59:59', '1000-01-01 00:00:00.000000',
 '1000-01-01 00:00:00', '1970-01-01 00:00:01.000000', 1901,
 'a', '', '', 'a', '', '', 'small', '', '[]', ST_GeomFromText('POINT(0 0)'))"""

MAX_ROW = """INSERT INTO types VALUES (2, 127, 255, 32767, 65535, 8388607, 16777215,
 2147483647, 4294967295, 9223372036854775807, 18446744073709551615,
 '99999999999999999999999999999999999.999999999999999999999999999999', '99999999.99',
 1.1, 2.2250738585072014e-308, 1, 18446744073709551615,
 '9999-12-31', '838:59:59.000000', '838:59:59', '9999-12-31 23:59:59.999999',
 '9999-12-31 23:59:59', '2038-01-19 03:14:07.999999', 2155,
 'héllo 😀', 'emoji 😀 ü', 'line1\\nline2 😀', 0x00010203, 0xff00, 0x00ff, 'large', 'd,a,c',
 '{"n": 12345678901234567890.000000001, "i": 18446744073709551616, "f": 1.5e300, "s": "😀",
   "a": [true, false, null, {"k": "v"}], "z": 0.10}',
 ST_GeomFromText('POLYGON((0 0, 10 0, 10 10, 0 10, 0 0), (1 1, 2 1, 2 2, 1 1))', 4326))"""

NULL_ROW = "INSERT INTO types (id) VALUES (3)"

ZERO_ROW = """INSERT INTO types (id, t_date, t_datetime, t_datetime0, t_ts, t_year, t_time, t_set,
 t_dec2, t_float, t_double, t_char, t_binary, t_geom) VALUES (4, '0000-00-00',
 '0000-00-00 00:00:00', '2026-00-15 10:00:00', '0000-00-00 00:00:00', 0, '-00:00:00.000001',
 'b', 0, 1e-45, 0.1, 'trail  ', 0x61000000,
 ST_GeomFromText('GEOMETRYCOLLECTION(POINT(1 2), LINESTRING(0 0, 1.5 -2.25),
   MULTIPOINT(1 1, 2 2), MULTIPOLYGON(((0 0, 1 0, 1 1, 0 0))))'))"""

# The items as JSON text decoded with floats kept as their literal text, so exact digits count.
EXPECTED = {
    1: {"id": 1, "t_tiny": -128, "t_tiny_u": 0, "t_small": -32768, "t_small_u": 0,
        "t_medium": -8388608, "t_medium_u": 0, "t_int": -2147483648, "t_int_u": 0,
        "t_big": -9223372036854775808, "t_big_u": 0,
        "t_dec": "-99999999999999999999999999999999999.999999999999999999999999999999",
        "t_dec2": "-12345678.90", "t_float": "-0.1", "t_double": "-1.7976931348623157e+308",
        "t_bit1": 0, "t_bit64": 0, "t_date": "1000-01-01", "t_time": "-838:59:59.000000",
        "t_time0": "-838:59:59", "t_datetime": "1000-01-01T00:00:00.000000",
        "t_datetime0": "1000-01-01T00:00:00", "t_ts": "1970-01-01T00:00:01.000000Z",
        "t_year": 1901, "t_char": "a", "t_varchar": "", "t_text": "", "t_binary": "YQAAAA==",
        "t_varbinary": "", "t_blob": "", "t_enum": "small", "t_set": [], "t_json": [],
        "t_geom": "POINT(0 0)"},
    2: {"id": 2, "t_tiny": 127, "t_tiny_u": 255, "t_small": 32767, "t_small_u": 65535,
        "t_medium": 8388607, "t_medium_u": 16777215, "t_int": 2147483647,
        "t_int_u": 4294967295, "t_big": 9223372036854775807,
        "t_big_u": 18446744073709551615,
        "t_dec": "99999999999999999999999999999999999.999999999999999999999999999999",
        "t_dec2": "99999999.99", "t_float": "1.1", "t_double": "2.2250738585072014e-308",
        "t_bit1": 1, "t_bit64": 18446744073709551615, "t_date": "9999-12-31",
        "t_time": "838:59:59.000000", "t_time0": "838:59:59",
        "t_datetime": "9999-12-31T23:59:59.999999", "t_datetime0": "9999-12-31T23:59:59",
        "t_ts": "2038-01-19T03:14:07.999999Z", "t_year": 2155, "t_char": "héllo 😀",
        "t_varchar": "emoji 😀 ü", "t_text": "line1\nline2 😀", "t_binary": "AAECAw==",
        "t_varbinary": "/wA=", "t_blob": "AP8=", "t_enum": "large", "t_set": ["a", "c", "d"],
        "t_json": {"n": "12345678901234567890.000000001", "i": 18446744073709551616,
                   "f": "1.5E+300", "s": "😀", "a": [True, False, None, {"k": "v"}],
                   "z": "0.10"},
        "t_geom": "SRID=4326;POLYGON((0 0,10 0,10 10,0 10,0 0),(1 1,2 1,2 2,1 1))"},
    3: dict({c: None for c in COLUMNS}, id=3),
    4: dict({c: None for c in COLUMNS}, id=4, t_date="0000-00-00",
            t_datetime="0000-00-00T00:00:00.000000", t_datetime0="2026-00-15T10:00:00",
            t_ts="0000-00-00T00:00:00.000000Z", t_year=0, t_time="-00:00:00.000001",
            t_set=["b"], t_dec2="0.00", t_float="1.4013e-45", t_double="0.1", t_char="trail",
            t_binary="YQAAAA==",
            t_geom="GEOMETRYCOLLECTION(POINT(1 2),LINESTRING(0 0,1.5 -2.25),"
                   "MULTIPOINT(1 1,2 2),MULTIPOLYGON(((0 0,1 0,1 1,0 0))))"),
}


def as_json(event) -> dict:
    return json.loads(encode(event), parse_float=str)


@pytest.fixture
def typed(sql, open_source):
    sql.run(TABLE, "SET time_zone = '+00:00'")
    source = open_source()
    gtids = {}
    for row_id, statement in ((1, MIN_ROW), (2, MAX_ROW), (3, NULL_ROW), (4, ZERO_ROW)):
        sql.run(statement)
        gtids[row_id] = sql.value("SELECT @@last_gtid")
    events, _ = read_count(source, 4)
    return events, gtids


def test_each_type_as_a_whole_event(typed):
    events, gtids = typed
    assert len(events) == 4
    for event in events:
        row_id = event.pk["id"]
        gtid = gtids[row_id]
        doc = as_json(event)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc.pop("ts"))
        assert doc == {"id": f"crm:{gtid}:0", "type": "insert", "backend": "crm",
                       "schema": DATABASE, "table": "types", "pk": {"id": row_id},
                       "item": EXPECTED[row_id], "before": None, "position": gtid,
                       "txid": gtid}, f"row {row_id}"


def test_temporal_and_decimal_text_equals_the_servers_own_text(typed, sql):
    events, _ = typed
    by_id = {e.pk["id"]: e.item for e in events}
    columns = ("t_dec", "t_dec2", "t_date", "t_time", "t_time0", "t_datetime", "t_datetime0",
               "t_ts")
    casts = ", ".join(f"CAST({c} AS CHAR)" for c in columns)
    for row in sql.rows(f"SELECT id, {casts} FROM types ORDER BY id"):
        for column, server_text in zip(columns, row[1:]):
            ours = by_id[row[0]][column]
            if server_text is None:
                assert ours is None
                continue
            ours = ours.replace("T", " ").rstrip("Z")
            assert ours == server_text, f"row {row[0]} {column}"


def test_json_numbers_keep_their_digits_on_the_wire(typed):
    events, _ = typed
    wire = encode(next(e for e in events if e.pk["id"] == 2))
    assert b'"n":12345678901234567890.000000001' in wire
    assert b'"i":18446744073709551616' in wire and b'"z":0.10' in wire
    assert b"b'" not in wire


def test_update_and_delete_carry_before_with_mapped_values(sql, open_source):
    sql.run(TABLE)
    sql.run(MAX_ROW)
    source = open_source()
    sql.run("UPDATE types SET t_set = 'b', t_time = '-00:00:01.5' WHERE id = 2")
    update_gtid = sql.value("SELECT @@last_gtid")
    sql.run("DELETE FROM types WHERE id = 2")
    events, _ = read_count(source, 2)
    update, delete = (as_json(e) for e in events)
    assert update["type"] == "update" and update["id"] == f"crm:{update_gtid}:0"
    assert update["before"] == EXPECTED[2]
    assert update["item"] == dict(EXPECTED[2], t_set=["b"], t_time="-00:00:01.500000")
    assert update["pk"] == {"id": 2}
    assert delete["type"] == "delete" and delete["item"] is None
    assert delete["before"] == update["item"] and delete["pk"] == {"id": 2}
