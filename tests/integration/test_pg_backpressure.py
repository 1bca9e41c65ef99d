"""A sink that is down: the spool fills to its cap, then the slot holds WAL; both drain after."""

from __future__ import annotations

from tests.conftest import wait_until
from tests.integration.conftest import pg_backend
from tests.integration.nats_fixtures import create_stream, private_nats, stream_count

__all__ = ["private_nats"]   # fixture, imported for pytest


def unconfirmed_bytes(db, slot) -> int:
    rows = db.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                  "FROM pg_replication_slots WHERE slot_name = %s", args=(slot,))
    return rows[0][0]


def test_slot_lag_grows_while_the_sink_is_down_and_shrinks_after(
        lapidus_factory, pg_db, private_nats):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    slot = f"{pg_db.name}_pg"
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, spool_segment_bytes="256KiB", spool_max_bytes="1MiB")],
        "plugins": {"nats": {"server": private_nats.url, "jetstream": True,
                             "subject_prefix": "bp", "reconnect_time_wait": 0.3}}})
    proc.wait_log('"streaming"')

    # NATS is down: the first rows fill the spool up to its cap, then pg_recvlogical pauses
    pg_db.sql("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
    proc.wait_log("spool is full")
    pg_db.sql("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(20001, 40000) g")
    wait_until(lambda: unconfirmed_bytes(pg_db, slot) > 4 << 20, 30,
               message="the slot holding WAL while the spool is full")
    assert proc.events() == []

    # NATS comes back: everything is delivered, the spool drains, the slot catches up
    private_nats.start()
    create_stream("BP", ["bp.>"], url=private_nats.url)
    wait_until(lambda: stream_count("BP", private_nats.url) == 40000, 120, interval=0.5,
               message="all 40000 events stored after NATS came back")
    proc.wait_log("resuming pg_recvlogical")
    wait_until(lambda: unconfirmed_bytes(pg_db, slot) < 1 << 20, 60, interval=0.5,
               message="the slot confirmed again after the spool drained")
