"""Fixtures and helpers of the sync sink's integration tests (tests/integration/test_sync_*.py):
a throw-away target database, the plugin entry, waits with the supervisor's status in the
failure message, and the writer and trigger of the exactly-once tests.

Every wait is on a condition with a deadline.  A test ends its load with a sentinel row and
waits for it in the target: the worker reads where each source transaction ends, so the last
one is applied without a later write (docs/sync.md; tests/integration/test_sync_boundaries.py).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import uuid

import psutil
import pytest

from tests.conftest import wait_until
from tests.integration.conftest import backend_status, pg_connect, throwaway_database


@pytest.fixture
def target_db():
    yield from throwaway_database(f"lapidus_it_sync_{uuid.uuid4().hex[:8]}")


def sync_plugin(target, **options):
    return {"sync": {"dsn": f"host=127.0.0.1 port=5432 user=postgres dbname={target.name}",
                     **options}}


def until(proc, predicate, timeout, what):
    try:
        return wait_until(predicate, timeout, message=what)
    except pytest.fail.Exception:
        pytest.fail(f"timed out after {timeout}s waiting for {what}; status: "
                    f"{backend_status(proc.config_path)}\nlog:\n{proc.log()[-4000:]}")


def running(proc, timeout=30):
    until(proc, lambda: backend_status(proc.config_path).get("state") == "RUNNING", timeout,
          "the backend to run")


def snapshot_done(proc, timeout=60, what="the snapshot to finish"):
    until(proc, lambda: (backend_status(proc.config_path).get("snapshot") or {})
          .get("state") == "done", timeout, what)


def held(proc, what="the schema change to be refused"):
    """The sink's refusal the backend is held at (``on_undeliverable = "hold"``): its
    ``error`` and ``fix``, once status shows it."""
    return until(proc, lambda: (backend_status(proc.config_path).get("undeliverable") or {})
                 .get("sync"), 30, what)


def has_row(db, table, key):
    try:
        return bool(db.sql(f"SELECT 1 FROM {table} WHERE id = {key}"))
    except Exception:
        db.conn.rollback() if not db.conn.autocommit else None
        return False


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


# A PostgreSQL table of many types, and rows of every one of them
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


class LoadThread(threading.Thread):
    """Writes on a source (its own connection) until stopped; ``stop()`` fails the test with
    the writer's error, if it had one.  Subclasses write one step in ``step(cur)``.  ``pause``
    (seconds) paces the steps: a writer at full speed makes each snapshot chunk wait behind
    hundreds of one-row transactions, which tests nothing more and takes minutes."""

    def __init__(self, connect, seed, pause: float = 0.0):
        super().__init__(daemon=True)
        self.connect, self.random = connect, random.Random(seed)
        self.halt, self.done, self.error = threading.Event(), 0, None
        self.pause = pause
        self.conn = None

    def run(self):
        self.conn = self.connect()
        try:
            with self.conn.cursor() as cur:
                while not self.halt.is_set():
                    self.step(cur)
                    self.done += 1
                    if self.pause:
                        self.halt.wait(self.pause)
        except Exception as exc:
            self.error = exc
        finally:
            self.conn.close()

    def stop(self):
        self.halt.set()
        self.join(10)
        assert self.error is None, self.error


class Writer(LoadThread):
    """Random updates, deletes and inserts on :data:`TYPED`'s ``t`` (autocommit)."""

    def __init__(self, db, top, seed=11, pause=0.0):
        super().__init__(lambda: pg_connect(db.name), seed, pause)
        self.top = top

    def step(self, cur):
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


# A target trigger that counts every row change applied to {table}: a change applied twice
# shows as a count above the row's own version + 1.
TRIGGER = """
CREATE TABLE applied (id int PRIMARY KEY, n int NOT NULL);
CREATE FUNCTION count_applied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO applied VALUES (NEW.id, 1) ON CONFLICT (id) DO UPDATE SET n = applied.n + 1;
  RETURN NEW;
END $$;
CREATE TRIGGER count_applied AFTER INSERT OR UPDATE ON {table} FOR EACH ROW
  EXECUTE FUNCTION count_applied();
"""


def applied_twice(query, table="t"):
    """Rows of ``table`` whose trigger count says a change was applied more than once;
    ``query(sql)`` gives the target's rows."""
    return query(f"SELECT t.id, t.version, a.n FROM {table} t JOIN applied a USING (id) "
                 f"WHERE a.n <> t.version + 1")


class TxWriter(LoadThread):
    """Transactions of five inserts (one ``tx`` value) plus one update that bumps a row's
    ``version``: a row's every change is counted by ``version``.  ``connect()`` gives a
    connection outside autocommit (psycopg2 or pymysql: the SQL is the same)."""

    def __init__(self, connect, seed=5):
        super().__init__(connect, seed)

    def step(self, cur):
        tx = self.done + 1
        base = tx * 5
        cur.execute("INSERT INTO t (id, v, n, tx) VALUES " + ", ".join(
            f"({i}, 'x', {i * 0.01:.2f}, {tx})" for i in range(base, base + 5)))
        cur.execute("UPDATE t SET version = version + 1, n = n + 1 WHERE id = %s",
                    (self.random.randint(5, base + 4),))
        self.conn.commit()


def transactions_on(db):
    """A ``connect()`` for :func:`kill_during_load`: a connection to the PostgreSQL ``db``
    outside autocommit."""
    def connect():
        conn = pg_connect(db.name)
        conn.autocommit = False
        return conn
    return connect


def kill_during_load(proc, connect, query, names, table="t"):
    """Run a :class:`TxWriter` on the source (``connect()``: its connection) and ``kill -9``
    each process of ``names`` in turn while its rows arrive in the target's ``table``, sampling
    the target (``query(sql)`` gives its rows) all along.  Returns the samples' torn
    transactions (``tx`` values with other than five rows: half a source transaction
    visible), which must be none."""
    torn = []

    def sample():
        # the 6-change transactions are cut by small batches: a cut one must never show
        torn.extend(query(f"SELECT tx, count(*) FROM {table} WHERE tx > 0 GROUP BY tx "
                          f"HAVING count(*) <> 5"))
        return query(f"SELECT count(*) FROM {table}")[0][0]
    writer = TxWriter(connect)
    writer.start()
    try:
        before = 0
        for name in names:
            before = sample()
            until(proc, lambda: sample() > before + 200, 30, "rows applied before the kill")
            os.kill(child(proc, name), signal.SIGKILL)
        until(proc, lambda: sample() > before + 400, 40, "rows applied after the kills")
    finally:
        writer.stop()
    return torn


def assert_once_through_the_kills(proc, torn, query, table="t"):
    """After :func:`kill_during_load` and the sentinel: both processes were killed and
    restarted, no sample saw half a transaction, the trigger saw no change applied twice."""
    assert not torn, f"half a source transaction was visible: {torn[:5]}"
    assert backend_status(proc.config_path)["restarts"] >= 1       # the worker was killed
    assert proc.log().count('"child": "dispatcher", "pid"') >= 2    # ... and the dispatcher
    twice = applied_twice(query, table)
    assert not twice, f"rows applied more than once: {twice[:10]}"
