"""A hundred tenants on one box: 50 PostgreSQL and 50 MariaDB backends in one Lapidus.

They all start, every one streams (a row written into each arrives, once), `lapidusctl status`
sums them up in one line, and a SIGTERM stops them all cleanly (exit 0, no error logged, every
slot released). scripts/setup-local sizes the servers for this (slots, WAL senders,
connections).
"""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import ctl, drop_slots_of, pg_connect
from tests.integration.mysql_fixtures import HOST, PORT, ROOT, ROOT_PASSWORD, root_connection

# serial: a hundred backends hold half the shared servers' slots and connections
pytestmark = pytest.mark.serial

PER_SERVER = 50
SERVER_ID_BASE = 4_500_000


@pytest.fixture
def tenants():
    """50 PostgreSQL and 50 MariaDB databases, each with a table ``items``; dropped after."""
    tag = uuid.uuid4().hex[:6]
    pg_names = [f"lapidus_it_t{tag}_{i}" for i in range(PER_SERVER)]
    my_names = [f"lapidus_it_t{tag}_{i}" for i in range(PER_SERVER)]
    admin = pg_connect()
    my = root_connection()
    try:
        for name in pg_names:
            with admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE {name}")
            conn = pg_connect(name)
            with conn.cursor() as cur:
                cur.execute("CREATE TABLE items (id int PRIMARY KEY, tenant text)")
            conn.close()
        with my.cursor() as cur:
            for name in my_names:
                cur.execute(f"CREATE DATABASE {name}")
                cur.execute(f"CREATE TABLE {name}.items (id INT PRIMARY KEY, tenant TEXT)")
        yield pg_names, my_names
    finally:
        for name in pg_names:
            drop_slots_of(admin, name)
            with admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        with my.cursor() as cur:
            for name in my_names:
                cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()
        my.close()


def test_a_hundred_backends_start_stream_and_stop_cleanly(tenants, lapidus_factory, tmp_path):
    pg_names, my_names = tenants
    backends = [{"name": f"pg{i}", "type": "postgresql", "host": "127.0.0.1", "port": 5432,
                 "user": "postgres", "database": name, "slot": f"{name}_s"}
                for i, name in enumerate(pg_names)]
    backends += [{"name": f"my{i}", "type": "mysql", "host": HOST, "port": PORT, "user": ROOT,
                  "password": ROOT_PASSWORD, "database": name, "server_id": SERVER_ID_BASE + i}
                 for i, name in enumerate(my_names)]
    proc = lapidus_factory({"backends": backends, "plugins": {"stdout": {}}})

    def summary():
        code, out, _ = ctl(proc.config_path, "status")
        lines = out.strip().splitlines() if code == 0 else []
        everyone = f"{2 * PER_SERVER} backends: {2 * PER_SERVER} RUNNING"
        return lines[-1] if lines and lines[-1] == everyone else None
    wait_until(summary, 180, message="every backend RUNNING")

    for i, name in enumerate(pg_names):
        conn = pg_connect(name)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO items VALUES (%s, %s)", (i, f"pg{i}"))
        conn.close()
    my = root_connection()
    with my.cursor() as cur:
        for i, name in enumerate(my_names):
            cur.execute(f"INSERT INTO {name}.items VALUES (%s, %s)", (i, f"my{i}"))
    my.commit()
    my.close()

    def tenants_seen():
        events = [e for e in proc.events() if e.get("table") == "items"]
        return events if len(events) >= 2 * PER_SERVER else None
    events = wait_until(tenants_seen, 120, message="a row from every backend")
    assert sorted(e["item"]["tenant"] for e in events) == sorted(
        [f"pg{i}" for i in range(PER_SERVER)] + [f"my{i}" for i in range(PER_SERVER)])
    assert all(e["item"]["tenant"] == e["backend"] for e in events)

    assert proc.terminate(timeout=60) == 0
    log = proc.records()
    assert not [e for e in log if e.get("level") == "error"]
    admin = pg_connect()
    with admin.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE active AND database = "
                    "ANY(%s)", (pg_names,))
        assert cur.fetchone()[0] == 0
    admin.close()
