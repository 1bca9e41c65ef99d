"""The sync sink through the real supervisor: PostgreSQL and MariaDB sources replicated into
another PostgreSQL database, exactly once.

* PostgreSQL -> PostgreSQL, ``snapshot = "initial"`` under a concurrent writer: the target
  equals the source in every column (exact numerics, bytea, json, arrays, timestamps, NULLs),
  also across a ``kill -9`` of the worker in the middle of the snapshot;
* ``kill -9`` of the dispatcher and of the worker during a load of multi-row transactions:
  the target equals the source, a target trigger counts every applied row change and shows
  none applied twice, and no sample taken during the load saw half a source transaction;
* schema changes on the source (add column, drop column) applied in order; a rename through
  the DDL capture; an ambiguous one (relation message) held until the target is changed;
* TOAST-unchanged columns kept (also when the key changes), truncate, table/column mapping;
* a row the target refuses goes through ``on_undeliverable`` (dead letter), named;
* MariaDB -> PostgreSQL: types and a load with updates and deletes.

Every wait is on a condition with a deadline.  Source transactions become visible in the
target once a later transaction shows they are complete (docs/sync.md), so each test ends
its load with a sentinel row and one more write after it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import uuid

import psutil
import pytest

from tests.conftest import wait_until
from tests.integration.conftest import (PgDatabase, backend_status, ctl, drop_slots_of,
                                        pg_backend, pg_connect)

pytestmark = pytest.mark.integration

TYPED = """CREATE TABLE t (
    id int PRIMARY KEY, v text, n numeric(30,9), b bytea, j jsonb, js json, ts timestamptz,
    tl timestamp, d date, f float8, ok boolean, tags text[], nums int[], u uuid,
    version int NOT NULL DEFAULT 0)"""

FILL = """INSERT INTO t SELECT g, 'r' || g, g * 1000000.123456789, decode(md5(g::text), 'hex'),
    jsonb_build_object('k', g, 'exact', 12345678901234567890.000000001, 'a', jsonb_build_array(1, 'x')),
    json_build_object('g', g), '2026-11-30 11:33:35.295384+00'::timestamptz + g * interval '1 s',
    '2026-11-30 11:33:35.5'::timestamp, '2026-11-30'::date + g, g / 3.0, g % 2 = 0,
    ARRAY['a b', 'c"d', NULL], ARRAY[g, -g], md5(g::text)::uuid, 0
    FROM generate_series(1, {rows}) g"""


@pytest.fixture
def target_db():
    name = f"lapidus_it_sync_{uuid.uuid4().hex[:8]}"
    admin = pg_connect()
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    db = PgDatabase(name)
    try:
        yield db
    finally:
        db.conn.close()
        drop_slots_of(admin, name)
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


def sync_plugin(target, **options):
    return {"sync": {"dsn": f"host=127.0.0.1 port=5432 user=postgres dbname={target.name}",
                     **options}}


def rows(db, table="t"):
    """Every row as its text form.  A json column is compared as jsonb: the event carries its
    value, not its original whitespace (docs/sync.md)."""
    if table == "t" and db.sql("SELECT 1 FROM information_schema.columns WHERE table_name = "
                               "'t' AND column_name = 'js'"):
        return db.sql("SELECT (id, v, n, b, j, js::jsonb, ts, tl, d, f, ok, tags, nums, u, "
                      "version)::text FROM t ORDER BY id")
    return db.sql(f"SELECT {table}::text FROM {table} ORDER BY id")


def until(proc, predicate, timeout, what):
    try:
        return wait_until(predicate, timeout, message=what)
    except pytest.fail.Exception:
        pytest.fail(f"timed out after {timeout}s waiting for {what}; status: "
                    f"{backend_status(proc.config_path)}\nlog:\n{proc.log()[-4000:]}")


def has_row(db, table, key):
    try:
        return bool(db.sql(f"SELECT 1 FROM {table} WHERE id = {key}"))
    except Exception:
        db.conn.rollback() if not db.conn.autocommit else None
        return False


def finish(proc, source, target, sentinel_sql, table="t", key=-1, timeout=60):
    """Write a sentinel, then one more transaction (which shows the sentinel's is complete),
    and wait for the sentinel in the target: everything before it is applied then."""
    source.sql(sentinel_sql, "INSERT INTO flush SELECT coalesce(max(id), 0) + 1 FROM flush")
    until(proc, lambda: has_row(target, table, key), timeout, "the sentinel in the target")


def child(proc, name):
    def find():
        for each in proc.children():
            try:
                if each.name() == name[:15]:
                    return each.pid
            except psutil.NoSuchProcess:
                pass
        return None
    return wait_until(find, 20, message=f"process {name}")


class Writer(threading.Thread):
    """Random updates, deletes and inserts on ``t`` (its own connection) until stopped."""

    def __init__(self, db, top, seed=11):
        super().__init__(daemon=True)
        self.db, self.top, self.random = db, top, random.Random(seed)
        self.halt, self.done, self.error = threading.Event(), 0, None

    def run(self):
        conn = pg_connect(self.db.name)
        try:
            with conn.cursor() as cur:
                while not self.halt.is_set():
                    i = self.random.randint(1, self.top)
                    kind = self.random.random()
                    if kind < 0.6:
                        cur.execute("UPDATE t SET v = %s, n = n + 0.000000001, version = "
                                    "version + 1, j = j || '{\"w\": 1.10}' WHERE id = %s",
                                    (f"u{self.done}", i))
                    elif kind < 0.8:
                        cur.execute("DELETE FROM t WHERE id = %s", (i,))
                    else:
                        cur.execute("INSERT INTO t (id, v, n, b) VALUES (%s, %s, 1.5, '\\x00ff') "
                                    "ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                                    (i + self.top, f"i{self.done}"))
                    self.done += 1
        except Exception as exc:
            self.error = exc
        finally:
            conn.close()

    def stop(self):
        self.halt.set()
        self.join(10)
        assert self.error is None, self.error


def test_pg_snapshot_under_a_writer_gives_an_exact_replica(pg_db, target_db, lapidus_factory):
    pg_db.sql(TYPED, FILL.format(rows=20000), "CREATE TABLE flush (id int PRIMARY KEY)",
              "INSERT INTO t (id, version) VALUES (0, 0)",   # a row of NULLs
              "CREATE TABLE made (id int PRIMARY KEY, label text, amount numeric, doc jsonb)",
              "INSERT INTO made VALUES (1, 'x', 1.50, '{\"a\": [1, 2]}'), (2, NULL, NULL, NULL)")
    target_db.sql(TYPED, "CREATE TABLE flush (id int PRIMARY KEY)")   # "made" is created
    writer = Writer(pg_db, 20000)
    writer.start()
    try:
        proc = lapidus_factory({
            "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                    snapshot_chunk_rows=2000)],
            "plugins": sync_plugin(target_db)})
        until(proc, lambda: (backend_status(proc.config_path).get("snapshot") or {})
              .get("state") == "done", 60, "the snapshot to finish")
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
    pg_db.sql(TYPED, FILL.format(rows=20000), "CREATE TABLE flush (id int PRIMARY KEY)")
    target_db.sql(TYPED, "CREATE TABLE flush (id int PRIMARY KEY)")
    writer = Writer(pg_db, 20000, seed=12)
    writer.start()
    try:
        proc = lapidus_factory({
            "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                    snapshot_chunk_rows=500, max_inflight_batches=2)],
            "plugins": sync_plugin(target_db)})
        until(proc, lambda: (backend_status(proc.config_path).get("snapshot") or {})
              .get("rows", 0) >= 3000, 60, "a part of the snapshot")
        os.kill(child(proc, "lapidus:pg"), signal.SIGKILL)
        until(proc, lambda: (backend_status(proc.config_path).get("snapshot") or {})
              .get("state") == "done", 60, "the snapshot to finish after the kill")
    finally:
        writer.stop()
    assert "snapshot resumed" in proc.log()      # killed in the middle, not after it
    finish(proc, pg_db, target_db, "INSERT INTO t (id, version) VALUES (-1, 0)")
    assert rows(target_db) == rows(pg_db)


TRIGGER = """
CREATE TABLE applied (id int PRIMARY KEY, n int NOT NULL);
CREATE FUNCTION count_applied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO applied VALUES (NEW.id, 1) ON CONFLICT (id) DO UPDATE SET n = applied.n + 1;
  RETURN NEW;
END $$;
CREATE TRIGGER count_applied AFTER INSERT OR UPDATE ON t FOR EACH ROW
  EXECUTE FUNCTION count_applied();
"""


class TxWriter(threading.Thread):
    """Transactions of five inserts (one ``tx`` value) plus one update that bumps a row's
    ``version``: a row's every change is counted by ``version``."""

    def __init__(self, db, seed=5):
        super().__init__(daemon=True)
        self.db, self.random = db, random.Random(seed)
        self.halt, self.tx, self.error = threading.Event(), 0, None

    def run(self):
        conn = pg_connect(self.db.name)
        conn.autocommit = False
        try:
            with conn.cursor() as cur:
                while not self.halt.is_set():
                    self.tx += 1
                    base = self.tx * 5
                    cur.execute("INSERT INTO t (id, v, n, tx) SELECT g, 'x', g * 0.01, %s "
                                "FROM generate_series(%s, %s) g", (self.tx, base, base + 4))
                    cur.execute("UPDATE t SET version = version + 1, n = n + 1 WHERE id = %s",
                                (self.random.randint(5, base + 4),))
                    conn.commit()
        except Exception as exc:
            self.error = exc
        finally:
            conn.close()

    def stop(self):
        self.halt.set()
        self.join(10)
        assert self.error is None, self.error


def test_kill_9_of_dispatcher_and_worker_applies_every_change_once(
        pg_db, target_db, lapidus_factory):
    table = ("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(20,2), tx int, "
             "version int NOT NULL DEFAULT 0)")
    pg_db.sql(table, "CREATE TABLE flush (id int PRIMARY KEY)")
    target_db.sql(table, "CREATE TABLE flush (id int PRIMARY KEY)", TRIGGER)
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", batch_size=7,
                                max_inflight_batches=4)],
        "plugins": sync_plugin(target_db, batch_transactions=3)})
    until(proc, lambda: backend_status(proc.config_path).get("state") == "RUNNING", 30,
          "the backend to run")
    writer = TxWriter(pg_db)
    writer.start()
    torn = []

    def sample():
        # batch_size 7 cuts the 6-change transactions: a cut one must never show
        torn.extend(target_db.sql("SELECT tx, count(*) FROM t WHERE id % 5 >= 0 GROUP BY tx "
                                  "HAVING count(*) <> 5"))
        return target_db.sql("SELECT count(*) FROM t")[0][0]
    try:
        for name in ("lapidus:dispatch", "lapidus:pg"):
            before = sample()
            until(proc, lambda: sample() > before + 200, 30, "rows applied before the kill")
            os.kill(child(proc, name), signal.SIGKILL)
        until(proc, lambda: sample() > before + 400, 40, "rows applied after the kills")
    finally:
        writer.stop()
    finish(proc, pg_db, target_db, "INSERT INTO t (id, tx) VALUES (-1, -1)")
    assert not torn, f"half a source transaction was visible: {torn[:5]}"
    assert backend_status(proc.config_path)["restarts"] >= 1       # the worker was killed
    assert proc.log().count('"child": "dispatcher", "pid"') >= 2    # ... and the dispatcher
    assert rows(target_db) == rows(pg_db)
    twice = target_db.sql("SELECT t.id, t.version, a.n FROM t JOIN applied a USING (id) "
                          "WHERE a.n <> t.version + 1")
    assert not twice, f"rows applied more than once: {twice[:10]}"


def test_schema_changes_are_applied_in_order(pg_db, target_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text, gone text)",
              "CREATE TABLE flush (id int PRIMARY KEY)")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db)})
    until(proc, lambda: backend_status(proc.config_path).get("state") == "RUNNING", 30,
          "the backend to run")
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
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text)",
              "CREATE TABLE flush (id int PRIMARY KEY)")
    target_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text)")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db)})
    until(proc, lambda: backend_status(proc.config_path).get("state") == "RUNNING", 30,
          "the backend to run")
    code, out, err = ctl(proc.config_path, "install-ddl-capture", "pg")
    assert code == 0, err
    pg_db.sql("INSERT INTO t VALUES (1, 'kept')", "ALTER TABLE t RENAME COLUMN a TO title",
              "INSERT INTO t VALUES (2, 'new')")
    finish(proc, pg_db, target_db, "INSERT INTO t VALUES (-1, 'end')")
    assert target_db.sql("SELECT id, title FROM t ORDER BY id") == \
        [(-1, "end"), (1, "kept"), (2, "new")]


def test_tables_and_columns_mapped_into_another_schema(pg_db, target_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text, n numeric(8,3))",
              "CREATE TABLE flush (id int PRIMARY KEY)")
    target_db.sql("CREATE SCHEMA replica",
                  "CREATE TABLE replica.copy (id int PRIMARY KEY, alpha text, n numeric(8,3))")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db, schema="replica", tables={
            "public.t": {"table": "copy", "columns": {"a": "alpha"}}})})
    until(proc, lambda: backend_status(proc.config_path).get("state") == "RUNNING", 30,
          "the backend to run")
    pg_db.sql("INSERT INTO t VALUES (1, 'x', 1.5), (2, 'y', 2.25)",
              "UPDATE t SET a = 'z' WHERE id = 1", "DELETE FROM t WHERE id = 2")
    finish(proc, pg_db, target_db, "INSERT INTO t VALUES (-1, 'end', 0)", table="replica.copy")
    assert target_db.sql("SELECT id, alpha, n::text FROM replica.copy ORDER BY id") == \
        [(-1, "end", "0.000"), (1, "z", "1.500")]
    # the last source transaction (into flush) waits, held, for a later one to show its end
    assert target_db.sql("SELECT count(*) FROM lapidus_sync_pending") == [(1,)]


def test_toast_unchanged_truncate_and_a_changed_key(pg_db, target_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, big text, v int)",
              "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL",   # stored out of line
              "CREATE TABLE flush (id int PRIMARY KEY)")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db)})
    until(proc, lambda: backend_status(proc.config_path).get("state") == "RUNNING", 30,
          "the backend to run")
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
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)",
              "CREATE TABLE flush (id int PRIMARY KEY)")
    target_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text CHECK (v <> 'bad'))")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", on_undeliverable="dead_letter")],
        "plugins": sync_plugin(target_db)})
    until(proc, lambda: backend_status(proc.config_path).get("state") == "RUNNING", 30,
          "the backend to run")
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


# ------------------------------------------------------------------ MariaDB -> PostgreSQL

pytest.register_assert_rewrite("tests.integration.mysql_fixtures")
pytest_plugins = ["tests.integration.mysql_fixtures"]

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


def test_mariadb_to_postgresql_under_a_load(sql, target_db, lapidus_factory):
    from tests.integration.mysql_fixtures import lapidus_backend
    sql.run(MY_TABLE, "CREATE TABLE flush (id INT PRIMARY KEY)", "SET time_zone = '+00:00'")
    target_db.sql("CREATE SCHEMA crm", PG_TABLE)    # "flush" is created by create_tables
    proc = lapidus_factory({"backends": [lapidus_backend("crm")],
                            "plugins": sync_plugin(target_db)})
    until(proc, lambda: backend_status(proc.config_path).get("state") == "RUNNING", 30,
          "the backend to run")
    rnd = random.Random(3)
    sql.run("INSERT INTO t (id) VALUES (0)")                     # a row of NULLs
    for chunk in range(40):                                    # 20k rows, 500 a transaction
        values = ",".join(
            f"({i}, 'r{i}', {i}.123456789, UNHEX(MD5({i})), "
            f"'{{\"k\": {i}, \"exact\": 12345678901234567890.000000001}}', "
            f"'2026-11-30 11:33:35.{i % 1000000:06d}', '2026-11-30 11:33:35.5', '2026-11-30', "
            f"{i / 3.0!r}, {i % 2}, 'large', 'a,c', 18446744073709551615)"
            for i in range(chunk * 500 + 1, chunk * 500 + 501))
        sql.run(f"INSERT INTO t VALUES {values}")
        for _ in range(25):                                    # the writer meanwhile
            i = rnd.randint(1, chunk * 500 + 500)
            if rnd.random() < 0.7:
                sql.run("UPDATE t SET v = %s, n = n + 0.000000001, j = JSON_SET(j, '$.w', 1.10) "
                        "WHERE id = %s", args=(f"u{i}", i))
            else:
                sql.run("DELETE FROM t WHERE id = %s", args=(i,))
    sql.run("INSERT INTO t (id) VALUES (-1)", "INSERT INTO flush VALUES (1)")
    until(proc, lambda: has_row(target_db, "crm.t", -1), 60, "the sentinel in the target")
    assert len(pg_rows(target_db)) > 19000
    assert pg_rows(target_db) == my_rows(sql)


def test_an_ambiguous_rename_holds_the_backend_until_the_target_is_changed(
        pg_db, target_db, lapidus_factory):
    """Without the DDL capture a rename arrives as a relation message in which one column
    went and another came: refused (held, named) until the operator changes the target."""
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text)",
              "CREATE TABLE flush (id int PRIMARY KEY)")
    target_db.sql("CREATE TABLE t (id int PRIMARY KEY, a text)")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput")],
        "plugins": sync_plugin(target_db)})
    until(proc, lambda: backend_status(proc.config_path).get("state") == "RUNNING", 30,
          "the backend to run")
    pg_db.sql("INSERT INTO t VALUES (1, 'kept')", "ALTER TABLE t RENAME COLUMN a TO title",
              "INSERT INTO t VALUES (2, 'new')", "INSERT INTO flush VALUES (1)")
    held = until(proc, lambda: (backend_status(proc.config_path).get("undeliverable") or {})
                 .get("sync"), 30, "the schema change to be refused")
    assert "cannot be told apart" in held["error"] and "install-ddl-capture" in held["fix"]
    assert target_db.sql("SELECT id, a FROM t") == [(1, "kept")]   # nothing after it
    target_db.sql("ALTER TABLE t RENAME COLUMN a TO title")        # the operator's fix
    finish(proc, pg_db, target_db, "INSERT INTO t VALUES (-1, 'end')")
    assert target_db.sql("SELECT id, title FROM t ORDER BY id") == \
        [(-1, "end"), (1, "kept"), (2, "new")]
