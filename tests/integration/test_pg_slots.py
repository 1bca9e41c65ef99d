"""Replication-slot safety and secrets: an idle slot advances, passwords stay out of argv and logs."""

from __future__ import annotations

import uuid

import psutil
import pytest

from tests.conftest import wait_until
from tests.integration.conftest import pg_backend, pg_connect


def retained(db, slot):
    rows = db.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
                  "FROM pg_replication_slots WHERE slot_name = %s", args=(slot,))
    return rows[0][0]


# serial: an idle slot moves only past the server's oldest running transaction, and other
# tests' snapshots hold theirs open for seconds
@pytest.mark.serial
def test_idle_slot_advances_while_other_databases_write(lapidus_factory, pg_db):
    """No change in the captured database, lots of WAL elsewhere: the slot must not pin it.

    pg_recvlogical confirms the server's WAL end from keepalives once it has fsynced, so no
    heartbeat writes are needed in the captured database."""
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"')
    slot = f"{pg_db.name}_pg"
    other = f"lapidus_it_other_{uuid.uuid4().hex[:8]}"
    admin = pg_connect()
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {other}")
    try:
        conn = pg_connect(other)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE big (x text)")
            cur.execute("INSERT INTO big SELECT repeat('x', 100) FROM generate_series(1, 200000)")
        conn.close()
        written = 20 << 20
        assert retained(pg_db, slot) > written      # the burst is there to be released
        # The slot moves once the WAL has a record of the running transactions, which
        # PostgreSQL writes every 15 s, and at a checkpoint: one now, not to wait for it.
        with admin.cursor() as cur:
            cur.execute("CHECKPOINT")
        wait_until(lambda: retained(pg_db, slot) < written, 60, interval=1.0,
                   message="idle slot to release the other database's WAL")
        assert proc.events() == []
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {other} WITH (FORCE)")
        admin.close()


def test_password_is_neither_in_argv_nor_in_logs(lapidus_factory, pg_db):
    secret = "s3cret-" + uuid.uuid4().hex
    proc = lapidus_factory({"backends": [pg_backend(pg_db, password=secret)],
                            "log": {"format": "json", "level": "debug"},
                            "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"')
    pid = proc.recvlogical_pid()
    cmdline = " ".join(psutil.Process(pid).cmdline())
    assert "--slot" in cmdline and secret not in cmdline
    for child in proc.children():
        assert secret not in " ".join(child.cmdline())
    assert secret not in proc.log()
    assert proc.terminate() == 0
    assert secret not in proc.log()
