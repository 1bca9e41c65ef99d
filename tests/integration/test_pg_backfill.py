"""``lapidusctl backfill`` on PostgreSQL through the real supervisor (stdout plugin).

The folding guarantee holds for a backfill as for the initial snapshot (docs/snapshots.md):
the backend streams on while one table is read again in chunks, and a consumer applying the
events in order ends with the table's content.
"""

from __future__ import annotations

import os
import signal

from tests.conftest import wait_until
from tests.integration.conftest import ctl, pg_backend
from tests.integration.snapshot_helpers import (MID_SNAPSHOT_WINDOW, backfill_under_writer, fold,
                                                kill_worker_mid_snapshot, snapshot_state, until)
from tests.integration.test_pg_snapshot import Writer, make_table, table_content, wait_sentinel


def streaming(proc, pg_db, **options):
    """A backend without an initial snapshot, streaming (its first change arrived)."""
    pg_db.sql("CREATE TABLE IF NOT EXISTS marks (id int PRIMARY KEY)")
    proc = proc({"backends": [pg_backend(pg_db, decoder="pgoutput", **options)],
                 "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"', 60)          # the slot exists: changes from now on stream
    pg_db.sql("INSERT INTO marks VALUES (1)")
    until(proc, lambda: any(e["table"] == "marks" for e in proc.events()), 60,
          "the backend to stream")
    return proc


def reads_of(events, n):
    return [e for e in events if e["type"] == "read" and e["id"].startswith(f"pg:read:{n}:")]


def test_a_backfill_under_a_concurrent_writer_folds_to_the_table(pg_db, lapidus_factory):
    make_table(pg_db, 20_000)
    proc = streaming(lapidus_factory, pg_db, **MID_SNAPSHOT_WINDOW)
    writer = Writer(pg_db, 20_000, seed=3)
    writer.start()
    try:
        code, out, err = backfill_under_writer(proc, writer, "pg", "t")
    finally:
        writer.stop()
    assert code == 0, err + proc.log()[-3000:]
    assert f"backfill 1 of pg t done: {len(reads_of(proc.events(), 1))} rows" in out
    events = wait_sentinel(proc, pg_db)
    assert fold(events) == table_content(pg_db)
    reads = reads_of(events, 1)
    assert reads[0]["id"] == f"pg:read:1:public.t:[{reads[0]['pk']['id']}]"
    kinds = [e["type"] for e in events if e["table"] == "t"]
    first, last = kinds.index("read"), len(kinds) - 1 - kinds[::-1].index("read")
    assert sum(k != "read" for k in kinds[first:last]) > 50   # it really ran online
    assert snapshot_state(proc) == {"n": 1, "state": "done", "rows": len(reads)}


def test_where_reads_only_the_matching_rows_and_backfills_queue(pg_db, lapidus_factory):
    make_table(pg_db, 3000)
    pg_db.sql("CREATE TABLE other (id int PRIMARY KEY, v text)",
              "INSERT INTO other SELECT g, 'o' FROM generate_series(1, 50) g")
    proc = streaming(lapidus_factory, pg_db, snapshot_chunk_rows=100)
    code, out, err = ctl(proc.config_path, "backfill", "pg", "public.t",
                         "--where", "id <= 250 AND v LIKE 'r%'")
    assert code == 0, err
    code, out2, err = ctl(proc.config_path, "backfill", "pg", "other", "--wait")
    assert code == 0, err
    assert "backfill 2 of pg other done: 50 rows" in out2
    events = proc.events()
    assert sorted(e["pk"]["id"] for e in reads_of(events, 1)) == list(range(1, 251))
    assert sorted(e["pk"]["id"] for e in reads_of(events, 2)) == list(range(1, 51))
    last_read_of_1 = max(i for i, e in enumerate(events) if e["id"].startswith("pg:read:1:"))
    first_read_of_2 = min(i for i, e in enumerate(events) if e["id"].startswith("pg:read:2:"))
    assert last_read_of_1 < first_read_of_2                # one run at a time, in order


def test_unknown_tables_and_bad_conditions_are_exit_2_an_unknown_backend_exit_1(
        pg_db, lapidus_factory):
    make_table(pg_db, 10)
    pg_db.sql("CREATE TABLE loose (x int)", "ALTER TABLE loose REPLICA IDENTITY FULL")
    proc = streaming(lapidus_factory, pg_db)
    code, _, err = ctl(proc.config_path, "backfill", "nosuch", "t")
    assert code == 1 and 'unknown backend "nosuch"' in err    # as restart/stop/start
    code, _, err = ctl(proc.config_path, "backfill", "pg", "nosuch")
    assert code == 2 and 'backfill of "nosuch": not a table this backend streams' in err
    assert "public.t" in err                               # it lists what there is
    code, _, err = ctl(proc.config_path, "backfill", "pg", "loose")
    assert code == 2 and "public.loose: no primary key" in err
    code, _, err = ctl(proc.config_path, "backfill", "pg", "t", "--where", "nosuchcol = 1")
    assert code == 2 and "--where condition is not valid SQL" in err and "nosuchcol" in err
    code, _, err = ctl(proc.config_path, "backfill", "pg")
    assert code == 2 and "needs a TABLE" in err
    assert "Traceback" not in proc.log()
    # the backend streamed on through all of it
    pg_db.sql("INSERT INTO t VALUES (99, 'after', 1)")
    until(proc, lambda: any(e["pk"] == {"id": 99} for e in proc.events() if e["table"] == "t"),
          30, "a change after the refusals")


def test_kill_9_mid_backfill_resumes_from_a_chunk(pg_db, lapidus_factory):
    make_table(pg_db, 200_000)
    proc = streaming(lapidus_factory, pg_db, **MID_SNAPSHOT_WINDOW)
    writer = Writer(pg_db, 200_000, seed=5)
    writer.start()
    try:
        code, _, err = ctl(proc.config_path, "backfill", "pg", "t")
        assert code == 0, err
        _, resumed = kill_worker_mid_snapshot(proc, "pg", "public.t", at_rows=50_000)
    finally:
        writer.stop()
    assert resumed["n"] == 1 and int(resumed["last_key"][0]) > 0
    events = wait_sentinel(proc, pg_db)
    assert fold(events) == table_content(pg_db)
    reads = len(reads_of(events, 1))
    assert 190_000 <= reads < 240_000, reads              # from a chunk, not from zero
    # its request is forgotten once a saved checkpoint says it is done
    backfills = proc.workdir / "state" / "pg" / "backfills"
    wait_until(lambda: not list(backfills.glob("*.json")), 10, message="the request removed")


def test_cancel_stops_a_running_backfill_and_the_next_one_runs(pg_db, lapidus_factory):
    make_table(pg_db, 100_000)
    pg_db.sql("CREATE TABLE other (id int PRIMARY KEY)",
              "INSERT INTO other SELECT generate_series(1, 5)")
    proc = streaming(lapidus_factory, pg_db, snapshot_chunk_rows=100, max_inflight_batches=1)
    # The dispatcher frozen, the worker can have one batch in flight and no more: the backfill
    # is certainly running, and far from its end, when the cancel reaches the worker (a
    # 100k-row table reads in a second or two, faster than a status report and lapidusctl).
    dispatcher = proc.worker_pid("dispatch")
    os.kill(dispatcher, signal.SIGSTOP)
    try:
        assert ctl(proc.config_path, "backfill", "pg", "t")[0] == 0
        assert ctl(proc.config_path, "backfill", "pg", "other")[0] == 0
        until(proc, lambda: snapshot_state(proc).get("rows", 0) >= 100, 60,
              "the backfill to run")
        code, out, err = ctl(proc.config_path, "backfill", "pg", "t", "--cancel")
        assert code == 0 and "cancelled backfill 1 of t" in out, err
        proc.wait_log('"snapshot cancelled"', 30)
    finally:
        os.kill(dispatcher, signal.SIGCONT)
    until(proc, lambda: snapshot_state(proc).get("n") == 2 and
          snapshot_state(proc).get("state") == "done", 60, "the queued backfill to run")
    events = proc.events()
    assert len(reads_of(events, 1)) < 100_000
    assert sorted(e["pk"]["id"] for e in reads_of(events, 2)) == [1, 2, 3, 4, 5]
    assert '"snapshot cancelled"' in proc.log()
    code, out, _ = ctl(proc.config_path, "backfill", "pg", "--cancel")
    assert code == 0 and "no backfill of pg to cancel" in out
