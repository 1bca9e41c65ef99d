"""Where source transactions end: the sync sink applies the last one of a delivery at once when
the worker read its end, and never shows half of one (docs/sync.md).

Through the real supervisor, a PostgreSQL source and a MariaDB source, each into PostgreSQL:

* one transaction, then nothing: the target shows all of it without any later write, for a
  transaction smaller than ``batch_size``, one of exactly ``batch_size`` changes (its COMMIT
  read in a batch of its own, without events) and one whose last rows are of an excluded table;
* transactions many times larger than ``batch_size`` (split over many batches), one after the
  other: every sample of the target taken while they arrive shows each of them whole or not
  at all, and the last one arrives without a later write.

And the sink alone against a real target: a replay after a crash that ends before the held
transaction (its events in the target already) leaves that transaction held; its end applies
it; the dispatcher's mark (the last record again, at the boundary) applies a held one.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, NamedTuple

import pytest


from lapidus.events import Event, to_record
from lapidus.sinks.base import Delivery
from lapidus.sinks.sync import SyncSink
from tests.integration.conftest import pg_backend
from tests.integration.sync_fixtures import (LoadThread, running, sync_plugin,
                                             transactions_on, until)

pytest_plugins = ["tests.integration.mysql_fixtures", "tests.integration.sync_fixtures"]
pytestmark = pytest.mark.integration

BATCH = 5           # the backends' batch_size
TABLE = "CREATE TABLE {}t (id int PRIMARY KEY, v text, tx int)"
OTHER = "CREATE TABLE other (id int PRIMARY KEY)"          # excluded from the stream


def transactions(tx, rows, other=0):
    """The statements of source transaction ``tx``: ``rows`` inserts into ``t`` (ids tx*1000
    up), in two statements, then ``other`` rows into the excluded table."""
    first, half = tx * 1000, rows // 2
    out = ["INSERT INTO t VALUES " + ", ".join(f"({i}, 'r', {tx})" for i in
                                                 range(first, first + half)),
           "INSERT INTO t VALUES " + ", ".join(f"({i}, 'r', {tx})" for i in
                                                 range(first + half, first + rows))]
    if other:
        out.append("INSERT INTO other VALUES " + ", ".join(f"({tx * 1000 + i})"
                                                           for i in range(other)))
    return [s for s in out if not s.endswith("VALUES ")]


def each_arrives_without_a_later_write(proc, run, count):
    """Commit each transaction of the cases and wait, with nothing written after it, until
    the target shows all its rows (``count(tx)``: the target's rows of ``tx``)."""
    cases = [(1, 3, 0), (2, BATCH, 0), (3, 2 * BATCH + 2, 0), (4, 4, 3)]
    for tx, rows, other in cases:
        run(transactions(tx, rows, other))
        until(proc, lambda: count(tx) == rows, 10,
              f"transaction {tx} ({rows} rows) in the target without a later write")


class LargeTransactions(LoadThread):
    """``total`` transactions of ``rows`` inserts and an update each (``tx`` = its number),
    then it stops by itself.  ``connect()``: a connection outside autocommit."""

    def __init__(self, connect, total, rows):
        super().__init__(connect, seed=3)
        self.total, self.rows = total, rows

    def step(self, cur):
        tx = self.done + 1
        for statement in transactions(tx, self.rows):
            cur.execute(statement)
        cur.execute(f"UPDATE t SET v = 'u' WHERE id = {tx * 1000}")
        self.conn.commit()
        if tx == self.total:
            self.halt.set()


def arrive_whole(proc, connect, query, table, total=12, rows=40):
    """Write :class:`LargeTransactions` (each ``rows`` inserts and an update: many batches
    of ``BATCH``) and sample the target's ``table`` until the last one is there, with no
    write after it.  Returns the torn transactions the samples saw (must be none)."""
    torn = []

    def complete():
        torn.extend(query(f"SELECT tx, count(*) FROM {table} GROUP BY tx "
                          f"HAVING count(*) <> {rows}"))
        return query(f"SELECT count(*) FROM {table}")[0][0] == total * rows
    writer = LargeTransactions(connect, total, rows)
    writer.start()
    try:
        until(proc, complete, 60, "every large transaction in the target")
    finally:
        writer.join(30)
    assert writer.error is None, writer.error
    assert query(f"SELECT count(*) FROM {table} WHERE v = 'u'")[0][0] == total
    return torn


# -- through the supervisor, from each source -------------------------------------------

class Synced(NamedTuple):
    """A running Lapidus syncing a source's ``t`` into the target's ``table``: ``run``
    commits statements as one source transaction, ``connect()`` gives a connection outside
    autocommit, ``source_rows(sql)`` the source's rows."""

    proc: Any
    table: str
    run: Callable
    connect: Callable
    source_rows: Callable


@pytest.fixture(params=["postgresql", "mariadb"])
def synced(request, target_db, lapidus_factory):
    if request.param == "postgresql":
        pg_db = request.getfixturevalue("pg_db")
        pg_db.sql(TABLE.format(""), OTHER)
        target_db.sql(TABLE.format(""))
        backend = pg_backend(pg_db, decoder="pgoutput", batch_size=BATCH,
                             exclude_tables=["other"])
        synced = Synced(None, "t", lambda statements: pg_db.sql("BEGIN", *statements, "COMMIT"),
                        transactions_on(pg_db), pg_db.sql)
    else:
        from tests.integration.mysql_fixtures import database_connection, lapidus_backend
        sql = request.getfixturevalue("sql")
        sql.run(TABLE.format(""), OTHER)
        target_db.sql("CREATE SCHEMA crm", TABLE.format("crm."))
        backend = lapidus_backend("crm", batch_size=BATCH, exclude_tables=["other"])
        synced = Synced(None, "crm.t",
                        lambda statements: sql.run("START TRANSACTION", *statements, "COMMIT"),
                        lambda: database_connection(autocommit=False), sql.rows)
    proc = lapidus_factory({"backends": [backend], "plugins": sync_plugin(target_db)})
    running(proc)
    return synced._replace(proc=proc)


def test_a_transaction_then_nothing_is_applied_at_once(synced, target_db):
    each_arrives_without_a_later_write(
        synced.proc, synced.run,
        lambda tx: target_db.sql(f"SELECT count(*) FROM {synced.table} WHERE tx = {tx}")[0][0])
    assert target_db.sql("SELECT count(*) FROM lapidus_sync_pending")[0][0] == 0


def test_transactions_larger_than_a_batch_are_never_half_visible(synced, target_db):
    torn = arrive_whole(synced.proc, synced.connect, target_db.sql, synced.table)
    assert not torn, f"half a source transaction was visible: {torn[:5]}"
    query = "SELECT id, v, tx FROM {} ORDER BY id"
    assert target_db.sql(query.format(synced.table)) == synced.source_rows(query.format("t"))


# -- the sink alone ----------------------------------------------------------------------

def change(lsn, index, row):
    """Insert ``row`` as change ``index`` of the PostgreSQL transaction committed at ``lsn``."""
    position = f"0/{lsn:X}"
    return to_record(Event(f"pg:{position}:{index}", "insert", "pg", "public", "t",
                           {"id": row}, {"id": row, "v": "r", "tx": lsn}, None, position,
                           str(lsn), "2026-12-03T15:00:00.000Z"))


class Target:
    """A SyncSink as the dispatcher drives it; ``restart()`` makes a new one (a crash: the
    new sink knows only what the target holds)."""

    def __init__(self, db):
        self.db = db
        self.sink = None
        self.restart()

    def restart(self):
        if self.sink is not None:
            asyncio.run(self.sink.close())
        self.sink = SyncSink(sync_plugin(self.db)["sync"], "pg")
        asyncio.run(self.sink.start())

    def send(self, records, at_boundary):
        asyncio.run(self.sink.send(Delivery(records, at_boundary)))

    def rows(self):
        return [row for (row,) in self.db.sql("SELECT id FROM t ORDER BY id")]

    def held(self):
        return self.sink.health()["held_events"]


def test_the_sink_applies_a_held_transaction_only_once_its_end_is_shown(target_db):
    target_db.sql(TABLE.format(""))
    a1, a2, b3, b4, c5 = (change(0x100, 0, 1), change(0x100, 1, 2), change(0x200, 0, 3),
                          change(0x200, 1, 4), change(0x300, 0, 5))
    target = Target(target_db)
    try:
        target.send([a1, a2, b3], False)        # a batch cut inside B
        assert target.rows() == [1, 2] and target.held() == 1
        target.restart()
        # the worker restarted from an older checkpoint: its replay ends where A ends, at a
        # boundary, but that boundary is A's, not B's
        target.send([a1, a2], True)
        assert target.rows() == [1, 2] and target.held() == 1
        target.send([b3, b4], True)             # the rest of B, and its end
        assert target.rows() == [1, 2, 3, 4] and target.held() == 0
        target.send([c5], False)
        assert target.rows() == [1, 2, 3, 4] and target.held() == 1
        target.send([c5], True)                 # the dispatcher's mark: C ended after c5
        assert target.rows() == [1, 2, 3, 4, 5] and target.held() == 0
        assert target_db.sql("SELECT count(*) FROM lapidus_sync_pending")[0][0] == 0
    finally:
        asyncio.run(target.sink.close())
