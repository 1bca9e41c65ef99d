"""Snapshots on MariaDB: the initial snapshot through the real supervisor (stdout plugin),
backfills and the type mapping on a MysqlSource driven directly.

The folding guarantee (docs/snapshots.md) is checked with the fold and concurrent writer of
:mod:`tests.integration.snapshot_helpers`: after a sentinel row arrives, the fold of the
stream equals ``SELECT *``.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import ctl
from tests.integration.snapshot_helpers import (MID_SNAPSHOT_WINDOW, ConcurrentWriter,
                                                backfill_under_writer, fold,
                                                kill_worker_mid_snapshot,
                                                resumed_reads, snapshot_state, until)

pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import (  # noqa: E402
    DATABASE, lapidus_backend, read_until, root_connection,
)
from lapidus.events import ReadChunk, batch_fields  # noqa: E402
from lapidus.workers.snapshot.run import SnapshotRefused  # noqa: E402

pytestmark = pytest.mark.integration

NAME = "crm"


class Writer(ConcurrentWriter):
    """Random inserts, updates and deletes on ``t`` of the test database."""

    def connect(self):
        conn = root_connection(database=DATABASE)
        return conn

    def write(self, cur, kind, i):
        if kind == "update":
            cur.execute("UPDATE t SET v = %s, n = n + 0.01 WHERE id = %s", (f"u{self.done}", i))
        elif kind == "delete":
            cur.execute("DELETE FROM t WHERE id = %s", (i,))
        else:
            cur.execute("INSERT INTO t VALUES (%s, %s, 1.10) ON DUPLICATE KEY UPDATE "
                        "v = VALUES(v)", (i + self.top, f"i{self.done}"))


def make_table(sql, rows: int) -> None:
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(40), n DECIMAL(12,2))",
            f"INSERT INTO t SELECT seq, CONCAT('r', seq), seq / 100 FROM seq_1_to_{rows}",
            "ANALYZE TABLE t")


def table_content(sql, table="t"):
    return {i: {"id": i, "v": v, "n": n}
            for i, v, n in sql.rows(f"SELECT id, v, CAST(n AS CHAR) FROM {table}")}


def as_dicts(events):
    """Source events as the dicts of stdout, for the fold."""
    return [{"table": e.table, "type": e.type, "pk": e.pk, "item": e.item} for e in events]


def with_text_decimals(copy):
    return {k: dict(v, n=str(v["n"])) for k, v in copy.items()}


def wait_sentinel(proc, sql, timeout=60):
    """Insert a row after everything else and wait for it: the stream is then complete."""
    sql.run("INSERT INTO t VALUES (-1, 'sentinel', 0)")
    return until(
        proc, lambda: (lambda ev: ev if any(e["type"] == "insert" and e["pk"] == {"id": -1}
                                            for e in ev) else None)(proc.events()),
        timeout, "the sentinel row on stdout", NAME)


def errors_of(proc):
    return [e["error"] for e in map(json.loads, proc.log().splitlines()) if "error" in e]


def assert_same_records(reads, chunks, name, encoded_name):
    """The records of an encoded run's chunks (``chunks``: ReadChunks) are those of the
    ``read`` events of the same rows, but for the backend's name and the position and time of
    the run's own snapshot."""
    assert chunks and all(c.__class__ is ReadChunk for c in chunks)
    want = {fields[0].replace(f"{name}:", f"{encoded_name}:", 1): fields
            for fields in batch_fields(reads)}
    got = batch_fields(chunks)
    assert sorted(fields[0] for fields in got) == sorted(want)
    for fields in got:
        other = want[fields[0]]
        assert fields[1:5] == other[1:5]        # type, schema, table, record key
        got_json, want_json = json.loads(fields[6]), json.loads(other[6])
        assert list(got_json) == list(want_json) and got_json["id"] == fields[0]
        for one in (got_json, want_json):
            del one["id"], one["backend"], one["position"], one["ts"]
        assert got_json == want_json and list(got_json["item"]) == list(want_json["item"])


# ------------------------------------------------------------------ the initial snapshot


def test_initial_snapshot_under_a_concurrent_writer_folds_to_the_table(sql, lapidus_factory):
    make_table(sql, 20_000)
    sql.run("CREATE TABLE other (id INT PRIMARY KEY)", "CREATE TABLE skipped (x INT)",
            "INSERT INTO other SELECT seq FROM seq_1_to_10")
    writer = Writer(20_000)
    writer.start()
    try:
        proc = lapidus_factory({
            "backends": [lapidus_backend(NAME, snapshot="initial", snapshot_chunk_rows=200,
                                         exclude_tables=["skipped"])],
            "plugins": {"stdout": {}}})
        until(proc, lambda: snapshot_state(proc, NAME).get("state") == "done", 60,
              "the snapshot to finish", NAME)
    finally:
        writer.stop()
    assert writer.done > 100                 # the writer really ran during the snapshot
    events = wait_sentinel(proc, sql)
    assert fold(events) == table_content(sql)
    assert fold(events, "other") == {i: {"id": i} for i in range(1, 11)}
    kinds = [e["type"] for e in events if e["table"] == "t"]
    first, last = kinds.index("read"), len(kinds) - 1 - kinds[::-1].index("read")
    assert sum(k != "read" for k in kinds[first:last]) > 50     # interleaved with the reads
    reads = [e for e in events if e["type"] == "read"]
    assert reads and all(e["before"] is None and e["txid"] is None for e in reads)
    assert reads[0]["id"] == f"{NAME}:read:0:{DATABASE}.other:[1]"
    assert len({e["id"] for e in reads}) == len(reads)
    sample = next(e for e in reads if e["table"] == "t")
    assert isinstance(sample["item"]["n"], str)          # DECIMAL stays an exact string
    assert "snapshot finished" in proc.log()


def test_kill_9_mid_snapshot_resumes_from_a_chunk(sql, lapidus_factory):
    make_table(sql, 200_000)
    writer = Writer(200_000, seed=11)
    proc = lapidus_factory({
        "backends": [lapidus_backend(NAME, snapshot="initial",
                                     **MID_SNAPSHOT_WINDOW)],
        "plugins": {"stdout": {}}})
    writer.start()
    try:
        running, resumed = kill_worker_mid_snapshot(proc, NAME, f"{DATABASE}.t", run_sql=sql.run)
        assert int(resumed["last_key"][0]) > 0
        # information_schema's estimate (InnoDB samples it: near, not exact)
        assert 100_000 < running["table_rows_estimated"] < 400_000
    finally:
        writer.stop()
    events = wait_sentinel(proc, sql)
    assert fold(events) == table_content(sql)
    resumed_reads(events)


def test_a_table_without_a_primary_key_is_refused_by_name(sql, lapidus_factory):
    sql.run("CREATE TABLE keyed (id INT PRIMARY KEY)", "CREATE TABLE loose (x INT)")
    proc = lapidus_factory({
        "backends": [lapidus_backend(NAME, snapshot="initial")],
        "plugins": {"stdout": {}}})
    until(proc, lambda: proc.proc.poll() is not None, 30, "Lapidus to exit", NAME)
    assert "backend is FATAL" in proc.log()
    errors = errors_of(proc)
    assert errors and f"{DATABASE}.loose: no primary key" in errors[0]
    assert f'exclude_tables = ["{DATABASE}.loose"]' in errors[0] and "keyed" not in errors[0]
    assert "Traceback" not in proc.log()


# ------------------------------------------------------------------ values


# the types of the type test that a chunk reads aggregated as JSON by the server
PLAIN = ("id t_tiny t_tiny_u t_small_u t_medium t_int_u t_big t_big_u t_dec t_dec2 t_date "
         "t_time t_time0 t_datetime t_datetime0 t_ts t_year t_char t_varchar t_text t_enum "
         "t_set t_json").split()


def test_read_rows_carry_every_type_exactly_as_an_insert_does(sql, open_source):
    from tests.integration.test_mysql_types import (MAX_ROW, MIN_ROW, NULL_ROW, TABLE,
                                                    ZERO_ROW, as_json)
    sql.run(TABLE, "SET time_zone = '+00:00'")
    streaming = open_source(name="binlog")
    for statement in (MIN_ROW, MAX_ROW, NULL_ROW, ZERO_ROW):
        sql.run(statement)
    # every type read row by row (types), the JSON-aggregated path (plain: no float, bytes)
    others = [c for (c,) in sql.rows("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE "
                                     "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'types'")
              if c not in PLAIN]
    sql.run("CREATE TABLE plain LIKE types",      # LIKE: keeps t_json's json_valid check
            "ALTER TABLE plain " + ", ".join(f"DROP COLUMN {c}" for c in others),
            f"INSERT INTO plain SELECT {', '.join(PLAIN)} FROM types")
    inserts = [e for e in read_until(streaming, lambda ev: sum(
        e.type == "insert" for e in ev) >= 8)[0] if e.type == "insert"]
    snapshot = open_source(name="snap", snapshot="initial", snapshot_chunk_rows=3)
    assert snapshot.snapshot.shapes == {}
    reads, checkpoint = read_until(snapshot, lambda ev: snapshot.snapshot_progress.done)
    assert [e.type for e in reads] == ["read"] * 8 and [e.type for e in inserts] == ["insert"] * 8
    by_key = {(e.table, e.pk["id"]): e for e in inserts}
    for read in reads:
        insert = by_key[(read.table, read.pk["id"])]
        got, want = as_json(read)["item"], as_json(insert)["item"]
        wrong = {c: (got.get(c), want[c]) for c in want if got.get(c) != want[c]}
        assert not wrong, f"{read.table} row {read.pk}: (read, insert) {wrong}"
        assert got.keys() == want.keys() and read.pk == insert.pk
    assert {e.table for e in reads} == {"plain", "types"}
    # the worker loop's run (rows straight to JSON lines, chunks as ReadChunks) gives the
    # same records
    lines = open_source(name="lines", snapshot="initial", snapshot_chunk_rows=3, encoded=True)
    assert_same_records(reads, read_until(lines, lambda ev: lines.snapshot_progress.done)[0],
                        "snap", "lines")
    # a finished snapshot is never repeated: opened again from its checkpoint
    assert checkpoint["snapshot"] == {"n": 0, "done": True, "rows": 8}
    again = open_source(checkpoint, name="snap", snapshot="initial")
    sql.run("INSERT INTO types (id) VALUES (5)")
    events, _ = read_until(again, lambda ev: any(e.pk == {"id": 5} for e in ev))
    assert not any(e.type == "read" for e in events)


def test_the_json_aggregated_chunks_are_used_where_they_can_be(sql, open_source):
    from lapidus.workers.mysql.snapshot import MysqlSnapshot
    sql.run("CREATE TABLE a (id INT PRIMARY KEY, v TEXT, n DECIMAL(5,2))",
            "CREATE TABLE b (id INT PRIMARY KEY, x DOUBLE, y VARBINARY(4))")
    source = open_source()
    source.start_backfill(1, "a", None)
    run = source.snapshot
    assert isinstance(run, MysqlSnapshot)
    read_until(source, lambda ev: source.snapshot_progress.done)
    assert run.shapes[(DATABASE, "a")].json_list is not None
    source.start_backfill(2, "b", None)
    run = source.snapshot
    read_until(source, lambda ev: source.snapshot_progress.done)
    assert run.shapes[(DATABASE, "b")].json_list is None


# ------------------------------------------------------------------ backfills


def test_backfills_under_a_concurrent_writer_fold_to_the_table(sql, open_source):
    make_table(sql, 20_000)
    source = open_source(snapshot_chunk_rows=500)
    assert source.snapshot_progress is None
    writer = Writer(20_000, seed=3)
    writer.start()
    try:
        assert source.start_backfill(1, "t", None) == f"{DATABASE}.t"
        # nothing read for a while after the first chunks: the writer's changes then fall
        # inside the run, however fast it is
        events, _ = read_until(source, lambda ev: sum(e.type == "read" for e in ev) >= 1000,
                               timeout=60)
        writer.wait_for_changes(100)
        more, _ = read_until(source, lambda ev: source.snapshot_progress.done, timeout=60)
        events += more
        assert source.status()["snapshot"]["state"] == "done"
        assert source.start_backfill(2, f"{DATABASE}.t", "id % 3 = 0 OR v LIKE 'x%'") \
            == f"{DATABASE}.t"
        assert source.status()["snapshot"]["where"] == "id % 3 = 0 OR v LIKE 'x%'"
        more, _ = read_until(source, lambda ev: source.snapshot_progress.done, timeout=60)
        events += more
    finally:
        writer.stop()
    sql.run("INSERT INTO t VALUES (-1, 'sentinel', 0)")
    events += read_until(source, lambda ev: any(e.pk == {"id": -1} for e in ev))[0]
    reads = [e for e in events if e.type == "read"]
    first = [e for e in reads if e.id.startswith(f"crm:read:1:{DATABASE}.t:")]
    second = [e for e in reads if e.id.startswith(f"crm:read:2:{DATABASE}.t:")]
    assert len(first) > 15_000 and second and len(first) + len(second) == len(reads)
    # the where is ANDed in parentheses: its OR cannot widen the keyset
    assert all(e.pk["id"] % 3 == 0 for e in second) and len(second) < 0.5 * len(first)
    # a consumer of the stream since the backfill was asked for ends with the table's content
    # (a change read while a chunk was held evicts its key: it comes before that chunk)
    assert with_text_decimals(fold(as_dicts(events))) == table_content(sql)
    assert source.snapshot_running() is False


def test_a_run_made_for_one_sink_is_marked_as_its_own_and_ends_with_its_end_event(
        sql, open_source):
    """A websocket client's snapshot=1 on MariaDB (lapidus.sink_runs): the same backfill, its
    ids carry the sink, and its last event says the table was read to the end."""
    make_table(sql, 3_000)
    source = open_source(snapshot_chunk_rows=500)
    writer = Writer(3_000, seed=5)
    writer.start()
    try:
        source.start_backfill(4, "t", None, sink="websocket")
        events, _ = read_until(source, lambda ev: source.snapshot_progress.done, timeout=60)
    finally:
        writer.stop()
    sql.run("INSERT INTO t VALUES (-1, 'sentinel', 0)")
    events += read_until(source, lambda ev: any(e.pk == {"id": -1} for e in ev))[0]
    reads = [e for e in events if e.type == "read"]
    assert reads and all(e.id.startswith(f"crm:read:4@websocket:{DATABASE}.t:") for e in reads)
    (end,) = [e for e in events if e.type == "snapshot"]
    assert end.id == "crm:snapshot:4@websocket" and end.item == {"rows": len(reads)}
    assert events.index(end) > events.index(reads[-1])
    assert source.status()["snapshot"]["sink"] == "websocket"
    assert with_text_decimals(fold(as_dicts(events))) == table_content(sql)


def test_backfills_that_cannot_run_are_refused_clearly(sql, open_source):
    sql.run("CREATE TABLE t (id INT PRIMARY KEY, v TEXT)", "CREATE TABLE loose (x INT)",
            "CREATE TABLE hidden (id INT PRIMARY KEY)")
    source = open_source(exclude=(f"{DATABASE}.hidden",))
    cases = {
        "nope": "no such table on the server",
        "hidden": "left out by database / include_tables / exclude_tables",
        "loose": "no primary key",
    }
    for table, reason in cases.items():
        with pytest.raises(SnapshotRefused) as refused:
            source.start_backfill(1, table, None)
        assert f'"{table}"' in str(refused.value) or f"{DATABASE}.{table}" in str(refused.value)
        assert reason in str(refused.value)
    with pytest.raises(SnapshotRefused) as refused:
        source.start_backfill(1, "t", "no_such_column = 1")
    message = str(refused.value)
    assert "--where condition is not valid SQL" in message and "no_such_column" in message
    for escaping in ("1 = 1) OR (1 = 1", "id > 0 -- ", "id > 0 # x", "id > 0; DROP TABLE t"):
        with pytest.raises(SnapshotRefused) as refused:        # stays inside its parentheses
            source.start_backfill(1, "t", escaping)
        assert "--where" in str(refused.value)
    assert source.snapshot_progress is None                    # nothing started
    # and the stream goes on
    sql.run("INSERT INTO t VALUES (1, 'after')")
    events, _ = read_until(source, lambda ev: any(e.pk == {"id": 1} for e in ev))
    assert events[-1].type == "insert"


def test_a_cancelled_backfill_stops_and_says_so(sql, open_source):
    make_table(sql, 5_000)
    source = open_source(snapshot_chunk_rows=100)
    source.start_backfill(1, "t", None)
    events, checkpoint = read_until(source, lambda ev: len(ev) >= 300)
    source.cancel_snapshot()
    assert source.status()["snapshot"]["state"] == "cancelled"
    batch = source.read(100, 0.3)
    assert not [e for e in batch.events if e.type == "read"]
    assert batch.checkpoint["snapshot"] == {"n": 1, "done": True, "rows": len(events),
                                            "cancelled": True}


def test_an_unfinished_backfill_resumes_at_open_from_the_checkpoint(sql, open_source):
    make_table(sql, 3_000)
    source = open_source(snapshot_chunk_rows=1000)
    source.start_backfill(4, "t", "id > 500")
    events, checkpoint = read_until(source, lambda ev: len(ev) >= 1000)
    assert checkpoint["snapshot"]["n"] == 4 and not checkpoint["snapshot"]["done"]
    source.close()
    again = open_source(checkpoint, snapshot_chunk_rows=1000)
    assert again.snapshot_progress.where == "id > 500"
    rest, _ = read_until(again, lambda ev: again.snapshot_progress.done)
    ids = [e.pk["id"] for e in events + rest if e.type == "read"]
    assert ids == list(range(501, 3001))
    assert all(e.id.startswith(f"crm:read:4:{DATABASE}.t:") for e in rest)


def test_a_chunk_past_its_time_limit_fails_clearly(sql, open_source):
    make_table(sql, 10)
    source = open_source(snapshot_chunk_timeout=0.5)
    # a where that sleeps per row: the chunk's SELECT outlasts max_statement_time
    source.start_backfill(1, "t", "SLEEP(0.2) = 0")
    from lapidus.workers.base import BackendError
    with pytest.raises(BackendError) as failed:
        read_until(source, lambda ev: source.snapshot_progress.done)
    assert failed.value.fatal and "snapshot_chunk_timeout (0.5 s)" in str(failed.value)
    assert f"{DATABASE}.t" in str(failed.value)


def test_composite_text_and_decimal_keys_are_chunked_without_a_row_lost_or_repeated(
        sql, open_source):
    # keys that sort differently by collation and by bytes, equal prefixes, and a DECIMAL
    # and DATETIME key (compared as typed values, not as strings or doubles)
    sql.run("CREATE TABLE pairs (a INT, b VARCHAR(20), c DECIMAL(30,10), PRIMARY KEY (b, a))",
            "INSERT IGNORE INTO pairs SELECT seq % 7, CONCAT(ELT(seq % 6 + 1, 'a', 'B', 'é', "
            "'Z', 'a b', ''), seq DIV 42), seq FROM seq_1_to_1000",
            "CREATE TABLE money (d DECIMAL(30,10) PRIMARY KEY, at DATETIME(6))",
            "INSERT INTO money SELECT seq / 7 + 12345678901234567, "
            "TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq MICROSECOND FROM seq_1_to_500",
            "CREATE TABLE moments (at DATETIME(6) PRIMARY KEY)",
            "INSERT INTO moments SELECT TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq * 7 "
            "MICROSECOND FROM seq_1_to_500")
    source = open_source(snapshot="initial", snapshot_chunk_rows=37)
    reads, _ = read_until(source, lambda ev: source.snapshot_progress.done)
    got = [(e.pk["b"], e.pk["a"]) for e in reads if e.table == "pairs"]
    want = [tuple(row) for row in sql.rows("SELECT b, a FROM pairs ORDER BY b, a")]
    assert got == want and len(want) > 500
    assert [e.pk["d"] for e in reads if e.table == "money"] == [
        d for (d,) in sql.rows("SELECT CAST(d AS CHAR) FROM money ORDER BY d")]
    assert len([e for e in reads if e.table == "moments"]) == 500
    first = next(e for e in reads if e.table == "pairs")
    key = json.dumps([first.pk["b"], first.pk["a"]], ensure_ascii=False, separators=(",", ":"))
    assert first.id == f"crm:read:0:{DATABASE}.pairs:{key}" and list(first.pk) == ["b", "a"]
    lines = open_source(name="lines", snapshot="initial", snapshot_chunk_rows=37, encoded=True)
    assert_same_records(reads, read_until(lines, lambda ev: lines.snapshot_progress.done)[0],
                        "crm", "lines")


def test_a_table_dropped_during_the_snapshot_is_skipped(sql, open_source):
    sql.run("CREATE TABLE a (id INT PRIMARY KEY)", "INSERT INTO a SELECT seq FROM seq_1_to_2000",
            "CREATE TABLE b (id INT PRIMARY KEY)", "INSERT INTO b VALUES (1), (2)")
    source = open_source(snapshot="initial", snapshot_chunk_rows=300)
    events, _ = read_until(source, lambda ev: sum(e.type == "read" for e in ev) >= 300)
    assert source.snapshot_progress.table == (DATABASE, "a")
    sql.run("DROP TABLE a")
    more, checkpoint = read_until(source, lambda ev: source.snapshot_progress.done)
    reads = [e for e in events + more if e.type == "read"]
    assert [e.pk["id"] for e in reads if e.table == "b"] == [1, 2]
    assert 300 <= sum(e.table == "a" for e in reads) < 2000
    assert checkpoint["snapshot"]["done"] and any(e.type == "schema" for e in more)


def test_lapidusctl_backfill_of_a_streaming_backend_folds_to_the_table(sql, lapidus_factory):
    make_table(sql, 20_000)
    sql.run("CREATE TABLE marks (id INT PRIMARY KEY)", "CREATE TABLE loose (x INT)")
    proc = lapidus_factory({
        "backends": [lapidus_backend(NAME, **MID_SNAPSHOT_WINDOW)],
        "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"', 60)          # at the binlog's end: changes from now on stream
    sql.run("INSERT INTO marks VALUES (1)")
    until(proc, lambda: any(e["table"] == "marks" for e in proc.events()), 60,
          "the backend to stream", NAME)
    writer = Writer(20_000, seed=5)
    writer.start()
    try:
        code, out, err = backfill_under_writer(proc, writer, NAME, f"{DATABASE}.t")
    finally:
        writer.stop()
    assert code == 0, err + proc.log()[-3000:]
    reads = [e for e in proc.events() if e["id"].startswith(f"{NAME}:read:1:{DATABASE}.t:")]
    assert f"backfill 1 of {NAME} {DATABASE}.t done: {len(reads)} rows" in out
    events = wait_sentinel(proc, sql)
    assert fold(events) == table_content(sql)
    code, out, err = ctl(proc.config_path, "backfill", NAME, "loose")
    assert code == 2 and "no primary key" in out + err, out + err
