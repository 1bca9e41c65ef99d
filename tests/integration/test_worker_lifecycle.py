"""Worker stops and restarts through the real supervisor: SIGTERM ends every worker (streaming,
or waiting for a database nobody can reach) before the supervisor's stop timeout would kill
it; a ``temporary_slot`` backend stopped and started again goes on after a ``gap`` event; an
idle worker sleeps until its next keep-alive.

No timings are asserted: a worker that ignored SIGTERM would be killed at ``stop_timeout``,
which the log shows as a non-zero exit code.
"""

from __future__ import annotations

import time

import psutil
import pytest

from tests.conftest import wait_until
from tests.integration.conftest import backend_status, pg_backend
from tests.integration.mongo_fixtures import free_port, mongo  # noqa: F401 (fixture)

pytest_plugins = ["tests.integration.mysql_fixtures"]

SUPERVISOR = {"stop_timeout": 4, "max_restarts": 2, "restart_window": 60}


def assert_each_worker_stopped(proc, names):
    assert proc.terminate(timeout=60) == 0
    stopped = {r["backend"]: r["exit_code"] for r in proc.records()
               if r.get("event") == "stopped" and r.get("backend")}
    assert stopped == {name: 0 for name in names}, proc.log()[-3000:]
    assert "Traceback" not in proc.log()


def test_sigterm_ends_streaming_workers_of_every_type(lapidus_factory, pg_db, sql, mongo):
    from tests.integration.mysql_fixtures import lapidus_backend

    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    backends = [pg_backend(pg_db), lapidus_backend(),
                {"name": "cms", "type": "mongo", "uri": mongo.uri, "database": mongo.database}]
    proc = lapidus_factory({"backends": backends, "plugins": {"stdout": {}},
                            "supervisor": SUPERVISOR})
    for name in ("pg", "crm", "cms"):
        wait_until(lambda: backend_status(proc.config_path, name).get("state") == "RUNNING",
                   60, message=f"{name} RUNNING; log:\n{proc.log()[-3000:]}")
    assert_each_worker_stopped(proc, ("pg", "crm", "cms"))


def test_sigterm_ends_workers_waiting_for_unreachable_databases(lapidus_factory, pg_db):
    from tests.integration.mysql_fixtures import lapidus_backend

    backends = [pg_backend(pg_db, port=free_port()),
                lapidus_backend(port=free_port()),
                {"name": "cms", "type": "mongo", "uri": f"mongodb://127.0.0.1:{free_port()}/",
                 "database": "shop"}]
    proc = lapidus_factory({"backends": backends, "plugins": {"stdout": {}},
                            "supervisor": SUPERVISOR})
    for name in ("pg", "crm", "cms"):
        wait_until(lambda: backend_status(proc.config_path, name).get("state") == "WAITING",
                   60, message=f"{name} WAITING; log:\n{proc.log()[-3000:]}")
    assert_each_worker_stopped(proc, ("pg", "crm", "cms"))


def test_temporary_slot_after_a_stop_goes_on_after_a_gap_event(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    config = {"backends": [pg_backend(pg_db, temporary_slot=True)], "plugins": {"stdout": {}},
              "supervisor": SUPERVISOR}
    proc = lapidus_factory(dict(config))
    wait_until(lambda: backend_status(proc.config_path, "pg").get("state") == "RUNNING", 60,
               message="RUNNING")
    pg_db.sql("INSERT INTO t VALUES (1)")
    proc.wait_events(1)
    assert proc.terminate() == 0
    wait_until(lambda: pg_db.slot(f"{pg_db.name}_pg") is None, 30, message="slot dropped")
    pg_db.sql("INSERT INTO t VALUES (2)")          # while no slot exists: not streamed

    again = lapidus_factory(dict(config))
    row = wait_until(lambda: (lambda r: r if r.get("state") in ("RUNNING", "FATAL") else None)(
        backend_status(again.config_path, "pg")), 60, message="started again")
    assert row["state"] == "RUNNING", row
    pg_db.sql("INSERT INTO t VALUES (3)")
    events = again.wait_events(3)
    assert [(e["type"], (e["pk"] or {}).get("id")) for e in events] == [
        ("insert", 1), ("gap", None), ("insert", 3)]
    gap = events[1]
    assert gap["item"]["reason"] == "temporary_slot" and gap["table"] is None
    assert "Traceback" not in again.log()


def test_scopes_that_match_nothing_are_warned_about_at_start(lapidus_factory, pg_db, sql):
    from tests.integration.mysql_fixtures import DATABASE, lapidus_backend

    pg_db.sql("CREATE TABLE orders (id int PRIMARY KEY)")
    sql.run("CREATE TABLE orders (id INT PRIMARY KEY)")
    backends = [pg_backend(pg_db, include_tables=["orders", "ordrs"]),
                lapidus_backend(include_tables=["orders", "itmes"]),
                lapidus_backend(name="nodb", database=f"{DATABASE}_missing")]
    proc = lapidus_factory({"backends": backends, "plugins": {"stdout": {}},
                            "supervisor": SUPERVISOR})
    for name in ("pg", "crm", "nodb"):
        wait_until(lambda: backend_status(proc.config_path, name).get("state") == "RUNNING",
                   60, message=f"{name} RUNNING; log:\n{proc.log()[-3000:]}")
    warnings = [(r.get("backend"), r["event"]) for r in proc.records()
                if r.get("level") == "warning"]
    assert any(b == "pg" and 'pattern "ordrs" matches no table' in e for b, e in warnings)
    assert any(b == "crm" and 'pattern "itmes" matches no table' in e for b, e in warnings)
    assert any(b == "nodb" and f'database "{DATABASE}_missing" does not exist' in e
               for b, e in warnings), warnings
    assert not any('"orders"' in e for _, e in warnings), warnings
    # the table a pattern was waiting for appears: its first change says so
    pg_db.sql("CREATE TABLE ordrs (id int PRIMARY KEY)", "INSERT INTO ordrs VALUES (1)")
    sql.run("CREATE TABLE itmes (id INT PRIMARY KEY)", "INSERT INTO itmes VALUES (1)")
    for name, pattern in (("pg", "ordrs"), ("crm", "itmes")):
        wait_until(lambda: any(r.get("backend") == name and r["event"].startswith(
            f'include_tables pattern "{pattern}" now matches table') for r in proc.records()),
            30, message=f"{name}: {pattern} now matches")
    assert_each_worker_stopped(proc, ("pg", "crm", "nodb"))


def test_the_workers_own_queries_have_timeouts(pg_db, sql):
    """A hung server cannot freeze a worker: its PostgreSQL session has a statement_timeout
    (and TCP keepalives), its MySQL query connection read and write timeouts."""
    from lapidus.workers.mysql.connection import QUERY_TIMEOUT, connect as mysql_connect
    from lapidus.workers.mysql.settings import settings_from
    from lapidus.workers.postgresql.catalog import connect as pg_connect_worker
    from tests.integration.mysql_fixtures import HOST, PORT, ROOT

    conn = pg_connect_worker({"database": pg_db.name}, "pg", "lapidus_test")
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW statement_timeout")
            assert cur.fetchone()[0] == "15s"
            cur.execute("SET statement_timeout = 200")
            with pytest.raises(Exception) as timed_out:
                cur.execute("SELECT pg_sleep(5)")
        assert getattr(timed_out.value, "pgcode", None) == "57014"
        assert conn.get_dsn_parameters().get("keepalives") == "1"
    finally:
        conn.close()
    my = mysql_connect(settings_from("crm", {"host": HOST, "port": PORT, "user": ROOT}))
    try:
        assert my._read_timeout == QUERY_TIMEOUT and my._write_timeout == QUERY_TIMEOUT
    finally:
        my.close()


@pytest.mark.serial      # counts wake-ups: other tests' commits wake its pg_recvlogical
def test_an_idle_postgresql_worker_sleeps_until_its_next_keep_alive(lapidus_factory, pg_db):
    """Nothing is written: the worker sleeps in its spool wait until its next keep-alive report
    (every 10 s with the default heartbeat_timeout), not once a second.  Counted as the
    worker's voluntary context switches (one per wake-up from a wait, one per server round
    trip) over 8 s: a keep-alive costs a few (the slot's retained-WAL query, the report), a
    once-a-second loop costs eight and more.

    PostgreSQL only: on a shared MariaDB server other work's binlog reaches every binlog
    reader and wakes it, so a MariaDB worker's count says nothing about Lapidus."""
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}})
    wait_until(lambda: backend_status(proc.config_path, "pg").get("state") == "RUNNING", 60,
               message="RUNNING")
    pg_db.sql("INSERT INTO t VALUES (1)")
    proc.wait_events(1)
    worker = psutil.Process(proc.worker_pid("pg"))
    time.sleep(2)           # the event's acknowledgement, checkpoint and stats
    before = worker.num_ctx_switches().voluntary
    time.sleep(8)
    woke = worker.num_ctx_switches().voluntary - before
    assert woke < 6, f"{woke} wake-ups of an idle worker in 8 s"
