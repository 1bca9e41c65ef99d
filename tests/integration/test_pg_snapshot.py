"""Initial snapshots on PostgreSQL through the real supervisor (stdout plugin; NATS for the
backpressure test).

The folding guarantee (docs/snapshots.md) is checked with the shared fold and concurrent
writer of :mod:`tests.integration.snapshot_helpers`.
"""

from __future__ import annotations

import json
import os
import signal

from tests.integration.conftest import backend_status, pg_backend, pg_connect
from tests.integration.snapshot_helpers import (MID_SNAPSHOT_WINDOW, ConcurrentWriter, fold,
                                                kill_worker_mid_snapshot,
                                                resumed_reads, snapshot_state, until)
from tests.integration.nats_fixtures import create_stream, private_nats, stream_count

__all__ = ["private_nats"]   # fixture, imported for pytest


def table_content(db, table="t"):
    return {i: {"id": i, "v": v, "n": n}
            for i, v, n in db.sql(f"SELECT id, v, n::text FROM {table}")}


class Writer(ConcurrentWriter):
    """Random inserts, updates and deletes on ``t`` until stopped (its own connection)."""

    def __init__(self, db, top: int, seed: int = 7, pause: float = 0.0):
        super().__init__(top, seed, pause)
        self.db = db

    def connect(self):
        conn = pg_connect(self.db.name)
        conn.autocommit = True
        return conn

    def write(self, cur, kind, i):
        if kind == "update":
            cur.execute("UPDATE t SET v = %s, n = n + 0.01 WHERE id = %s", (f"u{self.done}", i))
        elif kind == "delete":
            cur.execute("DELETE FROM t WHERE id = %s", (i,))
        else:
            cur.execute("INSERT INTO t VALUES (%s, %s, 1.10) ON CONFLICT (id) DO "
                        "UPDATE SET v = excluded.v", (i + self.top, f"i{self.done}"))


def make_table(db, rows: int):
    db.sql("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(12,2))",
           f"INSERT INTO t SELECT g, 'r' || g, g / 100.0 FROM generate_series(1, {rows}) g",
           "ANALYZE t")


def wait_sentinel(proc, db, timeout=60):
    """Insert a row after everything else and wait for it: the stream is then complete."""
    db.sql("INSERT INTO t VALUES (-1, 'sentinel', 0)")
    return until(
        proc, lambda: (lambda ev: ev if any(e["type"] == "insert" and e["pk"] == {"id": -1}
                                            for e in ev) else None)(proc.events()),
        timeout, "the sentinel row on stdout")


def test_initial_snapshot_under_a_concurrent_writer_folds_to_the_table(pg_db, lapidus_factory):
    make_table(pg_db, 20_000)
    pg_db.sql("CREATE TABLE other (id int PRIMARY KEY)", "CREATE TABLE skipped (x int)",
              "INSERT INTO other SELECT generate_series(1, 10)")
    writer = Writer(pg_db, 20_000)
    writer.start()
    try:
        proc = lapidus_factory({
            "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                    snapshot_chunk_rows=200, exclude_tables=["skipped"],
                                    publication_mode="filtered")],
            "plugins": {"stdout": {}}})
        until(proc, lambda: snapshot_state(proc).get("state") == "done", 60,
              "the snapshot to finish")
    finally:
        writer.stop()
    assert writer.done > 100                 # the writer really ran during the snapshot
    events = wait_sentinel(proc, pg_db)
    assert fold(events) == table_content(pg_db)
    assert fold(events, "other") == {i: {"id": i} for i in range(1, 11)}
    # the writer really wrote during the snapshot: its changes are interleaved with the reads
    kinds = [e["type"] for e in events if e["table"] == "t"]
    first, last = kinds.index("read"), len(kinds) - 1 - kinds[::-1].index("read")
    assert sum(k != "read" for k in kinds[first:last]) > 50
    reads = [e for e in events if e["type"] == "read"]
    assert reads and all(e["before"] is None and e["txid"] is None for e in reads)
    assert reads[0]["id"].startswith("pg:read:0:public.")
    assert len({e["id"] for e in reads}) == len(reads)
    assert not any(e["type"] == "message" for e in events)     # watermarks never events
    # values are mapped like a decoder's: NUMERIC stays an exact string
    sample = next(e for e in reads if e["table"] == "t")
    assert isinstance(sample["item"]["n"], str)
    assert "snapshot finished" in proc.log()
    # the read events count per table in the status and /metrics, as many as were delivered
    delivered = sum(e["type"] == "read" and e["table"] == "t" for e in events)
    until(proc, lambda: (backend_status(proc.config_path, "pg")["event_counts"]
                         .get("public.t", {}).get("read")) == delivered, 30,
          f"{delivered} read events of public.t counted in the status")
    assert backend_status(proc.config_path, "pg")["event_counts"]["public.other"] == {"read": 10}


def test_kill_9_mid_snapshot_resumes_from_a_chunk(pg_db, lapidus_factory):
    make_table(pg_db, 200_000)
    writer = Writer(pg_db, 200_000, seed=11)
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                **MID_SNAPSHOT_WINDOW)],
        "plugins": {"stdout": {}}})
    writer.start()
    try:
        running, resumed = kill_worker_mid_snapshot(proc, "pg", "public.t", run_sql=pg_db.sql)
        assert int(resumed["last_key"][0]) > 0
        assert running["table_rows_estimated"] == 200_000
    finally:
        writer.stop()
    events = wait_sentinel(proc, pg_db)
    assert fold(events) == table_content(pg_db)
    resumed_reads(events)


def test_a_table_without_a_primary_key_is_refused_by_name(pg_db, lapidus_factory):
    pg_db.sql("CREATE TABLE keyed (id int PRIMARY KEY)", "CREATE TABLE loose (x int)",
              # passes the publication's guard (UPDATE/DELETE work), still no key to chunk by
              "ALTER TABLE loose REPLICA IDENTITY FULL")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial")],
        "plugins": {"stdout": {}}})
    # its only backend FATAL, the supervisor exits
    until(proc, lambda: proc.proc.poll() is not None, 30, "Lapidus to exit")
    assert "backend is FATAL" in proc.log()
    log = proc.log()
    errors = [e["error"] for e in map(json.loads, log.splitlines()) if "error" in e]
    assert errors and "public.loose: no primary key" in errors[0]
    assert 'exclude_tables = ["public.loose"]' in errors[0] and "keyed" not in errors[0]
    assert "Traceback" not in log


def test_read_rows_carry_every_type_exactly_as_the_decoder_maps_it(pg_db, lapidus_factory):
    from tests.integration.test_pg_types import (COLUMNS, PGOUTPUT_DIFFERENCES, ROWS, SCHEMA,
                                                 expected_item, stdout_events)
    pg_db.sql(*SCHEMA)
    placeholders = ", ".join(["%s"] * len(ROWS[0]))
    with pg_db.conn.cursor() as cur:
        for row in ROWS:
            cur.execute(f"INSERT INTO types ({COLUMNS}) VALUES ({placeholders})", row)
    proc = lapidus_factory({"backends": [pg_backend(pg_db, decoder="pgoutput",
                                                    snapshot="initial")],
                            "plugins": {"stdout": {}}})
    events = until(proc, lambda: (lambda ev: ev if len(ev) >= len(ROWS) else None)(
        stdout_events(proc)), 30, "the read events")
    assert [e["type"] for e in events] == ["read"] * len(ROWS)
    for event in events:
        row = event["pk"]["id"]
        want = expected_item(row, PGOUTPUT_DIFFERENCES)
        wrong = {column: (event["item"].get(column), want[column]) for column in want
                 if event["item"].get(column) != want[column]
                 or type(event["item"].get(column)) is not type(want[column])}
        assert not wrong, f"row {row}: (got, expected) {wrong}"
        assert event["item"].keys() == want.keys()


def test_a_finished_snapshot_is_never_repeated_and_user_messages_stay_off(
        pg_db, lapidus_factory, tmp_path):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(12,2))",
              "INSERT INTO t SELECT g, 'r' || g, g FROM generate_series(1, 300) g")
    config = {"backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                      snapshot_chunk_rows=100, messages=False)],
              "plugins": {"stdout": {}}}
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()   # one state_dir, two stdouts
    first = lapidus_factory(dict(config), workdir=tmp_path / "one")
    until(first, lambda: snapshot_state(first).get("state") == "done", 30, "the snapshot")
    pg_db.sql("SELECT pg_logical_emit_message(true, 'app', 'not an event: messages = false')")
    events = wait_sentinel(first, pg_db)
    assert sum(e["type"] == "read" for e in events) == 300
    assert not any(e["type"] == "message" for e in events)
    assert first.terminate() == 0
    pg_db.sql("INSERT INTO t VALUES (1000, 'after', 1)")
    second = lapidus_factory(dict(config), workdir=tmp_path / "two")
    events = until(second, lambda: (lambda ev: ev if any(e["pk"] == {"id": 1000} for e in ev)
                                    else None)(second.events()), 30, "the row after the stop")
    assert not any(e["type"] == "read" for e in events)
    # (the worker's status report follows its batch: awaited, not assumed)
    until(second, lambda: snapshot_state(second).get("state") == "done", 10,
          "the status of the finished snapshot")
    assert "snapshot started" not in second.log() and "snapshot resumed" not in second.log()


def test_switched_on_after_the_first_start_it_does_nothing_but_say_so(
        pg_db, lapidus_factory, tmp_path):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(12,2))",
              "INSERT INTO t VALUES (1, 'old', 1)")
    backend = pg_backend(pg_db, decoder="pgoutput")
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()   # one state_dir, two stdouts
    first = lapidus_factory({"backends": [backend], "plugins": {"stdout": {}}},
                            workdir=tmp_path / "one")
    first.wait_log('"streaming"')
    wait_sentinel(first, pg_db)
    assert first.terminate() == 0
    second = lapidus_factory({"backends": [dict(backend, snapshot="initial")],
                              "plugins": {"stdout": {}}}, workdir=tmp_path / "two")
    until(second, lambda: "has no effect" in second.log(), 30, "the log line")
    assert "backfill" in second.log()
    pg_db.sql("INSERT INTO t VALUES (2, 'new', 2)")
    events = until(second, lambda: (lambda ev: ev if any(e["pk"] == {"id": 2} for e in ev)
                                    else None)(second.events()), 30, "the new row")
    assert not any(e["type"] == "read" for e in events)


def test_the_wal2json_decoder_is_refused_clearly(pg_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db, decoder="wal2json",
                                                    snapshot="initial")],
                            "plugins": {"stdout": {}}})
    until(proc, lambda: proc.proc.poll() is not None, 30, "Lapidus to exit")
    errors = [e["error"] for e in map(json.loads, proc.log().splitlines()) if "error" in e]
    assert errors and 'needs the pgoutput decoder' in errors[0]
    assert 'decoder = "pgoutput"' in errors[0] and "Traceback" not in proc.log()


def test_pg_recvlogical_killed_mid_snapshot_still_folds_to_the_table(pg_db, lapidus_factory):
    make_table(pg_db, 60_000)
    writer = Writer(pg_db, 60_000, seed=5)
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                snapshot_chunk_rows=500)],
        "plugins": {"stdout": {}}})
    writer.start()
    try:
        until(proc, lambda: snapshot_state(proc).get("rows", 0) >= 10_000, 60,
              "a part of the snapshot")
        os.kill(proc.recvlogical_pid(), signal.SIGKILL)
        until(proc, lambda: snapshot_state(proc).get("state") == "done", 60,
              "the snapshot to finish")
    finally:
        writer.stop()
    # the worker notices the death at its next look at the child, which may come after the
    # snapshot's last chunk
    until(proc, lambda: "pg_recvlogical exited" in proc.log() or "reconnecting" in proc.log(),
          30, "the worker to notice pg_recvlogical's death")
    events = wait_sentinel(proc, pg_db)
    assert fold(events) == table_content(pg_db)


def test_a_chunk_past_its_statement_timeout_fails_the_backend_clearly(pg_db, lapidus_factory):
    make_table(pg_db, 10)
    backend = pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                         snapshot_chunk_timeout=0.5)
    # publication and slot made beforehand: creating a slot waits for the lock's transaction
    pg_db.sql("CREATE PUBLICATION lapidus_pg FOR ALL TABLES",
              f"SELECT pg_create_logical_replication_slot('{backend['slot']}', 'pgoutput')")
    blocker = pg_connect(pg_db.name)       # holds a lock the chunk's SELECT must wait for
    blocker.autocommit = False
    try:
        with blocker.cursor() as cur:
            cur.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        proc = lapidus_factory({
            "backends": [backend],
            "plugins": {"stdout": {}}})
        until(proc, lambda: proc.proc.poll() is not None, 30, "Lapidus to exit")
    finally:
        blocker.close()
    errors = [e["error"] for e in map(json.loads, proc.log().splitlines()) if "error" in e]
    assert errors and "public.t" in errors[0] and "snapshot_chunk_timeout (0.5 s)" in errors[0]
    assert "Traceback" not in proc.log()


def held_by_a_down_sink(pg_db, lapidus_factory, private_nats, prefix: str, chunk_rows: int):
    """Lapidus snapshotting into a JetStream sink whose server is not started yet: the worker
    stops at max_inflight_batches (2) unconfirmed batches, and the snapshot with it (a chunk
    starts only when the worker reads again).  The process and its status row, once held."""
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                snapshot_chunk_rows=chunk_rows, max_inflight_batches=2)],
        "plugins": {"nats": {"server": private_nats.url, "jetstream": True,
                             "subject_prefix": prefix, "reconnect_time_wait": 0.3}}})
    held = until(proc, lambda: (lambda row: row if row.get("inflight") == 2 else None)(
        backend_status(proc.config_path, "pg")), 30, "the worker held back by the sink")
    return proc, held


def test_a_sink_that_is_down_holds_the_snapshot_back_and_nothing_is_dropped(
        pg_db, lapidus_factory, private_nats):
    make_table(pg_db, 20_000)
    proc, blocked = held_by_a_down_sink(pg_db, lapidus_factory, private_nats, "snap", 500)
    assert blocked["snapshot"]["state"] == "running"
    assert blocked["snapshot"]["rows"] <= 3 * 500
    private_nats.start()
    create_stream("SNAP", ["snap.>"], url=private_nats.url)
    until(proc, lambda: snapshot_state(proc).get("state") == "done", 60, "the snapshot")
    until(proc, lambda: stream_count("SNAP", private_nats.url) == 20_000, 60,
          "every row stored once")


def test_composite_and_text_keys_are_chunked_without_a_row_lost_or_repeated(
        pg_db, lapidus_factory):
    pg_db.sql("CREATE TABLE pairs (a int, b varchar(20), c numeric, PRIMARY KEY (b, a))",
              # keys that sort differently by collation and by bytes, and equal prefixes
              "INSERT INTO pairs SELECT g % 7, (ARRAY['a', 'B', 'é', 'Z', 'a b', ''])[g % 6 + 1]"
              " || (g / 42), g FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                snapshot_chunk_rows=37)],
        "plugins": {"stdout": {}}})
    until(proc, lambda: snapshot_state(proc).get("state") == "done", 30, "the snapshot")
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric)")
    events = wait_sentinel(proc, pg_db)
    reads = [(e["pk"]["b"], e["pk"]["a"]) for e in events if e["type"] == "read"]
    want = pg_db.sql("SELECT b, a FROM pairs ORDER BY b, a")
    assert reads == [tuple(row) for row in want] and len(want) > 500
    # the id's key is in primary-key order (b, a)
    first = next(e for e in events if e["type"] == "read")
    key = json.dumps([first["pk"]["b"], first["pk"]["a"]], ensure_ascii=False,
                     separators=(",", ":"))
    assert first["id"] == f"pg:read:0:public.pairs:{key}" and list(first["pk"]) == ["b", "a"]


def test_tables_dropped_during_the_snapshot_are_skipped_with_a_warning(
        pg_db, lapidus_factory, private_nats):
    pg_db.sql("CREATE TABLE a (id int PRIMARY KEY)",
              "INSERT INTO a SELECT generate_series(1, 20000)", "ANALYZE a",
              "CREATE TABLE b (id int PRIMARY KEY)", "INSERT INTO b VALUES (1)",
              "CREATE TABLE c (id int PRIMARY KEY)", "INSERT INTO c VALUES (1), (2)")
    # the sink is down: the snapshot is held in table a, with no timing involved
    proc, held = held_by_a_down_sink(pg_db, lapidus_factory, private_nats, "drop", 300)
    assert held["snapshot"]["table"] == "public.a"
    pg_db.sql("DROP TABLE a", "DROP TABLE b")      # a in the middle, b before it began
    private_nats.start()
    create_stream("DROP", ["drop.>"], url=private_nats.url)
    until(proc, lambda: snapshot_state(proc).get("state") == "done", 60, "the snapshot")
    dropped = [json.loads(line)["table"] for line in proc.log().splitlines()
               if "table dropped during the snapshot" in line]
    assert dropped == ["public.a", "public.b"]
    rows = snapshot_state(proc)["rows"]               # a's first chunks and c's two rows
    assert 300 < rows < 20_000
    until(proc, lambda: stream_count("DROP", private_nats.url) == rows, 60,
          "every read row stored once")


def test_a_publication_with_a_row_filter_is_refused_by_table(pg_db, lapidus_factory):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "CREATE TABLE u (id int PRIMARY KEY)",
              "CREATE PUBLICATION mine FOR TABLE t WHERE (id > 10), u")
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", snapshot="initial",
                                publication="mine", publication_mode="existing")],
        "plugins": {"stdout": {}}})
    until(proc, lambda: proc.proc.poll() is not None, 30, "Lapidus to exit")
    errors = [e["error"] for e in map(json.loads, proc.log().splitlines()) if "error" in e]
    assert errors and "cannot read public.t: publication" in errors[0]
    assert "public.u" not in errors[0] and "Traceback" not in proc.log()
