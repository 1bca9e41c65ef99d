"""The sync sink through the real supervisor with a MariaDB source: a database replicated into
PostgreSQL (schema = the backend's name), exactly once.

* ``snapshot = "initial"`` of 20k rows under a concurrent writer, with a ``kill -9`` of the
  worker in the middle of the snapshot: the target equals the source in every column (DECIMAL
  exact, BLOB, JSON with exact numbers, DATETIME, TIMESTAMP, SET, ENUM, BIGINT UNSIGNED, NULLs);
* ``kill -9`` of the dispatcher and of the worker during a load of multi-row transactions cut
  by small batches: the target equals the source, a target trigger shows no row change
  applied twice, and no sample saw half a source transaction;
* a binlog load of 20k rows with updates and deletes, same comparison;
* schema changes (add, drop, rename, change of a column) applied in order with the rows; a
  change the sink cannot apply holds the backend, named, until the target is changed.

Waits and sentinels: tests/integration/sync_fixtures.py.
"""

from __future__ import annotations

import json
import os
import random
import signal

import pytest


from tests.integration.snapshot_helpers import WIDE_ROWS_WINDOW, kill_worker_mid_snapshot
from tests.integration.sync_fixtures import (TRIGGER, LoadThread,
                                             assert_once_through_the_kills, child, has_row,
                                             held, kill_during_load, running, snapshot_done,
                                             sync_plugin, until)

pytest_plugins = ["tests.integration.mysql_fixtures", "tests.integration.sync_fixtures"]
pytestmark = pytest.mark.integration

MY_TABLE = """CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40), n DECIMAL(30,9), b BLOB,
    j JSON, dt DATETIME(6), ts TIMESTAMP(6) NULL, d DATE, f DOUBLE, ok TINYINT(1),
    e ENUM('small', 'large'), s SET('a', 'b', 'c'), big BIGINT UNSIGNED)"""

PG_TABLE = """CREATE TABLE crm.t (id int PRIMARY KEY, v text, n numeric(30,9), b bytea, j jsonb,
    dt timestamp, ts timestamptz, d date, f float8, ok boolean, e text, s text[], big numeric)"""


def my_rows(sql):
    out = []
    for row in sql.rows("SELECT id, v, n, b, j, dt, ts, d, f, ok, e, s, big FROM t ORDER BY id"):
        (id_, v, n, b, j, dt, ts, d, f, ok, e, s, big) = row
        out.append((id_, v, None if n is None else str(n), b,
                    None if j is None else json.loads(j, parse_float=str),
                    dt, ts, d, f, None if ok is None else bool(ok), e,
                    None if s is None else sorted(s.split(",")) if s else [],
                    None if big is None else str(big)))
    return out


def pg_rows(target):
    out = []
    for row in target.sql("SELECT id, v, n::text, b, j::text, dt, ts AT TIME ZONE 'UTC', d, f, "
                          "ok, e, s, big::text FROM crm.t ORDER BY id"):
        row = list(row)
        row[3] = None if row[3] is None else bytes(row[3])
        row[4] = None if row[4] is None else json.loads(row[4], parse_float=str)
        row[11] = None if row[11] is None else sorted(row[11])
        out.append(tuple(row))
    return out


def fill(sql, first, last):
    """Rows ``first..last`` of every type, one INSERT of up to 500 rows per transaction."""
    for start in range(first, last + 1, 500):
        values = ",".join(
            f"({i}, 'r{i}', {i}.123456789, UNHEX(MD5({i})), "
            f"'{{\"k\": {i}, \"exact\": 12345678901234567890.000000001}}', "
            f"'2026-11-30 11:33:35.{i % 1000000:06d}', '2026-11-30 11:33:35.5', '2026-11-30', "
            f"{i / 3.0!r}, {i % 2}, 'large', 'a,c', 18446744073709551615)"
            for i in range(start, min(start + 500, last + 1)))
        sql.run(f"INSERT INTO t VALUES {values}")


def change_at_random(cur, rnd, top, label):
    """An update, delete or insert (of an id above 100000) of a random row up to ``top``."""
    i = rnd.randint(1, top)
    kind = rnd.random()
    if kind < 0.6:
        cur.execute("UPDATE t SET v = %s, n = n + 0.000000001, j = JSON_SET(j, '$.w', 1.10) "
                    "WHERE id = %s", (label, i))
    elif kind < 0.8:
        cur.execute("DELETE FROM t WHERE id = %s", (i,))
    else:
        cur.execute("INSERT INTO t (id, v, n, b) VALUES (%s, %s, 1.5, x'00ff') "
                    "ON DUPLICATE KEY UPDATE v = VALUES(v)", (i + 100000, label))


def connection(autocommit=True):
    """A root connection to this session's test database."""
    from tests.integration.mysql_fixtures import database_connection
    return database_connection(autocommit)


class MyWriter(LoadThread):
    """Random updates, deletes and inserts on ``t`` (autocommit) until stopped."""

    def __init__(self, top, seed=11, pause=0.0):
        super().__init__(connection, seed, pause)
        self.top = top

    def step(self, cur):
        change_at_random(cur, self.random, self.top, f"u{self.done}")


def database():
    from tests.integration.mysql_fixtures import DATABASE
    return DATABASE


def backend(**options):
    from tests.integration.mysql_fixtures import lapidus_backend
    return lapidus_backend("crm", **options)


def finish(proc, sql, target, sentinel_sql, table="crm.t", timeout=60):
    """The sentinel row (-1), awaited in the target with nothing written after it."""
    sql.run(sentinel_sql)
    until(proc, lambda: has_row(target, table, -1), timeout, "the sentinel in the target")


def test_snapshot_under_a_writer_and_a_kill_of_the_worker_gives_an_exact_replica(
        sql, target_db, lapidus_factory):
    sql.run(MY_TABLE, "SET time_zone = '+00:00'",
            "INSERT INTO t (id) VALUES (0)")                        # a row of NULLs
    fill(sql, 1, 20000)
    target_db.sql("CREATE SCHEMA crm", PG_TABLE)
    writer = MyWriter(20000, pause=0.005)     # a few hundred changes a second
    writer.start()
    try:
        proc = lapidus_factory({
            "backends": [backend(snapshot="initial", **WIDE_ROWS_WINDOW)],
            "plugins": sync_plugin(target_db)})
        kill_worker_mid_snapshot(
            proc, "crm", f"{database()}.t", at_rows=3000,
            delivered=lambda: target_db.sql("SELECT count(*) FROM crm.t")[0][0],
            finish_within=240)      # 20-event batches (wide rows) under the writer
    finally:
        writer.stop()
    assert writer.done > 50
    finish(proc, sql, target_db, "INSERT INTO t (id) VALUES (-1)")
    assert len(pg_rows(target_db)) > 19000
    assert pg_rows(target_db) == my_rows(sql)


def test_a_kill_of_the_worker_mid_snapshot_applies_no_row_twice(
        sql, target_db, lapidus_factory):
    """Chunks emitted with no write in between share one position (one group); the rows the
    worker sends again after a kill -9 are dropped by the group's ids, or, past 10,000 of them
    (tests/unit/test_sync_order.py), applied again with the values they had, which the
    PostgreSQL target skips: the trigger counts each row once.  (The shared server's other
    writers move the position now and then: how many groups there are is not asserted.)"""
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20), version INT NOT NULL DEFAULT 0)",
            "INSERT INTO t (id, v) SELECT seq, CONCAT('r', seq) FROM seq_1_to_25000")
    target_db.sql("CREATE SCHEMA crm", "CREATE TABLE crm.t (id int PRIMARY KEY, v text, "
                  "version int NOT NULL DEFAULT 0)", TRIGGER.format(table="crm.t"))
    proc = lapidus_factory({
        "backends": [backend(snapshot="initial", snapshot_chunk_rows=1000,
                             max_inflight_batches=2)],
        "plugins": sync_plugin(target_db)})
    until(proc, lambda: target_db.sql("SELECT count(*) FROM crm.t")[0][0] >= 12000, 60,
          "more rows than the tracked ids in the target")
    os.kill(child(proc, "lapidus:crm"), signal.SIGKILL)
    snapshot_done(proc, 90, "the snapshot to finish after the kill")
    assert "snapshot resumed" in proc.log()
    finish(proc, sql, target_db, "INSERT INTO t (id) VALUES (-1)")
    assert target_db.sql("SELECT id, v, version FROM crm.t ORDER BY id") == \
        sql.rows("SELECT id, v, version FROM t ORDER BY id")
    twice = target_db.sql("SELECT id, n FROM applied WHERE n <> 1")
    assert not twice, f"rows applied more than once: {twice[:10]}"


def test_kill_9_of_dispatcher_and_worker_applies_every_change_once(
        sql, target_db, lapidus_factory):
    table = "CREATE TABLE {}t (id INT PRIMARY KEY, v TEXT, n {}, tx INT, " \
            "version INT NOT NULL DEFAULT 0)"
    sql.run(table.format("", "DECIMAL(20,2)"),
            "INSERT INTO t (id, v, n, tx) SELECT seq, 'old', seq / 100, 0 "
            "FROM seq_1000000_to_1002000")                          # for the snapshot
    target_db.sql("CREATE SCHEMA crm", table.format("crm.", "numeric(20,2)"),
                  TRIGGER.format(table="crm.t"))
    proc = lapidus_factory({
        "backends": [backend(snapshot="initial", snapshot_chunk_rows=500, batch_size=7,
                             max_inflight_batches=4)],
        "plugins": sync_plugin(target_db, batch_transactions=3)})

    def connect():
        return connection(autocommit=False)
    # during a snapshot the target holds parts of chunks, which are not whole transactions
    # (docs/sync.md): the load whose transactions are sampled comes after it
    snapshot_done(proc)
    torn = kill_during_load(proc, connect, target_db.sql, ("lapidus:dispatch", "lapidus:crm"),
                            table="crm.t")
    finish(proc, sql, target_db, "INSERT INTO t (id, tx) VALUES (-1, -1)")
    assert target_db.sql("SELECT id, v, n::text, tx, version FROM crm.t ORDER BY id") == \
        [(i, v, str(n) if n is not None else None, tx, version) for i, v, n, tx, version in
         sql.rows("SELECT id, v, n, tx, version FROM t ORDER BY id")]
    assert_once_through_the_kills(proc, torn, target_db.sql, "crm.t")


def test_binlog_load_with_updates_and_deletes(sql, target_db, lapidus_factory):
    sql.run(MY_TABLE, "SET time_zone = '+00:00'")
    target_db.sql("CREATE SCHEMA crm", PG_TABLE)
    proc = lapidus_factory({"backends": [backend()], "plugins": sync_plugin(target_db)})
    running(proc)
    rnd = random.Random(3)
    sql.run("INSERT INTO t (id) VALUES (0)")                     # a row of NULLs
    for chunk in range(40):                                    # 20k rows, 500 a transaction
        fill(sql, chunk * 500 + 1, chunk * 500 + 500)
        with sql.conn.cursor() as cur:
            for n in range(25):                                # the writer meanwhile
                change_at_random(cur, rnd, chunk * 500 + 500, f"u{chunk}.{n}")
    finish(proc, sql, target_db, "INSERT INTO t (id) VALUES (-1)")
    assert len(pg_rows(target_db)) > 19000
    assert pg_rows(target_db) == my_rows(sql)


def test_schema_changes_are_applied_in_order(sql, target_db, lapidus_factory):
    proc = lapidus_factory({"backends": [backend()], "plugins": sync_plugin(target_db)})
    running(proc)
    # created by the sink at its first row, with the types of the CREATE TABLE
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, a VARCHAR(10), gone TEXT, old INT, "
            "at DATETIME(3), KEY (a)) ENGINE=InnoDB",
            "INSERT INTO t VALUES (1, 'a', 'g', 10, '2026-11-30 10:00:00.125')",
            "ALTER TABLE t ADD COLUMN price DECIMAL(10,2) AFTER a, ADD INDEX (old)",
            "INSERT INTO t VALUES (2, 'b', 2.50, 'h', 20, NULL)",
            "ALTER TABLE t DROP COLUMN gone",
            "INSERT INTO t VALUES (3, 'c', 3.75, 30, NULL)",
            "ALTER TABLE t RENAME COLUMN a TO title",
            "INSERT INTO t VALUES (4, 'd', NULL, 40, NULL)",
            "ALTER TABLE t CHANGE old newer BIGINT UNSIGNED",
            "UPDATE t SET price = 1.25, newer = 18446744073709551615 WHERE id = 1")
    finish(proc, sql, target_db, "INSERT INTO t (id) VALUES (-1)")
    assert target_db.sql("SELECT column_name, data_type FROM information_schema.columns "
                         "WHERE table_schema = 'crm' AND table_name = 't' "
                         "ORDER BY ordinal_position") == \
        [("id", "integer"), ("title", "text"), ("newer", "numeric"),
         ("at", "timestamp without time zone"), ("price", "numeric")]     # AFTER: ignored
    assert target_db.sql("SELECT id, title, price::text, newer::text, at::text FROM crm.t "
                         "ORDER BY id") == \
        [(-1, None, None, None, None),
         (1, "a", "1.25", "18446744073709551615", "2026-11-30 10:00:00.125"),
         (2, "b", "2.50", "20", None), (3, "c", "3.75", "30", None),
         (4, "d", None, "40", None)]


def test_a_change_the_sink_cannot_apply_holds_the_backend_until_the_target_is_changed(
        sql, target_db, lapidus_factory):
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, a INT NOT NULL)")
    target_db.sql("CREATE SCHEMA crm", "CREATE TABLE crm.t (id int PRIMARY KEY, a int)")
    proc = lapidus_factory({"backends": [backend()], "plugins": sync_plugin(target_db)})
    running(proc)
    sql.run("INSERT INTO t VALUES (1, 1)",
            "ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id, a)",
            "INSERT INTO t VALUES (1, 2)")
    refusal = held(proc)
    assert "primary key becomes (id, a)" in refusal["error"] and "crm.t" in refusal["error"]
    assert "by hand" in refusal["fix"]
    assert target_db.sql("SELECT id, a FROM crm.t") == [(1, 1)]      # nothing after it
    target_db.sql("ALTER TABLE crm.t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (id, a)")
    finish(proc, sql, target_db, "INSERT INTO t VALUES (-1, 0)")
    assert target_db.sql("SELECT id, a FROM crm.t ORDER BY id, a") == [(-1, 0), (1, 1), (1, 2)]
