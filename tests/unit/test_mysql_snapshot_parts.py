"""The pure parts of MariaDB snapshots: where-condition screening, binlog coordinate order,
SELECT value converters (lapidus/workers/mysql/snapshot.py, selected.py)."""

from __future__ import annotations

import pytest

from lapidus.workers.mysql.selected import (
    Column, RowMapper, _set_members, converter, json_expression, json_safe, select_expression,
)
from lapidus.workers.mysql.snapshot import binlog_order, where_problem


@pytest.mark.parametrize("where", [
    "id > 5", "name = 'a)b' OR (x IN (1, 2))", "note = 'it''s -- not a comment'",
    "`we;ird` = \"#1\"", "v LIKE '50%'", "s = 'back\\\\' AND t = 1",
])
def test_conditions_that_stay_inside_their_parentheses_pass(where):
    assert where_problem(where) is None


@pytest.mark.parametrize("where, problem", [
    ("1 = 1) OR (1 = 1", "closes a parenthesis"),
    ("id > 0 -- rest", "comment"), ("id > 0 # rest", "comment"), ("id /* x */ > 0", "comment"),
    ("id > 0; DROP TABLE t", "';'"), ("name = 'open", "quote"), ("(id > 0", "not closed"),
])
def test_conditions_that_could_leave_them_are_named(where, problem):
    assert problem in where_problem(where)


def test_binlog_coordinates_order_by_file_number_then_offset():
    assert binlog_order("mariadb-bin.000009", 900) < binlog_order("mariadb-bin.000010", 4)
    assert binlog_order("mariadb-bin.000010", 4) < binlog_order("mariadb-bin.000010", 5)
    assert binlog_order("b.999999", 1) < binlog_order("b.1000000", 1)   # past six digits


def test_set_members_are_parsed_with_quotes_and_commas():
    assert _set_members("set('a','b''c','d,e')") == ["a", "b'c", "d,e"]
    assert converter(Column("s", "set", "set('a','b','c')"))("c,a") == ["a", "c"]
    assert converter(Column("s", "set", "set('a','b','c')"))("") == []


def test_text_protocol_values_become_the_binlog_forms():
    assert converter(Column("d", "datetime", "datetime(6)"))("2026-01-02 03:04:05.000001") \
        == "2026-01-02T03:04:05.000001"
    assert converter(Column("t", "timestamp", "timestamp"))("0000-00-00 00:00:00") \
        == "0000-00-00T00:00:00Z"
    assert converter(Column("f", "float", "float"))("1.100000023841858") == 1.1
    assert converter(Column("b", "bit", "bit(64)"))(b"\xff" * 8) == 2 ** 64 - 1
    assert converter(Column("y", "year", "year(4)"))("0000") == 0
    assert converter(Column("x", "binary", "binary(2)"))(b"a\x00") == "YQA="
    assert converter(Column("j", "longtext", "longtext", json=True))('{"n": 1.50}')["n"] \
        .as_tuple().exponent == -2
    for kind in ("int", "bigint", "decimal", "varchar", "date", "time", "enum"):
        assert converter(Column("c", kind, kind)) is None


def test_json_aggregation_only_for_types_whose_json_form_is_exact():
    assert all(json_safe(Column("c", k, k)) for k in ("int", "decimal", "varchar", "datetime",
                                                        "text", "set"))
    assert not any(json_safe(Column("c", k, k)) for k in ("float", "double", "bit", "blob",
                                                           "varbinary", "geometry"))
    assert json_expression(Column("n", "int", "int"), "`n`") == "`n`"
    assert json_expression(Column("j", "longtext", "longtext", json=True), "`j`") \
        == "CAST(`j` AS CHAR)"
    assert json_expression(Column("d", "decimal", "decimal(5,2)"), "`d`") == "CAST(`d` AS CHAR)"
    assert select_expression(Column("f", "float", "float"), "`f`") == "CAST(`f` AS DOUBLE)"


def test_rows_map_key_and_item_for_single_and_composite_keys():
    columns = [Column("a", "int", "int"), Column("b", "varchar", "varchar(5)"),
               Column("t", "datetime", "datetime")]
    single = RowMapper(columns, ["a"]).rows([(1, "x", "2026-01-01 00:00:00")])
    assert single == [({"a": 1}, {"a": 1, "b": "x", "t": "2026-01-01T00:00:00"})]
    pair = RowMapper(columns, ["b", "a"]).rows([[2, "y", None]])
    assert pair == [({"b": "y", "a": 2}, {"a": 2, "b": "y", "t": None})]


def test_a_server_without_json_arrayagg_order_by_is_read_row_by_row():
    import pymysql

    from lapidus.workers.mysql.snapshot import MysqlSnapshot, _Shape

    class Cursor:
        def __init__(self):
            self.statements = []

        def execute(self, sql, args=None):
            self.statements.append(sql)
            if "JSON_ARRAYAGG" in sql:
                raise pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax")

        def fetchall(self):
            return [(1, "a")]

    shape = _Shape([Column("id", "int", "int"), Column("v", "varchar", "varchar(5)")], ["id"])
    assert shape.json_list is not None
    cur = Cursor()
    sql = "SET STATEMENT max_statement_time=30 FOR SELECT `id`, `v` FROM `d`.`t` ORDER BY `id`"
    rows = MysqlSnapshot._select(None, cur, shape, sql, ())
    assert rows == [(1, "a")] and shape.json_list is None       # and so for the next chunks
    assert cur.statements[-1] == sql


def test_the_tuple_key_window_evicts_changed_keys_and_keeps_the_others():
    from lapidus.workers.mysql.snapshot import _TupleKeyWindow
    window = _TupleKeyWindow("m", "d", "t", ["b", "a"])
    window.hold([({"b": "x", "a": i}, {"a": i, "b": "x"}) for i in range(4)], ["x", 3])
    window.saw("d", "t", "update", {"b": "x", "a": 9}, {"a": 1, "b": "x", "v": 0})   # key moved
    window.saw("d", "t", "delete", {"b": "x", "a": 2}, None)
    window.saw("d", "other", "delete", {"b": "x", "a": 0}, None)                    # other table
    assert [pk["a"] for pk, _ in window.remaining()] == [0, 3] and window.evicted == 2
    window.saw("d", "t", "truncate", None, None)
    assert window.remaining() == []


def test_the_tuple_key_window_emits_the_same_ids_as_every_other_window():
    from lapidus.workers.mysql.snapshot import _TupleKeyWindow
    from lapidus.workers.snapshot.events import read_events
    window = _TupleKeyWindow("m", "d", "t", ["b", "a"])
    window.hold([({"b": "x", "a": 1}, {"a": 1, "b": "x"})], ["x", 1])
    [event] = read_events("crm", 2, "d", "t", window.remaining_keyed(), "0-1-9", None)
    assert event.id == 'crm:read:2:d.t:["x",1]' and event.pk == {"b": "x", "a": 1}
