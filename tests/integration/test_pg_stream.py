"""PostgreSQL to stdout through the real supervisor, worker, pg_recvlogical and dispatcher."""

from __future__ import annotations

import re


from tests.conftest import wait_until
from tests.integration.conftest import pg_backend

LSN = re.compile(r"^[0-9A-F]+/[0-9A-F]+$")
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def strip_source_fields(event: dict) -> dict:
    """Check the fields that vary per run for their form, and return the rest for comparison."""
    assert LSN.match(event["position"]), event
    assert event["id"].startswith(f'{event["backend"]}:{event["position"]}:'), event
    if event["type"] != "message" or event.get("transactional"):
        assert TS.match(event["ts"]), event
        assert event["txid"].isdigit(), event
    rest = dict(event)
    for key in ("id", "position", "txid", "ts"):
        rest.pop(key)
    return rest


def start_streaming(lapidus_factory, pg_db, **options):
    proc = lapidus_factory({"backends": [pg_backend(pg_db, **options)],
                            "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"')
    return proc


def test_insert_update_delete_truncate_and_message_stream_as_whole_events(
        lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10,2))")
    proc = start_streaming(lapidus_factory, pg_db)
    pg_db.sql("INSERT INTO items VALUES (1, 'a', 1.50), (2, 'b', 2.00)")
    pg_db.sql("UPDATE items SET name = 'b2', price = 2.10 WHERE id = 2")
    pg_db.sql("DELETE FROM items WHERE id = 1")
    pg_db.sql("SELECT pg_logical_emit_message(true, 'audit', 'hello')")
    pg_db.sql("TRUNCATE items")
    events = proc.wait_events(6)
    common = {"backend": "pg", "schema": "public", "table": "items"}
    assert [strip_source_fields(e) for e in events] == [
        {**common, "type": "insert", "pk": {"id": 1}, "item": {"id": 1, "name": "a",
                                                                "price": "1.50"}, "before": None},
        {**common, "type": "insert", "pk": {"id": 2}, "item": {"id": 2, "name": "b",
                                                                "price": "2.00"}, "before": None},
        {**common, "type": "update", "pk": {"id": 2},
         "item": {"id": 2, "name": "b2", "price": "2.10"}, "before": {"id": 2}},
        {**common, "type": "delete", "pk": {"id": 1}, "item": None, "before": {"id": 1}},
        {"backend": "pg", "type": "message", "schema": None, "table": None, "pk": None,
         "item": None, "before": None, "prefix": "audit", "content": "hello",
         "transactional": True},
        {**common, "type": "truncate", "pk": None, "item": None, "before": None},
    ]
    # both inserts share one transaction: same position, indexes 0 and 1
    assert events[0]["position"] == events[1]["position"]
    assert [events[0]["id"][-2:], events[1]["id"][-2:]] == [":0", ":1"]


def test_replica_identity_full_gives_whole_before_row(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)", "ALTER TABLE t REPLICA IDENTITY FULL",
              "INSERT INTO t VALUES (1, 'old')")
    proc = start_streaming(lapidus_factory, pg_db)
    pg_db.sql("UPDATE t SET v = 'new' WHERE id = 1")
    (event,) = proc.wait_events(1)
    assert event["before"] == {"id": 1, "v": "old"}
    assert event["item"] == {"id": 1, "v": "new"}


def test_unchanged_toasted_column_is_listed_not_nulled(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE docs (id int PRIMARY KEY, body text, n int)",
              "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL",
              "INSERT INTO docs VALUES (1, repeat('x', 1000000), 0)")
    proc = start_streaming(lapidus_factory, pg_db)
    pg_db.sql("UPDATE docs SET n = 1 WHERE id = 1")
    (event,) = proc.wait_events(1)
    assert event["item"] == {"id": 1, "n": 1}
    assert event["unchanged"] == ["body"]


def test_include_and_exclude_globs(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE keep_a (id int PRIMARY KEY)", "CREATE TABLE keep_b (id int PRIMARY KEY)",
              "CREATE TABLE audit_log (id int PRIMARY KEY)", "CREATE SCHEMA other",
              "CREATE TABLE other.keep_a (id int PRIMARY KEY)")
    proc = start_streaming(lapidus_factory, pg_db, include_tables=["keep_*"],
                           exclude_tables=["keep_b", "other.*"])
    pg_db.sql("INSERT INTO audit_log VALUES (1)", "INSERT INTO keep_b VALUES (1)",
              "INSERT INTO other.keep_a VALUES (1)", "INSERT INTO keep_a VALUES (7)")
    events = proc.wait_events(1)
    assert [(e["schema"], e["table"], e["pk"]) for e in events] == [("public", "keep_a", {"id": 7})]


def test_sigterm_exits_zero_and_restart_resumes_without_gap_or_repeat(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = start_streaming(lapidus_factory, pg_db)
    pg_db.sql("INSERT INTO t SELECT generate_series(1, 100)")
    proc.wait_events(100)
    assert proc.terminate(timeout=10) == 0
    assert "Traceback" not in proc.log()
    # written while Lapidus was down: must arrive after the restart, and nothing twice
    pg_db.sql("INSERT INTO t SELECT generate_series(101, 150)")
    again = start_streaming(lapidus_factory, pg_db)
    events = again.wait_events(150)
    ids = [e["pk"]["id"] for e in events]
    assert ids == list(range(1, 151))


def test_slot_is_not_confirmed_past_what_is_spooled(lapidus_factory, pg_db):
    """The server's confirmed position never passes what pg_recvlogical fsynced to the spool."""
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = start_streaming(lapidus_factory, pg_db)
    pg_db.sql("INSERT INTO t SELECT generate_series(1, 10)")
    events = proc.wait_events(10)
    slot = f"{pg_db.name}_pg"
    commit_lsn = events[-1]["position"]

    def lsn(text):
        high, low = text.split("/")
        return (int(high, 16) << 32) | int(low, 16)

    # eventually confirmed (after the fsync interval), and the spool holds the data
    wait_until(lambda: lsn(pg_db.slot(slot)[2]) >= lsn(commit_lsn), 20,
               message="slot confirmed past the spooled transaction")


def test_two_backends_one_fatal_the_other_keeps_streaming(lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    good = pg_backend(pg_db, name="good")
    bad = pg_backend(pg_db, name="bad", database="no_such_database_here")
    proc = lapidus_factory({"backends": [bad, good], "plugins": {"stdout": {}}})
    proc.wait_log("backend is FATAL")
    assert 'database \\"no_such_database_here\\" does not exist' in proc.log()
    proc.wait_log('"streaming"')
    pg_db.sql("INSERT INTO t VALUES (1)")
    (event,) = proc.wait_events(1)
    assert event["backend"] == "good"
    # FATAL means no restart loop: exactly one start of the bad backend
    assert proc.log().count('"backend": "bad", "pid"') <= 1 or \
        proc.log().count("backend is FATAL") == 1


def test_role_without_replication_is_a_clear_fatal_error(lapidus_factory, pg_db):
    role = f"{pg_db.name}_norepl"
    pg_db.sql(f"CREATE ROLE {role} LOGIN")
    try:
        proc = lapidus_factory({"backends": [pg_backend(pg_db, user=role)],
                                "plugins": {"stdout": {}}})
        proc.wait_log("backend is FATAL")
        assert f"ALTER ROLE {role} REPLICATION" in proc.log()
        assert proc.proc.wait(15) == 1  # every backend FATAL: the supervisor exits 1
    finally:
        pg_db.sql(f"DROP ROLE {role}")


def test_slot_dropped_behind_lapidus_back_is_an_error_not_a_silent_restart(
        lapidus_factory, pg_db):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = start_streaming(lapidus_factory, pg_db)
    pg_db.sql("INSERT INTO t VALUES (1)")
    proc.wait_events(1)
    assert proc.terminate() == 0
    pg_db.sql("SELECT pg_drop_replication_slot(%s)", args=(f"{pg_db.name}_pg",))
    again = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}})
    again.wait_log("backend is FATAL")
    assert "no longer exists" in again.log()


def until_last(proc, key: int, timeout: float = 30.0):
    """The events on ``proc``'s stdout once the one of row ``key`` is there."""
    return wait_until(lambda: (lambda ev: ev if any(e["pk"] == {"id": key} for e in ev)
                               else None)(proc.events()), timeout,
                      message=f"row {key} on stdout; log:\n{proc.log()[-3000:]}")


def test_closed_stdout_ends_cleanly_without_checkpointing_unwritten_events(
        tmp_path, pg_db, lapidus_factory):
    """`lapidus --stdout | head -3`: exit 0, no traceback, and the batch that hit the closed
    pipe is not confirmed, so the next run delivers it again, whole."""
    import json
    import subprocess
    import sys

    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    config = {"state_dir": str(tmp_path / "state"), "log": {"format": "json"},
              "backends": [pg_backend(pg_db)]}
    path = tmp_path / "lapidus.json"
    path.write_text(json.dumps(config))
    err_path = tmp_path / "err.log"
    with open(err_path, "wb") as err:
        lapidus = subprocess.Popen(
            [sys.executable, "-m", "lapidus", "-c", str(path), "--stdout"],
            stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    head = subprocess.Popen(["head", "-3"], stdin=lapidus.stdout, stdout=subprocess.PIPE)
    lapidus.stdout.close()
    try:
        wait_until(lambda: b'"streaming"' in err_path.read_bytes(), 30)
        # one transaction far larger than a pipe buffer: its first batch cannot be written whole
        pg_db.sql("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 2000) g")
        out, _ = head.communicate(timeout=30)
        assert len(out.splitlines()) == 3
        assert lapidus.wait(20) == 0
    finally:
        if lapidus.poll() is None:
            lapidus.kill()
    log = err_path.read_text()
    assert "Traceback" not in log
    assert "output closed" in log
    (tmp_path / "again").mkdir()
    again = lapidus_factory({"state_dir": str(tmp_path / "state"),
                             "backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}},
                            workdir=tmp_path / "again")
    # What the first run had written whole into the pipe before head closed it was taken by
    # the pipe, so confirmed (the first batch, when the worker read the transaction while
    # pg_recvlogical was still spooling it); from the batch that hit the closed pipe on,
    # everything comes again, in order, with no gap.
    events = until_last(again, 2000)
    ids = [e["pk"]["id"] for e in events]
    assert ids == list(range(ids[0], 2001)), ids[:5]
