"""MySQL/MariaDB types mapped to PostgreSQL and back, the pieces of MySQL statements the sync
sink reads, and values converted for a MySQL target (no database; against real servers:
tests/integration/test_sync_mysql.py and test_sync_into_mysql.py)."""

from __future__ import annotations

import pytest

from lapidus.events import Record
from lapidus.sinks.sync.mysql_apply import MysqlApplier, convert
from lapidus.sinks.sync.mysql_ddl import split_top, unquote
from lapidus.sinks.sync.mysql_target import connect_args
from lapidus.sinks.sync.mysql_types import mysql_type, pg_type
from lapidus.sinks.sync.tables import Column


@pytest.mark.parametrize("mysql, pg", [
    ("INT", "integer"), ("int(11) unsigned", "bigint"), ("BIGINT UNSIGNED", "numeric(20,0)"),
    ("tinyint(1)", "smallint"), ("smallint unsigned zerofill", "integer"),
    ("DECIMAL(30,9)", "numeric(30,9)"), ("decimal", "numeric(10,0)"),
    ("NUMERIC(5)", "numeric(5,0)"),
    ("DOUBLE", "double precision"), ("double precision", "double precision"), ("FLOAT", "real"),
    ("DATETIME(6)", "timestamp(6) without time zone"),
    ("datetime", "timestamp(0) without time zone"),
    ("TIMESTAMP(3) NULL DEFAULT NULL", "timestamp(3) with time zone"), ("TIME(2)", "interval"),
    ("DATE NOT NULL", "date"), ("YEAR", "smallint"), ("BIT(8)", "numeric(20,0)"),
    ("VARCHAR(40) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL", "text"),
    ("char(3)", "text"), ("LONGTEXT", "text"), ("BLOB", "bytea"), ("varbinary(16)", "bytea"),
    ("JSON", "jsonb"), ("ENUM('a','b,c')", "text"), ("SET('x','y')", "text[]"),
    ("POINT", "text"), ("INET6", "inet"), ("UUID", "uuid"),
])
def test_mysql_types_map_to_postgresql_types_that_hold_every_value(mysql, pg):
    assert pg_type(mysql) == pg


def test_a_type_without_a_mapping_is_none():
    assert pg_type("VECTOR(3)") is None
    assert pg_type("DECIMAL(x)") is None


def test_clauses_are_cut_outside_parentheses_and_quotes():
    assert split_top("ADD COLUMN p DECIMAL(10,2) DEFAULT '1,5', DROP COLUMN `a,b`, "
                     "ADD e ENUM('x', 'y')") == \
        ["ADD COLUMN p DECIMAL(10,2) DEFAULT '1,5'", "DROP COLUMN `a,b`", "ADD e ENUM('x', 'y')"]
    assert unquote("`we``ird`") == "we`ird" and unquote("plain") == "plain"


@pytest.mark.parametrize("pg, key, mysql", [
    ("integer", False, "INT"), ("bigint", False, "BIGINT"),
    ("numeric(30,9)", False, "DECIMAL(30,9)"),
    ("numeric(70,2)", False, "LONGTEXT"), ("numeric", False, "LONGTEXT"),
    ("numeric(20,0)", True, "DECIMAL(20,0)"), ("text", False, "LONGTEXT"),
    ("text", True, "VARCHAR(255)"),
    ("character varying(40)", False, "VARCHAR(40)"), ("bytea", False, "LONGBLOB"),
    ("bytea", True, "VARBINARY(255)"), ("jsonb", False, "JSON"), ("text[]", False, "JSON"),
    ("timestamp(3) with time zone", False, "DATETIME(3)"), ("timestamp without time zone", False,
                                                            "DATETIME(6)"),
    ("time without time zone", False, "TIME(6)"), ("boolean", False, "BOOLEAN"),
    ("double precision", False, "DOUBLE"), ("uuid", False, "CHAR(36)"),
    ("interval", False, "LONGTEXT"),
])
def test_postgresql_types_map_to_mysql_types_that_hold_every_value(pg, key, mysql):
    assert mysql_type(pg, key=key) == mysql


def test_values_are_converted_by_the_mysql_column_type_and_stay_exact():
    event = MysqlApplier.decode(Record("x", "insert", "s", "t", None, "0/1", (
        b'{"item": {"n": 12345678901234567890.000000001, "f": 0.1, '
        b'"j": {"a": [1, 2.50, null], "s": "\\u00e9"},'
        b' "b": "AP8=", "ts": "2026-12-01T10:00:00.5+02:00", "z": "2026-12-01T08:00:00Z",'
        b' "set": ["a", "c"], "ok": true, "arr": [1, 2]}}')))["item"]
    def col(kind):
        return Column("c", "", kind)
    assert str(convert(col("plain"), event["n"])) == "12345678901234567890.000000001"
    assert str(convert(col("plain"), event["f"])) == "0.1"
    assert convert(col("json"), event["j"]) == '{"a":[1,2.50,null],"s":"\u00e9"}'
    assert convert(col("json"), "text") == '"text"'
    assert convert(col("binary"), event["b"]) == b"\x00\xff"
    assert convert(col("datetime"), event["ts"]) == "2026-12-01 08:00:00.500000"
    assert convert(col("datetime"), event["z"]) == "2026-12-01 08:00:00"
    assert convert(col("datetime"), "0000-00-00T00:00:00") == "0000-00-00T00:00:00"   # kept
    assert convert(col("set"), event["set"]) == "a,c"
    assert convert(col("plain"), event["ok"]) == 1
    assert convert(col("plain"), event["arr"]) == "[1,2]"
    assert convert(col("plain"), None) is None


def test_a_mysql_dsn():
    args = connect_args("mysql://sync%40x:p%3Ass@replica:3307/copy", 4)
    assert (args["host"], args["port"], args["user"], args["password"], args["database"]) == \
        ("replica", 3307, "sync@x", "p:ss", "copy")
    assert "STRICT_ALL_TABLES" in args["init_command"] and "+00:00" in args["init_command"]


def test_events_are_decoded_with_exact_numbers_fast_or_not():
    def decoded(data):
        return MysqlApplier.decode(Record("x", "insert", "s", "t", None, "0/1", data))
    fast = decoded(b'{"item": {"id": 18446744073709551615, "doc": {"a": [1, "x"]}}}')
    assert fast["item"]["id"] == 18446744073709551615
    exact = decoded(b'{"item": {"id": 1, "doc": {"n": 12345678901234567890.000000001}}}')
    assert str(exact["item"]["doc"]["n"]) == "12345678901234567890.000000001"
    huge = decoded(b'{"item": {"id": 123456789012345678901234567890}}')
    assert huge["item"]["id"] == 123456789012345678901234567890
