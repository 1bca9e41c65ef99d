"""Fixtures and helpers of the sync sink's integration tests (tests/integration/test_sync_*.py):
a throw-away target database, the plugin entry, waits with the supervisor's status in the
failure message, and the writer and trigger of the exactly-once tests.

Every wait is on a condition with a deadline.  Source transactions become visible in the
target once a later transaction shows they are complete (docs/sync.md), so a test ends its
load with a sentinel row and one more write after it.
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
from tests.integration.conftest import PgDatabase, backend_status, drop_slots_of, pg_connect


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


def applied_twice(target, table="t"):
    """Rows of ``table`` whose trigger count says a change was applied more than once."""
    return target.sql(f"SELECT t.id, t.version, a.n FROM {table} t JOIN applied a USING (id) "
                      f"WHERE a.n <> t.version + 1")


class TxWriter(threading.Thread):
    """Transactions of five inserts (one ``tx`` value) plus one update that bumps a row's
    ``version``: a row's every change is counted by ``version``.  ``connect()`` gives a
    connection outside autocommit (psycopg2 or pymysql: the SQL is the same)."""

    def __init__(self, connect, seed=5):
        super().__init__(daemon=True)
        self.connect, self.random = connect, random.Random(seed)
        self.halt, self.tx, self.error = threading.Event(), 0, None

    def run(self):
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                while not self.halt.is_set():
                    self.tx += 1
                    base = self.tx * 5
                    cur.execute("INSERT INTO t (id, v, n, tx) VALUES " + ", ".join(
                        f"({i}, 'x', {i * 0.01:.2f}, {self.tx})" for i in range(base, base + 5)))
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


def kill_during_load(proc, target, names, table="t"):
    """``kill -9`` each process of ``names`` in turn while rows arrive in ``table``, sampling
    the target all along; returns the samples' torn transactions (``tx`` values with other
    than five rows: half a source transaction visible), which must be none."""
    torn = []

    def sample():
        # the 6-change transactions are cut by small batches: a cut one must never show
        torn.extend(target.sql(f"SELECT tx, count(*) FROM {table} WHERE tx > 0 GROUP BY tx "
                               f"HAVING count(*) <> 5"))
        return target.sql(f"SELECT count(*) FROM {table}")[0][0]
    before = 0
    for name in names:
        before = sample()
        until(proc, lambda: sample() > before + 200, 30, "rows applied before the kill")
        os.kill(child(proc, name), signal.SIGKILL)
    until(proc, lambda: sample() > before + 400, 40, "rows applied after the kills")
    return torn
