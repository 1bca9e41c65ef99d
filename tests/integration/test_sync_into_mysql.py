"""The sync sink into a MariaDB target (``dsn = "mysql://..."``) through the real supervisor,
with a PostgreSQL source (and a MariaDB one), exactly once.

* ``snapshot = "initial"`` of 20k rows under a concurrent writer: the MariaDB table equals the
  source in every column (DECIMAL exact, BLOB from bytea, JSON with exact numbers, DATETIME
  from timestamptz in UTC and from timestamp, DATE, DOUBLE, BOOLEAN, arrays as JSON, uuid,
  NULLs);
* ``kill -9`` of the dispatcher and of the worker during a load of multi-row transactions cut
  by small batches: the target equals the source, a trigger on the target shows no row change
  applied twice, and no sample saw half a source transaction;
* a table created by the sink (types from the values), truncate, a changed key, and a schema
  change that the target does not have held, named, until the target is changed by hand;
* a MariaDB source into another database of the same server: ``snapshot = "initial"``, then
  ``kill -9`` of the dispatcher and of the worker during a load of multi-row transactions,
  with the same checks.

Waits and sentinels: tests/integration/sync_fixtures.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest


from tests.integration.conftest import pg_backend
from tests.integration.sync_fixtures import (FILL, TYPED, Writer,
                                             assert_once_through_the_kills, held,
                                             kill_during_load, running, snapshot_done,
                                             transactions_on, until)

pytest_plugins = ["tests.integration.mysql_fixtures", "tests.integration.sync_fixtures"]
pytestmark = pytest.mark.integration

MY_TYPED = """CREATE TABLE t (id INT PRIMARY KEY, v LONGTEXT, n DECIMAL(30,9), b LONGBLOB,
    j JSON, js JSON, ts DATETIME(6), tl DATETIME(6), d DATE, f DOUBLE, ok BOOLEAN, tags JSON,
    nums JSON, u CHAR(36), version INT NOT NULL DEFAULT 0)"""


def database():
    from tests.integration.mysql_fixtures import DATABASE
    return DATABASE


def into_mariadb(target=None, **options):
    """The sync plugin into the MariaDB database ``target`` (default: the session's)."""
    from tests.integration.mysql_fixtures import HOST, PORT, ROOT, ROOT_PASSWORD
    target = target or database()
    return {"sync": {"dsn": f"mysql://{ROOT}:{ROOT_PASSWORD}@{HOST}:{PORT}/{target}",
                     "schema": target, **options}}


def pg_typed_rows(db):
    out = []
    for row in db.sql("SELECT id, v, n::text, b, j::text, js::text, ts, tl, d, f, ok, tags, nums, "
                      "u::text, version FROM t ORDER BY id"):
        row = list(row)
        row[3] = None if row[3] is None else bytes(row[3])
        for i in (4, 5):
            row[i] = None if row[i] is None else json.loads(row[i], parse_float=str)
        if row[6] is not None:
            row[6] = row[6].astimezone(dt.timezone.utc).replace(tzinfo=None)
        out.append(tuple(row))
    return out


def my_typed_rows(sql):
    out = []
    for row in sql.rows("SELECT id, v, CAST(n AS CHAR), b, j, js, ts, tl, d, f, ok, tags, nums, "
                        "u, version FROM t ORDER BY id"):
        row = list(row)
        for i in (4, 5, 11, 12):
            row[i] = None if row[i] is None else json.loads(row[i], parse_float=str)
        row[10] = None if row[10] is None else bool(row[10])
        out.append(tuple(row))
    return out


def has_my_row(sql, table, key):
    try:
        return bool(sql.rows(f"SELECT 1 FROM {table} WHERE id = %s", args=(key,)))
    except Exception:
        return False


def finish(proc, source, sql, sentinel_sql, table="t"):
    """The sentinel row (-1), awaited in the target with nothing written after it."""
    source.sql(sentinel_sql)
    until(proc, lambda: has_my_row(sql, table, -1), 60, "the sentinel in the target")


def test_snapshot_under_a_writer_gives_an_exact_replica(pg_db, sql, lapidus_factory):
    pg_db.sql(TYPED, FILL.format(rows=20000),
              "INSERT INTO t (id, version) VALUES (0, 0)")           # a row of NULLs
    sql.run(MY_TYPED)
    writer = Writer(pg_db, 20000)
    writer.start()
    try:
        proc = lapidus_factory({
            "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                    snapshot_chunk_rows=2000)],
            "plugins": into_mariadb()})
        snapshot_done(proc)
    finally:
        writer.stop()
    assert writer.done > 50
    finish(proc, pg_db, sql, "INSERT INTO t (id, version) VALUES (-1, 0)")
    assert len(my_typed_rows(sql)) > 19000
    assert my_typed_rows(sql) == pg_typed_rows(pg_db)
    (state,) = sql.rows("SELECT backend, last_id FROM lapidus_sync_state")
    assert state[0] == "pg" and state[1]


MY_TRIGGER = ("CREATE TABLE applied (id INT PRIMARY KEY, n INT NOT NULL)",
              "CREATE TRIGGER count_insert AFTER INSERT ON t FOR EACH ROW "
              "INSERT INTO applied VALUES (NEW.id, 1) ON DUPLICATE KEY UPDATE n = n + 1",
              "CREATE TRIGGER count_update AFTER UPDATE ON t FOR EACH ROW "
              "INSERT INTO applied VALUES (NEW.id, 1) ON DUPLICATE KEY UPDATE n = n + 1")


def test_kill_9_of_dispatcher_and_worker_applies_every_change_once(
        pg_db, sql, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(20,2), tx int, "
              "version int NOT NULL DEFAULT 0)")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v TEXT, n DECIMAL(20,2), tx INT, "
            "version INT NOT NULL DEFAULT 0)", *MY_TRIGGER)
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", batch_size=7,
                                max_inflight_batches=4)],
        "plugins": into_mariadb(batch_transactions=3)})
    running(proc)

    torn = kill_during_load(proc, transactions_on(pg_db), sql.rows,
                            ("lapidus:dispatch", "lapidus:pg"))
    finish(proc, pg_db, sql, "INSERT INTO t (id, tx) VALUES (-1, -1)")
    assert sql.rows("SELECT id, v, CAST(n AS CHAR), tx, version FROM t ORDER BY id") == \
        pg_db.sql("SELECT id, v, n::text, tx, version FROM t ORDER BY id")
    assert_once_through_the_kills(proc, torn, sql.rows)


def test_created_tables_truncate_a_moved_key_and_a_held_schema_change(
        pg_db, sql, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text)",
              "CREATE TABLE made (id bigint PRIMARY KEY, label text, amount numeric(12,3), "
              "doc jsonb, at timestamptz, raw bytea)")
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, a TEXT)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db, decoder="pgoutput")],
                            "plugins": into_mariadb()})
    running(proc)
    pg_db.sql("INSERT INTO made VALUES (9223372036854775807, 'x', 1.500, "
              "'{\"n\": 12345678901234567890.000000001}', '2026-12-01 10:00:00.5+02', '\\x00ff'),"
              " (2, NULL, NULL, NULL, NULL, NULL)",
              "UPDATE made SET id = 3 WHERE id = 2",                   # a changed key
              "INSERT INTO t VALUES (1, 'a'), (2, 'b')", "TRUNCATE t",
              "INSERT INTO t VALUES (3, 'c')",
              "ALTER TABLE t ADD COLUMN extra int", "INSERT INTO t VALUES (4, 'd', 4)")
    refusal = held(proc)
    assert "not applied to a MySQL/MariaDB target" in refusal["error"]
    assert "by hand" in refusal["fix"]
    assert sql.rows("SELECT id, a FROM t") == [(3, "c")]             # right before it
    sql.run("ALTER TABLE t ADD COLUMN extra INT")                      # the operator's fix
    finish(proc, pg_db, sql, "INSERT INTO t VALUES (-1, 'end')")
    assert sql.rows("SELECT id, a, extra FROM t ORDER BY id") == \
        [(-1, "end", None), (3, "c", None), (4, "d", 4)]
    # types inferred from the first row's values (docs/sync.md): integers DECIMAL(20,0),
    # objects JSON with every digit, strings (a NUMERIC, a timestamp, base64) their event text
    assert sql.rows("SELECT id, label, amount, doc, at, raw FROM made ORDER BY id") == \
        [(3, None, None, None, None, None),
         (9223372036854775807, "x", "1.500", '{"n":12345678901234567890.000000001}',
          "2026-12-01T08:00:00.5Z", "AP8=")]
    assert sql.rows("SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE "
                    "TABLE_SCHEMA = %s AND TABLE_NAME = 'made' ORDER BY ORDINAL_POSITION",
                    args=(database(),)) == \
        [("id", "decimal(20,0)"), ("label", "longtext"), ("amount", "longtext"),
         ("doc", "longtext"), ("at", "longtext"), ("raw", "longtext")]


# -- a MariaDB source -------------------------------------------------------------------

@pytest.fixture
def my_target(mysql_server):
    """A second database on the MariaDB server, empty, as a :class:`Sql` in it; dropped
    afterwards (named like the session's own, so a crashed session's is cleaned up too)."""
    from tests.integration.mysql_fixtures import Sql
    name = f"lapidus_test_mysql_target_{os.getpid()}"
    helper = Sql()
    helper.run(f"DROP DATABASE IF EXISTS `{name}`", f"CREATE DATABASE `{name}`",
               f"USE `{name}`")
    helper.name = name
    yield helper
    helper.run(f"DROP DATABASE IF EXISTS `{name}`")
    helper.close()


def test_mariadb_source_kill_9_of_dispatcher_and_worker_applies_every_change_once(
        sql, my_target, lapidus_factory):
    from tests.integration.mysql_fixtures import database_connection, lapidus_backend
    table = ("CREATE TABLE t (id INT PRIMARY KEY, v TEXT, n DECIMAL(20,2), tx INT, "
             "version INT NOT NULL DEFAULT 0)")
    sql.run(table, "INSERT INTO t (id, v, n, tx) SELECT seq, 'old', seq / 100, 0 "
                   "FROM seq_1000000_to_1002000")                    # for the snapshot
    my_target.run(table, *MY_TRIGGER)
    proc = lapidus_factory({
        "backends": [lapidus_backend("crm", snapshot="initial", snapshot_chunk_rows=500,
                                     batch_size=7, max_inflight_batches=4)],
        "plugins": into_mariadb(my_target.name, batch_transactions=3)})
    # during a snapshot the target holds parts of chunks, not whole transactions
    # (docs/sync.md): the load whose transactions are sampled comes after it
    snapshot_done(proc)
    torn = kill_during_load(proc, lambda: database_connection(autocommit=False),
                            my_target.rows,
                            ("lapidus:dispatch", "lapidus:crm"))
    sql.run("INSERT INTO t (id, tx) VALUES (-1, -1)")
    until(proc, lambda: has_my_row(my_target, "t", -1), 60, "the sentinel in the target")
    query = "SELECT id, v, CAST(n AS CHAR), tx, version FROM t ORDER BY id"
    assert my_target.rows(query) == sql.rows(query)
    assert len(my_target.rows(query)) > 2400
    assert_once_through_the_kills(proc, torn, my_target.rows)
    (state,) = my_target.rows("SELECT backend FROM lapidus_sync_state")
    assert state == ("crm",)
