"""MySQL/MariaDB types mapped to PostgreSQL and the pieces of MySQL statements the sync sink
reads (no database; applying them to a real target: tests/integration/test_sync_mysql.py)."""

from __future__ import annotations

import pytest

from lapidus.sinks.sync.mysql_ddl import split_top, unquote
from lapidus.sinks.sync.mysql_types import pg_type


@pytest.mark.parametrize("mysql, pg", [
    ("INT", "integer"), ("int(11) unsigned", "bigint"), ("BIGINT UNSIGNED", "numeric(20,0)"),
    ("tinyint(1)", "smallint"), ("smallint unsigned zerofill", "integer"),
    ("DECIMAL(30,9)", "numeric(30,9)"), ("decimal", "numeric(10,0)"), ("NUMERIC(5)", "numeric(5,0)"),
    ("DOUBLE", "double precision"), ("double precision", "double precision"), ("FLOAT", "real"),
    ("DATETIME(6)", "timestamp(6) without time zone"), ("datetime", "timestamp(0) without time zone"),
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
