"""Integration: MysqlSource streaming behaviour against the real MariaDB.

DDL events, ALTER TABLE in the middle of the stream, table filters, read() timing, a dropped
connection, partial row images.  The Source is driven directly (open/read/close), no worker.
"""

from __future__ import annotations

import time

import pytest

from lapidus.workers.base import BackendError

# The fixtures come in as a plugin, so test arguments do not shadow imported names.
pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import (  # noqa: E402
    DATABASE, read_count, read_to_marker, read_until, without_marker,
)

pytestmark = pytest.mark.integration


def test_insert_update_delete_whole_events(sql, open_source):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20), price DECIMAL(6,2))")
    source = open_source()
    sql.run("INSERT INTO items VALUES (2, 'a', 1.50)")
    g1 = sql.value("SELECT @@last_gtid")
    sql.run("UPDATE items SET name = 'b', price = 2.00 WHERE id = 2")
    g2 = sql.value("SELECT @@last_gtid")
    sql.run("DELETE FROM items WHERE id = 2")
    g3 = sql.value("SELECT @@last_gtid")
    events, checkpoint = read_count(source, 3)
    common = {"backend": "crm", "schema": DATABASE, "table": "items", "pk": {"id": 2}}
    got = [{k: v for k, v in e.to_dict().items() if k != "ts"} for e in events]
    assert got == [
        dict(common, id=f"crm:{g1}:0", type="insert", item={"id": 2, "name": "a", "price": "1.50"},
             before=None, position=g1, txid=g1),
        dict(common, id=f"crm:{g2}:0", type="update", item={"id": 2, "name": "b", "price": "2.00"},
             before={"id": 2, "name": "a", "price": "1.50"}, position=g2, txid=g2),
        dict(common, id=f"crm:{g3}:0", type="delete", item=None,
             before={"id": 2, "name": "b", "price": "2.00"}, position=g3, txid=g3),
    ]
    assert checkpoint["gtid"].split(",")[0].startswith("0-") and "tx" not in checkpoint
    status = source.status()
    assert status["read_position"] == checkpoint["gtid"] and status["flavor"] == "mariadb"
    assert not set(status) & {"position", "events", "inflight", "lag_seconds"}  # runner's keys


def test_composite_key_in_key_order_and_no_key_is_null(sql, open_source):
    sql.run("CREATE TABLE pairs (b VARCHAR(5), a INT, v INT, PRIMARY KEY (a, b))",
            "CREATE TABLE nokey (v INT)")
    source = open_source()
    sql.run("INSERT INTO pairs VALUES ('x', 1, 10)", "INSERT INTO nokey VALUES (5)")
    events, _ = read_count(source, 2)
    assert list(events[0].pk.items()) == [("a", 1), ("b", "x")]
    assert events[1].pk is None and events[1].item == {"v": 5}


def test_multi_statement_transaction_counts_rows_across_statements(sql, open_source):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY)", "CREATE TABLE other (id INT PRIMARY KEY)")
    source = open_source()
    sql.run("BEGIN", "INSERT INTO items VALUES (1), (2)", "INSERT INTO other VALUES (1)",
            "UPDATE items SET id = 3 WHERE id = 2", "COMMIT")
    gtid = sql.value("SELECT @@last_gtid")
    events, _ = read_count(source, 4)
    assert [(e.id, e.type, e.table) for e in events] == [
        (f"crm:{gtid}:0", "insert", "items"), (f"crm:{gtid}:1", "insert", "items"),
        (f"crm:{gtid}:2", "insert", "other"), (f"crm:{gtid}:3", "update", "items")]


def test_ddl_becomes_schema_and_truncate_events(sql, open_source):
    source = open_source()
    sql.run("CREATE TABLE logs (id INT PRIMARY KEY)")
    create = sql.value("SELECT @@last_gtid")
    sql.run("ALTER TABLE logs ADD COLUMN note TEXT")
    sql.run("TRUNCATE TABLE logs")
    sql.run("DROP TABLE logs")
    sql.run("CREATE TABLE marker (id INT)", "INSERT INTO marker VALUES (1)")
    events = without_marker(read_to_marker(source)[0])
    assert [(e.type, e.schema, e.table) for e in events] == [
        ("schema", DATABASE, "logs"), ("schema", DATABASE, "logs"),
        ("truncate", DATABASE, "logs"), ("schema", DATABASE, "logs"),
        ("schema", DATABASE, "marker")]
    assert events[0].item == {"sql": "CREATE TABLE logs (id INT PRIMARY KEY)"}
    assert events[0].id == f"crm:{create}:0" and events[0].position == create
    assert events[1].item == {"sql": "ALTER TABLE logs ADD COLUMN note TEXT"}
    assert events[2].item is None and events[3].item["sql"].startswith("DROP TABLE")


def test_alter_table_mid_stream_keeps_values_under_their_names(sql, open_source):
    sql.run("CREATE TABLE people (id INT PRIMARY KEY, name VARCHAR(20), age INT)")
    source = open_source()
    sql.run("INSERT INTO people VALUES (1, 'ann', 30)")
    sql.run("ALTER TABLE people ADD COLUMN email VARCHAR(40) FIRST, DROP COLUMN age")
    sql.run("INSERT INTO people (id, name, email) VALUES (2, 'bob', 'b@x')")
    sql.run("ALTER TABLE people CHANGE name full_name VARCHAR(20) AFTER email")
    sql.run("UPDATE people SET full_name = 'bo' WHERE id = 2")
    sql.run("CREATE TABLE marker (id INT)", "INSERT INTO marker VALUES (1)")
    rows = [e for e in without_marker(read_to_marker(source)[0]) if e.table == "people"]
    assert [(e.type, e.item) for e in rows if e.type != "schema"] == [
        ("insert", {"id": 1, "name": "ann", "age": 30}),
        ("insert", {"email": "b@x", "id": 2, "name": "bob"}),
        ("update", {"email": "b@x", "full_name": "bo", "id": 2}),
    ]
    assert list(rows[-1].before) == ["email", "full_name", "id"]


def test_filters_exclude_include_and_database(sql, open_source):
    sql.run("CREATE TABLE orders (id INT PRIMARY KEY)", "CREATE TABLE sessions (id INT)",
            "CREATE TABLE audit_1 (id INT)", "CREATE TABLE marker (id INT)")
    sql.run("DROP DATABASE IF EXISTS `{0}_other`".format(DATABASE),
            "CREATE DATABASE `{0}_other`".format(DATABASE),
            "CREATE TABLE `{0}_other`.orders (id INT)".format(DATABASE))
    excluding = open_source(exclude=("sessions", "audit_*"))
    including = open_source(name="inc", include=(f"{DATABASE}_other.*", "marker"))
    sql.run("INSERT INTO orders VALUES (1)", "INSERT INTO sessions VALUES (1)",
            "INSERT INTO audit_1 VALUES (1)",
            f"INSERT INTO `{DATABASE}_other`.orders VALUES (7)", "INSERT INTO marker VALUES (1)")
    try:
        got = without_marker(read_to_marker(excluding)[0])
        assert [(e.schema, e.table) for e in got] == [(DATABASE, "orders")]
        got = without_marker(read_to_marker(including)[0])
        assert [(e.schema, e.table, e.item) for e in got] == [
            (f"{DATABASE}_other", "orders", {"id": 7})]
    finally:
        sql.run(f"DROP DATABASE IF EXISTS `{DATABASE}_other`")


def test_filtered_rows_are_skipped_before_decoding_and_still_advance_the_position(sql, open_source):
    sql.run("CREATE TABLE sessions (id INT PRIMARY KEY)")
    source = open_source(exclude=("sessions",))
    sql.run("INSERT INTO sessions VALUES (1), (2), (3)")
    skipped = int(sql.value("SELECT @@last_gtid").split("-")[2])

    def passed_it(events):
        assert events == []
        batch = source.read(10, 0.05)
        events.extend(batch.events)
        return int(batch.checkpoint["gtid"].split("-")[2]) >= skipped
    read_until(source, passed_it)
    # The excluded table's map was dropped, so the library never decoded its rows.
    assert not any(t.table == "sessions" for t in source._reader.table_map.values())


def test_read_returns_at_once_with_events_and_after_the_timeout_without(sql, open_source):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY)")
    source = open_source()
    started = time.monotonic()
    empty = source.read(100, 0.3)
    waited = time.monotonic() - started
    assert empty.events == [] and 0.29 <= waited < 1.0
    sql.run("INSERT INTO items VALUES (1)")
    started = time.monotonic()
    batch = source.read(100, 10.0)      # must not wait for more rows or for the timeout
    assert [e.item for e in batch.events] == [{"id": 1}]
    assert time.monotonic() - started < 1.0


def test_dropped_connection_is_a_non_fatal_error_not_a_silent_reconnect(sql, open_source):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY)")
    source = open_source()
    local_port = source._reader._stream_connection._sock.getsockname()[1]
    thread = [row[0] for row in sql.rows(
        "SELECT ID, HOST FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'")
        if str(row[1]).endswith(f":{local_port}")]
    assert len(thread) == 1
    sql.run(f"KILL {thread[0]}")
    with pytest.raises(BackendError) as failure:
        read_until(source, lambda events: False, timeout=10)
    assert not failure.value.fatal
    assert "127.0.0.1:3306" in str(failure.value)


def test_partial_row_image_lists_unchanged_columns(sql, open_source):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20), note TEXT)",
            "INSERT INTO items VALUES (1, 'a', 'n')")
    source = open_source(allow_partial_row_image=True)
    sql.run("SET SESSION binlog_row_image = 'MINIMAL'",
            "UPDATE items SET name = 'b' WHERE id = 1", "DELETE FROM items WHERE id = 1",
            "SET SESSION binlog_row_image = 'FULL'")
    update, delete = read_count(source, 2)[0]
    assert update.before == {"id": 1} and update.item == {"name": "b"}
    assert sorted(update.unchanged) == ["id", "note"]
    assert update.pk == {"id": 1}
    assert delete.before == {"id": 1} and delete.pk == {"id": 1}


def test_heartbeats_keep_an_idle_stream_alive_and_silence_is_a_dead_link(sql, open_source,
                                                                         tcp_proxy):
    source = open_source(port=tcp_proxy.port, heartbeat_seconds=0.5)
    dead_after = source.settings.dead_after
    idle_until = time.monotonic() + dead_after + 1.0
    while time.monotonic() < idle_until:             # idle for longer than dead_after ...
        assert source.read(10, 0.5).events == []      # ... alive thanks to heartbeats
    tcp_proxy.freeze()
    frozen_at = time.monotonic()
    with pytest.raises(BackendError) as failure:
        read_until(source, lambda events: False, timeout=dead_after + 5)
    assert not failure.value.fatal and "went silent" in str(failure.value)
    assert dead_after - 0.5 <= time.monotonic() - frozen_at <= dead_after + 2
