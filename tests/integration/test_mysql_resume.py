"""Integration: exact resume from checkpoints, first start, and positions the server lost.

The crash is simulated by closing a source after it handed out part of a transaction and
opening a fresh one with the checkpoint of the last batch, as the worker would after kill -9.
"""

from __future__ import annotations

import pytest

from lapidus.workers.base import BackendError
from lapidus.workers.mysql import MysqlSource
from lapidus.workers.mysql.source import FIRST_START_FILE

# The fixtures come in as a plugin, so test arguments do not shadow imported names.
pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import (  # noqa: E402
    gtid_sequence, read_count, read_to_marker, without_marker,
)

pytestmark = pytest.mark.integration

ROWS = 100
# ~300 bytes a row: the 100-row INSERT spans several binlog row events (8 KiB each), all
# sharing one GTID and one commit position.
BIG_INSERT = "INSERT INTO items VALUES " + ", ".join(
    f"({i}, REPEAT('x', 300))" for i in range(ROWS))


def take_exactly(source, count):
    """Read until exactly ``count`` events were handed out; the checkpoint of the last batch."""
    events, checkpoint = [], None
    while len(events) < count:
        batch = source.read(count - len(events), 0.2)
        events += batch.events
        checkpoint = batch.checkpoint
    assert len(events) == count
    return events, checkpoint


@pytest.fixture
def backlog(sql, open_source):
    """A start checkpoint, then one 100-row INSERT transaction and a marker row."""
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, pad VARCHAR(400))",
            "CREATE TABLE marker (id INT)")
    start = open_source(name="crm").read(10, 0.05).checkpoint
    sql.run(BIG_INSERT)
    gtid = sql.value("SELECT @@last_gtid")
    sql.run("INSERT INTO marker VALUES (1)")
    return start, gtid


@pytest.mark.parametrize("delivered", [1, 37, ROWS - 1, ROWS])
def test_multi_row_insert_resumes_after_the_last_delivered_row(backlog, open_source, delivered):
    start, gtid = backlog
    reference = without_marker(read_to_marker(open_source(start))[0])
    assert [e.id for e in reference] == [f"crm:{gtid}:{i}" for i in range(ROWS)]

    crashed = open_source(start)
    first, checkpoint = take_exactly(crashed, delivered)
    assert checkpoint["tx"] == gtid and checkpoint["index"] == delivered - 1
    # the transaction is not complete yet: the position stays before it (other sessions'
    # commits before it, of other tests, may have moved it on from the start)
    assert gtid_sequence(start["gtid"]) <= gtid_sequence(checkpoint["gtid"]) \
        < gtid_sequence(gtid)
    crashed.close()

    resumed = without_marker(read_to_marker(open_source(checkpoint))[0])
    assert first + resumed == reference                 # every row once, same ids, same values
    assert [e.item["id"] for e in resumed] == list(range(delivered, ROWS))


def test_resume_at_a_transaction_boundary_does_not_replay_it(sql, open_source):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY)", "CREATE TABLE marker (id INT)")
    first = open_source()
    sql.run("INSERT INTO items VALUES (1)")
    _, checkpoint = read_count(first, 1)
    assert "tx" not in checkpoint
    first.close()
    sql.run("INSERT INTO items VALUES (2)", "INSERT INTO marker VALUES (1)")
    events = without_marker(read_to_marker(open_source(checkpoint))[0])
    assert [e.item for e in events] == [{"id": 2}]


def test_first_start_begins_at_the_current_end(sql, open_source):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY)", "CREATE TABLE marker (id INT)",
            "INSERT INTO items VALUES (1)")
    source = open_source()
    sql.run("INSERT INTO items VALUES (2)", "INSERT INTO marker VALUES (1)")
    events = without_marker(read_to_marker(source)[0])
    assert [e.item for e in events] == [{"id": 2}]


def test_a_worker_restarted_before_its_first_checkpoint_resumes_at_the_first_start(
        sql, open_source, tmp_path):
    """A restart before the first checkpoint (kill -9, a lost dispatcher) must not begin at
    a new end of the binlog: the rows committed while the worker was down would be lost."""
    sql.run("CREATE TABLE items (id INT PRIMARY KEY)", "CREATE TABLE marker (id INT)")
    first = open_source()                      # started, then died before saving anything
    first.close()
    assert (tmp_path / "crm" / FIRST_START_FILE).exists()
    sql.run("INSERT INTO items VALUES (1)", "INSERT INTO marker VALUES (1)")

    again = open_source()                      # a new worker process: nothing in memory
    events, checkpoint = read_to_marker(again)
    assert [e.item for e in without_marker(events)] == [{"id": 1}]
    again.commit(checkpoint)                   # the worker saved a real checkpoint
    assert not (tmp_path / "crm" / FIRST_START_FILE).exists()


def test_purged_binlog_is_a_fatal_error_naming_gtid_file_and_options(sql, open_source,
                                                                     monkeypatch):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY)")
    checkpoint = open_source().read(10, 0.05).checkpoint
    sql.run("INSERT INTO items VALUES (1)")
    lost = sql.value("SELECT @@last_gtid")
    sql.run("FLUSH BINARY LOGS")
    newest = sql.rows("SHOW BINARY LOGS")[-1][0]

    # Purging binlogs on a shared server would break other readers; instead the server is
    # made to look as if every file but the newest was purged.  BINLOG_GTID_POS still runs
    # on the real server, for the real newest file.
    real_query = MysqlSource._query

    def as_if_purged(self, statement, args=None):
        rows = real_query(self, statement, args)
        return [r for r in rows if r[0] == newest] if statement == "SHOW BINARY LOGS" else rows
    monkeypatch.setattr(MysqlSource, "_query", as_if_purged)

    with pytest.raises(BackendError) as failure:
        open_source(checkpoint, name="late")
    message = str(failure.value)
    assert failure.value.fatal
    assert checkpoint["gtid"] in message and newest in message
    assert lost.rsplit("-", 1)[1] in message            # the first missing transaction
    assert "Recovering a lost position" in message and 'snapshot = "initial"' in message
    assert "checkpoint.json" in message and "late" in message


def test_checkpoint_the_server_never_had_is_a_fatal_error(sql, open_source):
    checkpoint = dict(open_source().read(10, 0.05).checkpoint, gtid="0-4242-3")
    with pytest.raises(BackendError) as failure:
        open_source(checkpoint, name="stranger")
    assert failure.value.fatal
    assert "0-4242-3" in str(failure.value) and "checkpoint.json" in str(failure.value)


def test_unusable_checkpoint_is_a_fatal_error_with_the_file_to_delete(open_source, sql):
    with pytest.raises(BackendError) as failure:
        open_source({"v": 1, "flavor": "mysql", "gtid": None, "file": "x", "pos": 4})
    assert failure.value.fatal and "mysql position" in str(failure.value)
    assert "checkpoint.json" in str(failure.value)
