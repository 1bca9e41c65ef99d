"""A database that is unreachable for longer than the supervisor's crash budget allows: the
worker waits for it by itself (WAITING), the backend never goes FATAL, nothing is counted as
a restart, and every row written before and during the outage arrives exactly once.

The database is made unreachable through a loopback TCP proxy that the test takes down and
brings back up (PostgreSQL, MariaDB), or a SecantusDB stopped and started on the same port
(MongoDB): the shared servers are never stopped.  Waiting is on conditions, never on time.
"""

from __future__ import annotations

import collections
import threading

from tests.conftest import wait_until
from tests.integration.conftest import backend_status, pg_backend, pg_connect
from tests.integration.outage_proxy import mysql_proxy, pg_proxy  # noqa: F401 (fixtures)

pytest_plugins = ["tests.integration.mysql_fixtures"]

# A crash budget the outage would exhaust many times over if waiting counted as crashes.
SUPERVISOR = {"max_restarts": 2, "restart_window": 60, "backoff_initial": 0.1,
              "backoff_max": 0.5}
OUTAGE_SECONDS = 8       # as the worker reports it: many times what the budget allows


def rows_by_id(proc, table: str):
    counts = collections.Counter(e["pk"]["id"] if "id" in (e.get("pk") or {}) else
                                 e["pk"].get("_id")
                                 for e in proc.events()
                                 if e.get("table") == table and e["type"] == "insert")
    return counts


def ride_out_an_outage(proc, name: str, write, take_down, bring_up, table: str, target: str):
    """Write rows 1-5, take the database down, see WAITING until the worker reports
    OUTAGE_SECONDS of waiting, while writing rows 6-10 (where the database allows it), bring
    it back, expect 1-15 exactly once each."""
    path = proc.config_path
    wait_until(lambda: backend_status(path, name).get("state") == "RUNNING", 60,
               message=f"RUNNING; log:\n{proc.log()[-3000:]}")
    write(range(1, 6))
    wait_until(lambda: len(rows_by_id(proc, table)) >= 5, 30, message="rows 1-5")
    take_down()

    def waiting():
        row = backend_status(path, name)
        return row if row.get("state") == "WAITING" else None

    row = wait_until(waiting, 60, message=f"WAITING; log:\n{proc.log()[-3000:]}")
    assert row["waiting_for"] == target, row
    assert "PostgreSQL" in row["last_error"] or "MySQL" in row["last_error"] \
        or "MongoDB" in row["last_error"], row
    write_during = write(range(6, 11), during_outage=True)

    def waited_long_enough():
        row = backend_status(path, name)
        assert row.get("state") not in ("FATAL", "BACKOFF"), row
        assert row.get("restarts", 0) == 0, row
        assert row.get("state") == "WAITING", row
        assert row["waiting_for"] == target, row
        return row["waiting_seconds"] >= OUTAGE_SECONDS

    wait_until(waited_long_enough, 60, interval=0.5, message="a long outage")
    bring_up()
    if write_during is False:          # the database could not take writes while down
        write(range(6, 11))
    write(range(11, 16))
    wait_until(lambda: len(rows_by_id(proc, table)) >= 15, 60,
               message=f"rows 1-15 after the outage; log:\n{proc.log()[-3000:]}")
    counts = rows_by_id(proc, table)
    assert sorted(counts) == list(range(1, 16)), counts
    assert set(counts.values()) == {1}, counts
    row = wait_until(lambda: (lambda r: r if r.get("state") == "RUNNING" else None)(
        backend_status(path, name)), 30, message="RUNNING again")
    assert row["restarts"] == 0 and "waiting_for" not in row, row
    records = proc.records()
    # MongoDB's driver may ride out the whole outage inside one attempt (server selection)
    assert any(r.get("event", "").startswith(("cannot reach the database; waiting",
                                              "lost the connection to the database"))
               for r in records)
    assert "Traceback" not in proc.log()
    assert proc.terminate() == 0


def test_postgresql_outage_is_waited_out(lapidus_factory, pg_db, pg_proxy):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    backend = pg_backend(pg_db, port=pg_proxy.port, connect_timeout=2,
                         reconnect_max_delay=1)
    proc = lapidus_factory({"backends": [backend], "plugins": {"stdout": {}},
                            "supervisor": SUPERVISOR})

    def write(ids, during_outage=False):
        # the direct connection (not through the proxy) still works while Lapidus's is cut
        for i in ids:
            pg_db.sql(f"INSERT INTO t VALUES ({i})")
        return True

    ride_out_an_outage(proc, "pg", write, pg_proxy.down, pg_proxy.up, "t", pg_proxy.address)


def test_missing_postgresql_role_is_fatal_and_named(lapidus_factory, pg_db):
    backend = pg_backend(pg_db, user="lapidus_no_such_role")
    proc = lapidus_factory({"backends": [backend, dict(pg_backend(pg_db, name="ok"))],
                            "plugins": {"stdout": {}}, "supervisor": SUPERVISOR})
    row = wait_until(lambda: (lambda r: r if r.get("state") == "FATAL" else None)(
        backend_status(proc.config_path, "pg")), 60, message=f"FATAL; log:\n{proc.log()[-3000:]}")
    assert 'no role "lapidus_no_such_role"' in row["last_error"], row
    assert "cannot reach" not in row["last_error"], row
    assert row["restarts"] == 0, row
    assert "Traceback" not in proc.log()


def test_mariadb_outage_is_waited_out(lapidus_factory, sql, mysql_proxy):
    from tests.integration.mysql_fixtures import lapidus_backend

    sql.run("CREATE TABLE t (id INT PRIMARY KEY)")
    backend = lapidus_backend(port=mysql_proxy.port, connect_timeout=2, reconnect_max_delay=1)
    proc = lapidus_factory({"backends": [backend], "plugins": {"stdout": {}},
                            "supervisor": SUPERVISOR})

    def write(ids, during_outage=False):
        for i in ids:
            sql.run(f"INSERT INTO t VALUES ({i})")
        return True

    ride_out_an_outage(proc, "crm", write, mysql_proxy.down, mysql_proxy.up, "t",
                       mysql_proxy.address)


def test_mongodb_outage_is_waited_out(lapidus_factory, tmp_path):
    from secantus import SecantusDBServer
    import pymongo

    from tests.integration.mongo_fixtures import free_port, stop_secantus

    port = free_port()
    storage = str(tmp_path / "secantus")

    def start():
        server = SecantusDBServer(host="127.0.0.1", port=port, storage_path=storage)
        server.start()
        return server

    servers = [start()]
    try:
        uri = f"mongodb://127.0.0.1:{port}/"
        client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=20_000)
        client.shop.t.insert_one({"_id": 0})        # the collection exists before streaming
        backend = {"name": "cms", "type": "mongo", "uri": uri, "database": "shop",
                   "reconnect_max_delay": 1}
        proc = lapidus_factory({"backends": [backend], "plugins": {"stdout": {}},
                                "supervisor": SUPERVISOR})

        def write(ids, during_outage=False):
            if during_outage:
                return False                       # nobody can write to a stopped server
            client.shop.t.insert_many([{"_id": i} for i in ids])
            return True

        def take_down():
            stop_secantus(servers.pop())

        ride_out_an_outage(proc, "cms", write, take_down, lambda: servers.append(start()),
                           "t", f"127.0.0.1:{port}")
    finally:
        for server in servers:
            stop_secantus(server)


LOAD_ROWS = 6000


def outage_under_load(proc, name: str, load, proxy):
    """Rows inserted without pause by ``load`` (ids 0..LOAD_ROWS-1); the proxy goes down
    after 1,500 have arrived, comes back after some seconds of WAITING; every row arrives,
    exactly once, first sightings in commit order, no restart counted."""
    path = proc.config_path
    wait_until(lambda: backend_status(path, name).get("state") == "RUNNING", 60,
               message="RUNNING")
    writer = threading.Thread(target=load, daemon=True)
    writer.start()

    def arrived():
        return collections.Counter(e["pk"]["id"] for e in proc.events()
                                   if e["type"] == "insert")

    wait_until(lambda: len(arrived()) > 1500, 60, message="1,500 rows before the outage")
    proxy.down()
    wait_until(lambda: backend_status(path, name).get("waiting_seconds", 0) > 3, 60,
               message=f"some seconds of WAITING; log:\n{proc.log()[-3000:]}")
    proxy.up()
    writer.join(120)
    assert not writer.is_alive()
    wait_until(lambda: len(arrived()) >= LOAD_ROWS, 120,
               message=f"all {LOAD_ROWS} rows; log:\n{proc.log()[-3000:]}")
    counts = arrived()
    assert set(counts) == set(range(LOAD_ROWS))
    assert set(counts.values()) == {1}, {k: v for k, v in counts.items() if v > 1}
    order = [e["pk"]["id"] for e in proc.events() if e["type"] == "insert"]
    assert order == sorted(order)
    assert backend_status(path, name)["restarts"] == 0
    assert "Traceback" not in proc.log()


def test_postgresql_outage_under_load_loses_and_repeats_nothing(lapidus_factory, pg_db,
                                                               pg_proxy):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db, port=pg_proxy.port,
                                                    reconnect_max_delay=1)],
                            "plugins": {"stdout": {}}, "supervisor": SUPERVISOR})

    def load():
        conn = pg_connect(pg_db.name)
        with conn.cursor() as cur:
            for i in range(LOAD_ROWS):
                cur.execute("INSERT INTO t VALUES (%s)", (i,))
        conn.close()

    outage_under_load(proc, "pg", load, pg_proxy)


def test_mariadb_outage_under_load_loses_and_repeats_nothing(lapidus_factory, sql,
                                                            mysql_proxy):
    from tests.integration.mysql_fixtures import DATABASE, lapidus_backend, root_connection

    sql.run("CREATE TABLE t (id INT PRIMARY KEY)")
    proc = lapidus_factory({"backends": [lapidus_backend(port=mysql_proxy.port,
                                                         reconnect_max_delay=1)],
                            "plugins": {"stdout": {}}, "supervisor": SUPERVISOR})

    def load():
        # ten rows a transaction: a reconnect may fall inside one
        conn = root_connection(database=DATABASE)
        conn.autocommit(False)
        with conn.cursor() as cur:
            for i in range(LOAD_ROWS):
                cur.execute("INSERT INTO t VALUES (%s)", (i,))
                if i % 10 == 9:
                    conn.commit()
        conn.commit()
        conn.close()

    outage_under_load(proc, "crm", load, mysql_proxy)
