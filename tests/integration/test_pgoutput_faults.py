"""pgoutput's relation messages across restarts (the kill test for both decoders is in
tests/integration/test_pg_faults.py).

A change refers to its table by OID, described once per replication connection by a relation
message that a restarted worker may resume after, and which DDL replaces.
"""

from __future__ import annotations

import json
import os
import signal


from tests.conftest import wait_until
from tests.integration.conftest import pg_backend

CATALOG_FALLBACK = "relation described from the current catalog"


def current_lsn(db) -> int:
    high, low = db.sql("SELECT pg_current_wal_lsn()::text")[0][0].split("/")
    return (int(high, 16) << 32) | int(low, 16)


def spooled(db, slot: str, lsn: int) -> bool:
    """pg_recvlogical fsynced everything up to ``lsn`` (it confirms only what is on disk)."""
    high, low = db.slot(slot)[2].split("/")
    return ((int(high, 16) << 32) | int(low, 16)) >= lsn


def wait_checkpoint_past(state_dir, position: str) -> None:
    """Wait until the worker saved a checkpoint past the transaction at ``position``: a
    restart then resumes reading the spool after it."""
    high, low = position.split("/")
    lsn = (int(high, 16) << 32) | int(low, 16)
    path = state_dir / "pg" / "checkpoint.json"

    def saved() -> bool:
        try:
            return json.loads(path.read_bytes())["position"]["last_lsn"] >= lsn
        except (FileNotFoundError, ValueError):
            return False
    wait_until(saved, 20, message=f"checkpoint past {position}")


def test_worker_resuming_after_the_relation_message_decodes_with_the_one_in_force(
        lapidus_factory, pg_db, tmp_path):
    """Resume in the middle of a session: the spool after the checkpoint holds a change but
    not its relation message, and the table has changed twice since (DDL)."""
    slot = f"{pg_db.name}_pg"
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db, decoder="pgoutput")],
                            "plugins": {"stdout": {}},
                            "supervisor": {"backoff_initial": 0.1}})
    proc.wait_log('"streaming"')
    pg_db.sql("INSERT INTO t VALUES (1, 'a')")                          # relation message 1
    pg_db.sql("ALTER TABLE t ADD COLUMN w int DEFAULT 7")
    pg_db.sql("INSERT INTO t VALUES (2, 'b')")                          # relation message 2
    wait_checkpoint_past(tmp_path / "state", proc.wait_events(2)[1]["position"])

    # The worker stops reading; its pg_recvlogical keeps spooling in the same session, so the
    # next change to t comes without a relation message.
    worker = proc.worker_pid("pg")
    os.kill(worker, signal.SIGSTOP)
    try:
        pg_db.sql("INSERT INTO t VALUES (3, 'c')")
        lsn = current_lsn(pg_db)
        wait_until(lambda: spooled(pg_db, slot, lsn), 20, message="row 3 in the spool")
        # The catalog moves on: describing row 3 from it now would be wrong.
        pg_db.sql("ALTER TABLE t ADD COLUMN z text DEFAULT 'zz'")
    finally:
        os.kill(worker, signal.SIGKILL)
    wait_until(lambda: proc.log().count('"streaming"') >= 2, 30, message="worker restarted")
    pg_db.sql("INSERT INTO t VALUES (4, 'd')")                          # relation message 3
    events = proc.wait_events(6)        # 4 rows, and each changed relation a schema event
    assert [e["item"] for e in events if e["type"] == "insert"] == [
        {"id": 1, "v": "a"},
        {"id": 2, "v": "b", "w": 7},
        {"id": 3, "v": "c", "w": 7},
        {"id": 4, "v": "d", "w": 7, "z": "zz"},
    ]
    assert [(e["item"]["added"], e["item"]["source"]) for e in events
            if e["type"] == "schema"] == [(["w"], "relation"), (["z"], "relation")]
    assert CATALOG_FALLBACK not in proc.log()
    assert "Traceback" not in proc.log()


def test_relation_messages_survive_deleted_spool_segments(lapidus_factory, pg_db, tmp_path):
    """Tiny spool segments: the segment holding the relation message is delivered and deleted
    long before the worker is killed; the restarted worker still decodes the table."""
    slot = f"{pg_db.name}_pg"
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db, decoder="pgoutput",
                                                    spool_segment_bytes="16KiB")],
                            "plugins": {"stdout": {}},
                            "supervisor": {"backoff_initial": 0.1}})
    proc.wait_log('"streaming"')
    spool = tmp_path / "state" / "pg" / "spool"

    def first_segment() -> int:
        return min((int(p.name[:-4]) for p in spool.glob("*.seg")), default=0)

    # Segments rotate once a second and are deleted once the checkpoint is in a later one,
    # which needs changes there: keep writing until the first segment is gone.
    rows = 0
    while first_segment() <= 1:
        assert rows < 20_000, "the first spool segment was never deleted"
        pg_db.sql("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(%s, %s) g",
                  args=(rows + 1, rows + 100))
        rows += 100
        wait_checkpoint_past(tmp_path / "state", proc.wait_events(rows)[-1]["position"])

    worker = proc.worker_pid("pg")
    os.kill(worker, signal.SIGSTOP)
    try:
        pg_db.sql("INSERT INTO t VALUES (50000, 'after')")
        lsn = current_lsn(pg_db)
        wait_until(lambda: spooled(pg_db, slot, lsn), 20, message="row 50000 in the spool")
    finally:
        os.kill(worker, signal.SIGKILL)
    events = proc.wait_events(rows + 1, timeout=60)
    assert events[-1]["item"] == {"id": 50_000, "v": "after"}
    assert CATALOG_FALLBACK not in proc.log()
    assert "Traceback" not in proc.log()
