"""The sync sink through the real supervisor: a PostgreSQL source replicated into another
PostgreSQL database, exactly once (MariaDB sources: test_sync_mysql.py).

* PostgreSQL -> PostgreSQL, ``snapshot = "initial"`` under a concurrent writer: the target
  equals the source in every column (exact numerics, bytea, json, arrays, timestamps, NULLs),
  also across a ``kill -9`` of the worker in the middle of the snapshot;
* ``kill -9`` of the dispatcher and of the worker during a load of multi-row transactions:
  the target equals the source, a target trigger counts every applied row change and shows
  none applied twice, and no sample taken during the load saw half a source transaction;
* schema changes on the source (add column, drop column) applied in order; a rename through
  the DDL capture; an ambiguous one (relation message) held until the target is changed;
* TOAST-unchanged columns kept (also when the key changes), truncate, table/column mapping;
* a row the target refuses goes through ``on_undeliverable`` (dead letter), named.

Waits and sentinels: tests/integration/sync_fixtures.py.
"""

from __future__ import annotations

import json

import pytest


from tests.integration.conftest import ctl, pg_backend
from tests.integration.snapshot_helpers import WIDE_ROWS_WINDOW, kill_worker_mid_snapshot
from tests.integration.sync_fixtures import (FILL, TRIGGER, TYPED, Writer,
                                             assert_once_through_the_kills, has_row,
                                             held, kill_during_load, running, snapshot_done,
                                             sync_plugin, transactions_on, until)

pytestmark = pytest.mark.integration
pytest_plugins = ["tests.integration.sync_fixtures"]



def rows(db, table="t"):
    """Every row as its text form.  A json column is compared as jsonb: the event carries its
    value, not its original whitespace (docs/sync.md)."""
    if table == "t" and db.sql("SELECT 1 FROM information_schema.columns WHERE table_name = "
                               "'t' AND column_name = 'js'"):
        return db.sql("SELECT (id, v, n, b, j, js::jsonb, ts, tl, d, f, ok, tags, nums, u, "
                      "version)::text FROM t ORDER BY id")
    return db.sql(f"SELECT {table}::text FROM {table} ORDER BY id")


def finish(proc, source, target, sentinel_sql, table="t", key=-1, timeout=60):
    """Write a sentinel and wait for it in the target, with nothing written after it:
    everything before it is applied then."""
    source.sql(sentinel_sql)
    until(proc, lambda: has_row(target, table, key), timeout, "the sentinel in the target")




def test_pg_snapshot_under_a_writer_gives_an_exact_replica(pg_db, target_db, lapidus_factory):
    pg_db.sql(TYPED, FILL.format(rows=20000),
              "INSERT INTO t (id, version) VALUES (0, 0)",   # a row of NULLs
              "CREATE TABLE made (id int PRIMARY KEY, label text, amount numeric, doc jsonb)",
              "INSERT INTO made VALUES (1, 'x', 1.50, '{\"a\": [1, 2]}'), (2, NULL, NULL, NULL)")
    target_db.sql(TYPED)                                   # "made" is created
    writer = Writer(pg_db, 20000)
    writer.start()
    try:
        proc = lapidus_factory({
            "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                    snapshot_chunk_rows=2000)],
            "plugins": sync_plugin(target_db)})
        snapshot_done(proc)
    finally:
        writer.stop()
    assert writer.done > 50
    finish(proc, pg_db, target_db, "INSERT INTO t (id, version) VALUES (-1, 0)")
    assert rows(target_db) == rows(pg_db)
    assert target_db.sql("SELECT id, label, amount, doc::text FROM made ORDER BY id") == \
        [(1, "x", "1.50", '{"a": [1, 2]}'), (2, None, None, None)]
    (state,) = target_db.sql("SELECT backend, last_id FROM lapidus_sync_state")
    assert state[0] == "pg" and state[1]


def test_kill_9_of_the_worker_mid_snapshot_still_gives_an_exact_replica(
        pg_db, target_db, lapidus_factory):
    pg_db.sql(TYPED, FILL.format(rows=20000))
    target_db.sql(TYPED)
    writer = Writer(pg_db, 20000, seed=12, pause=0.005)     # a few hundred changes a second
    writer.start()
    try:
        proc = lapidus_factory({
            "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                    **WIDE_ROWS_WINDOW)],
            "plugins": sync_plugin(target_db)})
        kill_worker_mid_snapshot(proc, "pg", "public.t", at_rows=3000,
                                 delivered=lambda: target_db.sql("SELECT count(*) FROM t")[0][0],
                                 finish_within=240)
    finally:
        writer.stop()
    assert writer.done > 50                  # it really wrote while the chunks were held
    finish(proc, pg_db, target_db, "INSERT INTO t (id, version) VALUES (-1, 0)")
    assert rows(target_db) == rows(pg_db)


def test_kill_9_of_dispatcher_and_worker_applies_every_change_once(
        pg_db, target_db, lapidus_factory):
    table = ("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(20,2), tx int, "
             "version int NOT NULL DEFAULT 0)")
    pg_db.sql(table)
    target_db.sql(table, TRIGGER.format(table="t"))
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", batch_size=7,
                                max_inflight_batches=4)],
        "plugins": sync_plugin(target_db, batch_transactions=3)})
    running(proc)

    torn = kill_during_load(proc, transactions_on(pg_db), target_db.sql,
                            ("lapidus:dispatch", "lapidus:pg"))
    finish(proc, pg_db, target_db, "INSERT INTO t (id, tx) VALUES (-1, -1)")
    assert rows(target_db) == rows(pg_db)
    assert_once_through_the_kills(proc, torn, target_db.sql)


def test_schema_changes_are_applied_in_order(pg_db, target_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text, gone text)")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db)})
    running(proc)
    pg_db.sql("INSERT INTO t VALUES (1, 'a', 'g')",
              "ALTER TABLE t ADD COLUMN price numeric(10,2)",
              "INSERT INTO t VALUES (2, 'b', 'h', 2.50)",
              "ALTER TABLE t DROP COLUMN gone",
              "INSERT INTO t VALUES (3, 'c', 3.75)", "UPDATE t SET price = 1.25 WHERE id = 1")
    finish(proc, pg_db, target_db, "INSERT INTO t (id) VALUES (-1)")
    assert target_db.sql("SELECT column_name, data_type FROM information_schema.columns "
                         "WHERE table_name = 't' ORDER BY ordinal_position") == \
        [("id", "integer"), ("a", "text"), ("price", "numeric")]
    assert target_db.sql("SELECT id, a, price::text FROM t ORDER BY id") == \
        [(-1, None, None), (1, "a", "1.25"), (2, "b", "2.50"), (3, "c", "3.75")]


def test_a_column_rename_through_the_ddl_capture(pg_db, target_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text)")
    target_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text)")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db)})
    running(proc)
    code, out, err = ctl(proc.config_path, "install-ddl-capture", "pg")
    assert code == 0, err
    pg_db.sql("INSERT INTO t VALUES (1, 'kept')", "ALTER TABLE t RENAME COLUMN a TO title",
              "INSERT INTO t VALUES (2, 'new')")
    finish(proc, pg_db, target_db, "INSERT INTO t VALUES (-1, 'end')")
    assert target_db.sql("SELECT id, title FROM t ORDER BY id") == \
        [(-1, "end"), (1, "kept"), (2, "new")]


def test_tables_and_columns_mapped_into_another_schema(pg_db, target_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text, n numeric(8,3))")
    target_db.sql("CREATE SCHEMA replica",
                  "CREATE TABLE replica.copy (id int PRIMARY KEY, alpha text, n numeric(8,3))")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db, schema="replica", tables={
            "public.t": {"table": "copy", "columns": {"a": "alpha"}}})})
    running(proc)
    pg_db.sql("INSERT INTO t VALUES (1, 'x', 1.5), (2, 'y', 2.25)",
              "UPDATE t SET a = 'z' WHERE id = 1", "DELETE FROM t WHERE id = 2")
    finish(proc, pg_db, target_db, "INSERT INTO t VALUES (-1, 'end', 0)", table="replica.copy")
    assert target_db.sql("SELECT id, alpha, n::text FROM replica.copy ORDER BY id") == \
        [(-1, "end", "0.000"), (1, "z", "1.500")]
    # the worker read the last source transaction's end: nothing of it is held
    assert target_db.sql("SELECT count(*) FROM lapidus_sync_pending") == [(0,)]


def test_toast_unchanged_truncate_and_a_changed_key(pg_db, target_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, big text, v int)",
              "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")   # stored out of line
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db)})
    running(proc)
    pg_db.sql("INSERT INTO t SELECT g, repeat(md5(g::text), 400), g FROM generate_series(1, 3) g",
              "UPDATE t SET v = 10 WHERE id = 1",            # big unchanged: not in the WAL
              "UPDATE t SET id = 30 WHERE id = 3",           # a changed key
              "CREATE TABLE other (id int PRIMARY KEY)", "INSERT INTO other VALUES (1)",
              "TRUNCATE other", "INSERT INTO other VALUES (2)")
    finish(proc, pg_db, target_db, "INSERT INTO t VALUES (-1, '', 0)")
    assert target_db.sql("SELECT id, md5(big), v FROM t ORDER BY id") == \
        pg_db.sql("SELECT id, md5(big), v FROM t ORDER BY id")
    assert target_db.sql("SELECT id FROM other") == [(2,)]


def test_a_refused_row_goes_to_the_dead_letters_named(pg_db, target_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    target_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text CHECK (v <> 'bad'))")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", on_undeliverable="dead_letter")],
        "plugins": sync_plugin(target_db)})
    running(proc)
    pg_db.sql("INSERT INTO t VALUES (1, 'good')", "INSERT INTO t VALUES (2, 'bad')",
              "INSERT INTO t VALUES (3, 'good')")
    finish(proc, pg_db, target_db, "INSERT INTO t VALUES (-1, 'end')")
    assert target_db.sql("SELECT id, v FROM t ORDER BY id") == \
        [(-1, "end"), (1, "good"), (3, "good")]
    code, out, err = ctl(proc.config_path, "dead-letters", "pg", "--json")
    assert code == 0, err
    (entry,) = [json.loads(line) for line in out.splitlines()]
    assert entry["sink"] == "sync" and "t_v_check" in entry["error"]
    assert 'key ["2"]' in entry["error"]
    assert entry["fix"]


def test_an_ambiguous_rename_holds_the_backend_until_the_target_is_changed(
        pg_db, target_db, lapidus_factory):
    """Without the DDL capture a rename arrives as a relation message in which one column
    went and another came: refused (held, named) until the operator changes the target."""
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text)")
    target_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text)")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db)})
    running(proc)
    pg_db.sql("INSERT INTO t VALUES (1, 'kept')", "ALTER TABLE t RENAME COLUMN a TO title",
              "INSERT INTO t VALUES (2, 'new')")
    refusal = held(proc)
    assert "cannot be told apart" in refusal["error"]
    assert "install-ddl-capture" in refusal["fix"]
    assert target_db.sql("SELECT id, a FROM t") == [(1, "kept")]   # nothing after it
    target_db.sql("ALTER TABLE t RENAME COLUMN a TO title")        # the operator's fix
    finish(proc, pg_db, target_db, "INSERT INTO t VALUES (-1, 'end')")
    assert target_db.sql("SELECT id, title FROM t ORDER BY id") == \
        [(-1, "end"), (1, "kept"), (2, "new")]
