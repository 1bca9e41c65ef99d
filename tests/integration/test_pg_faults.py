"""Faults in the middle of a load: nothing may be lost, repeats only as identical events."""

from __future__ import annotations

import collections
import os
import signal
import threading

import psutil
import pytest

from tests.conftest import wait_until
from tests.integration.conftest import pg_backend, pg_connect

ROWS = 50_000
ROWS_PER_TX = 100


def load_rows(database: str, rows: int = ROWS, per_tx: int = ROWS_PER_TX) -> threading.Thread:
    """Insert ``rows`` rows in transactions of ``per_tx``, from a thread with its own connection."""
    def run():
        conn = pg_connect(database)
        conn.autocommit = False
        with conn.cursor() as cur:
            for start in range(1, rows + 1, per_tx):
                cur.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%s, %s) g",
                            (start, min(rows, start + per_tx - 1)))
                conn.commit()
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def assert_complete_without_conflicting_repeats(events, rows: int) -> None:
    """Every row arrived; a row seen twice was the same event (same id, same content)."""
    by_row = collections.defaultdict(set)
    by_id = {}
    for event in events:
        assert event["type"] == "insert"
        by_row[event["pk"]["id"]].add(event["id"])
        if event["id"] in by_id:
            assert by_id[event["id"]] == event, "a repeated id carried different content"
        by_id[event["id"]] = event
    missing = set(range(1, rows + 1)) - set(by_row)
    assert not missing, f"{len(missing)} rows lost, e.g. {sorted(missing)[:10]}"
    assert all(len(ids) == 1 for ids in by_row.values()), "one row delivered under two ids"


def delivered_rows(proc) -> int:
    return len({e["pk"]["id"] for e in proc.events()})


@pytest.mark.parametrize("decoder", ["pgoutput", "wal2json"])
def test_kill_worker_then_pg_recvlogical_then_supervisor_mid_load_loses_nothing(
        decoder, lapidus_factory, pg_db, tmp_path):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = {"backends": [pg_backend(pg_db, decoder=decoder)], "plugins": {"stdout": {}},
              "supervisor": {"backoff_initial": 0.1, "max_restarts": 20}}
    proc = lapidus_factory(dict(config))
    proc.wait_log('"streaming"')
    loader = load_rows(pg_db.name)

    # 1. kill -9 the worker
    wait_until(lambda: delivered_rows(proc) > 5_000, 60, message="5k rows before killing")
    worker = proc.worker_pid("pg")
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: proc.log().count('"streaming"') >= 2, 30, message="worker restarted")

    # 2. kill -9 its pg_recvlogical (the one of the restarted worker)
    wait_until(lambda: delivered_rows(proc) > 15_000, 60, message="15k rows")
    os.kill(proc.recvlogical_pid(), signal.SIGKILL)
    wait_until(lambda: '"pg_recvlogical exited"' in proc.log(), 30)
    wait_until(lambda: proc.log().count("pg_recvlogical started") >= 3, 30,
               message="pg_recvlogical respawned")

    # 3. kill -9 the supervisor: its children must go by themselves, and free the slot
    wait_until(lambda: delivered_rows(proc) > 25_000, 60, message="25k rows")
    children = proc.children()
    assert any(c.name() == "pg_recvlogical" for c in children)
    proc.kill()
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"left behind after kill -9 of the supervisor: {alive}"
    wait_until(lambda: not pg_db.slot(f"{pg_db.name}_pg")[0], 10, message="slot released")

    # restart on the same state and output file; finish the load
    again = lapidus_factory(dict(config))
    loader.join(120)
    assert not loader.is_alive()
    wait_until(lambda: delivered_rows(again) >= ROWS, 120,
               message=f"all {ROWS} rows (have {delivered_rows(again)})")
    assert_complete_without_conflicting_repeats(again.events(), ROWS)
    assert "Traceback" not in again.log()
