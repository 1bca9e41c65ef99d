"""PostgreSQL to NATS through the real lapidus process; observed with nats-py subscribers.

Needs the local nats-server with JetStream on 127.0.0.1:4222.  Every test uses its own subject
prefix and, for JetStream, its own stream (deleted afterwards).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from lapidus.sinks.subjects import decoder_for
from tests.conftest import wait_until
from tests.integration.conftest import backend_status, pg_backend, pg_connect
from tests.integration.nats_fixtures import (URL, create_stream, delete_stream, nats_outage,
                                             private_nats, sleep_until, stream, stream_count,
                                             stream_messages, unique_prefix, wait_stream_count,
                                             watch)

__all__ = ["watch", "private_nats"]   # fixtures, imported for pytest

ROUTING_HEADERS = {"Nats-Msg-Id", "Lapidus-Backend", "Lapidus-Type", "Lapidus-Position"}


def start(lapidus_factory, pg_db, plugin: dict, backends=None, **config):
    proc = lapidus_factory({"backends": backends or [pg_backend(pg_db)],
                            "plugins": {"nats": {"server": URL, **plugin}}, **config})
    count = len(backends or [1])
    try:
        wait_until(lambda: proc.log().count('"streaming"') >= count
                   or proc.proc.poll() is not None, 30, message=f"{count} backend(s) streaming")
        assert proc.proc.poll() is None, "lapidus exited"
    except BaseException:
        print(proc.log()[-5000:])
        raise
    return proc


def load_rows(database: str, rows: int, per_tx: int) -> threading.Thread:
    def run():
        conn = pg_connect(database)
        conn.autocommit = False
        with conn.cursor() as cur:
            for first in range(1, rows + 1, per_tx):
                cur.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%s, %s) g",
                            (first, min(rows, first + per_tx - 1)))
                conn.commit()
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_subjects_encode_awkward_keys_composite_keys_and_missing_keys(lapidus_factory, pg_db,
                                                                      watch):
    prefix = unique_prefix()
    pg_db.sql("CREATE TABLE emails (addr text PRIMARY KEY, n int)",
              "CREATE TABLE pairs (a int, b text, v int, PRIMARY KEY (a, b))",
              "CREATE TABLE nokey (v int)")
    watcher = watch(f"{prefix}.>")
    # wal2json: it streams a table without any key (pgoutput needs a replica identity)
    start(lapidus_factory, pg_db, {"subject_prefix": prefix},
          backends=[pg_backend(pg_db, decoder="wal2json")])
    pg_db.sql("INSERT INTO emails VALUES ('a.b@c.com', 1), ('x*y>z w', 2), ('%41', 3), ('_', 4)")
    pg_db.sql("INSERT INTO pairs VALUES (1, 'x.y', 1)")
    pg_db.sql("INSERT INTO nokey VALUES (7)")
    pg_db.sql("UPDATE emails SET n = 5 WHERE addr = 'a.b@c.com'")
    pg_db.sql("DELETE FROM emails WHERE addr = '%41'")
    pg_db.sql("SELECT pg_logical_emit_message(true, 'audit.log', 'hi')")
    seen = watcher.wait_count(9)
    p = prefix
    assert [m.subject for m in seen] == [
        f"{p}.public.emails.a%2Eb@c%2Ecom", f"{p}.public.emails.x%2Ay%3Ez%20w",
        f"{p}.public.emails.%2541", f"{p}.public.emails.%5F",
        f"{p}.public.pairs.1.x%2Ey", f"{p}.public.nokey._",
        f"{p}.public.emails.a%2Eb@c%2Ecom", f"{p}.public.emails.%2541",
        f"{p}._message.audit%2Elog"]
    # every row subject decodes back to the event's own key values
    decode = decoder_for(prefix)
    for message in seen[:8]:
        event = json.loads(message.data)
        schema, table, key = decode(message.subject)
        assert (schema, table) == (event["schema"], event["table"])
        expected = None if event["pk"] is None else tuple(str(v) for v in event["pk"].values())
        assert key == expected
        assert ROUTING_HEADERS <= set(message.headers)
        assert message.headers["Nats-Msg-Id"] == event["id"]
        assert message.headers["Lapidus-Type"] == event["type"]
        assert message.headers["Lapidus-Position"] == event["position"]
        assert message.headers["Lapidus-Backend"] == "pg"
    assert [json.loads(m.data)["type"] for m in seen[6:8]] == ["update", "delete"]


def test_per_backend_plugins_replace_the_global_ones(lapidus_factory, pg_db, watch):
    prefix = unique_prefix()
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    watcher = watch(f"{prefix}.>")
    backends = [pg_backend(pg_db, name="shared"),
                pg_backend(pg_db, name="own",
                           plugins={"nats": {"server": URL, "subject_prefix": f"{prefix}.own"}})]
    start(lapidus_factory, pg_db, {"subject_prefix": f"{prefix}.global"}, backends=backends)
    pg_db.sql("INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    seen = watcher.wait_count(6)
    by_backend = {}
    for message in seen:
        by_backend.setdefault(message.headers["Lapidus-Backend"], []).append(message.subject)
    assert by_backend == {
        "shared": [f"{prefix}.global.public.t.{i}" for i in (1, 2, 3)],
        "own": [f"{prefix}.own.public.t.{i}" for i in (1, 2, 3)],
    }


def test_cache_prefix_publishes_populate_invalidate_and_purge(lapidus_factory, pg_db, watch):
    prefix = unique_prefix()
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    watcher = watch(f"{prefix}.>")
    start(lapidus_factory, pg_db, {"subject_prefix": f"{prefix}.db",
                                   "cachePrefix": f"{prefix}.cache."})
    pg_db.sql("INSERT INTO t VALUES (1, 'a')")
    pg_db.sql("UPDATE t SET v = 'b' WHERE id = 1")
    pg_db.sql("DELETE FROM t WHERE id = 1")
    seen = watcher.wait_count(6)
    assert [m.subject for m in seen] == [
        f"{prefix}.db.public.t.1", f"{prefix}.cache.populate.{prefix}.db.public.t.1",
        f"{prefix}.db.public.t.1", f"{prefix}.cache.invalidate.{prefix}.db.public.t.1",
        f"{prefix}.db.public.t.1", f"{prefix}.cache.purge.{prefix}.db.public.t.1",
    ]
    assert seen[5].headers["Lapidus-Type"] == "delete"


def test_publish_event_data_false_sends_headers_only(lapidus_factory, pg_db, watch):
    prefix = unique_prefix()
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    watcher = watch(f"{prefix}.>")
    start(lapidus_factory, pg_db, {"subject_prefix": prefix, "publishEventData": False})
    pg_db.sql("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    seen = watcher.wait_count(2)
    assert [(m.subject, m.data) for m in seen] == [(f"{prefix}.public.t.1", b""),
                                                   (f"{prefix}.public.t.2", b"")]
    assert all(m.headers["Lapidus-Type"] == "insert" for m in seen)


def test_jetstream_without_a_matching_stream_is_a_clear_error_then_recovers(
        lapidus_factory, pg_db):
    prefix = unique_prefix()
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    proc = start(lapidus_factory, pg_db, {"subject_prefix": prefix, "jetstream": True})
    pg_db.sql("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    try:
        proc.wait_log(f'no stream captures subject \\"{prefix}.public.t.')
    except BaseException:
        print(proc.log())
        raise
    with stream([f"{prefix}.>"]) as name:
        # the dispatcher retries the same batch; once a stream exists it is stored
        wait_stream_count(name, 2)
        assert [m.subject for m in stream_messages(name)] == [f"{prefix}.public.t.1",
                                                              f"{prefix}.public.t.2"]


def test_jetstream_stores_each_event_once_across_a_worker_kill_9(lapidus_factory, pg_db,
                                                                 watch):
    rows = 6000
    prefix = unique_prefix()
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    with stream([f"{prefix}.>"]) as name:
        watcher = watch(f"{prefix}.>")     # a core subscriber also sees the resent copies
        proc = start(lapidus_factory, pg_db, {"subject_prefix": prefix, "jetstream": True},
                     supervisor={"backoff_initial": 0.1, "max_restarts": 20})
        loader = load_rows(pg_db.name, rows, per_tx=50)
        wait_until(lambda: stream_count(name) >= rows // 4, 60, message="a quarter stored")
        os.kill(proc.worker_pid("pg"), signal.SIGKILL)
        loader.join(120)
        wait_stream_count(name, rows, timeout=120)
        watcher.wait_count(rows)
        stored = stream_messages(name)
        ids = [m.headers["Nats-Msg-Id"] for m in stored]
        assert len(stored) == rows and len(set(ids)) == rows
        assert {int(m.subject.rsplit(".", 1)[1]) for m in stored} == set(range(1, rows + 1))
        published = [m.headers["Nats-Msg-Id"] for m in watcher.seen()]
        assert set(published) == set(ids)
        assert len(published) > rows, ("no event was published twice: the kill did not "
                                       "exercise JetStream's deduplication")


@pytest.mark.serial      # stops the shared nats-server
def test_nats_outage_mid_load_loses_nothing_and_keeps_order_per_subject(lapidus_factory,
                                                                        pg_db):
    keys = 10
    prefix = unique_prefix()
    name = f"IT_{prefix.upper()}"
    pg_db.sql("CREATE TABLE counters (id int PRIMARY KEY, v int)")
    stop = threading.Event()
    done = {"version": 0}

    def update_forever():
        conn = pg_connect(pg_db.name)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO counters SELECT g, 0 FROM generate_series(1, %s) g",
                        (keys,))
            version = 0
            while not stop.is_set():
                version += 1
                cur.execute("UPDATE counters SET v = %s", (version,))
                done["version"] = version
                time.sleep(0.01)   # pacing of the load, not a wait for a condition
        conn.close()

    try:
        proc = start(lapidus_factory, pg_db, {"subject_prefix": prefix, "jetstream": True,
                                              "stream": name, "subjects": [f"{prefix}.>"],
                                              "reconnect_time_wait": 0.5})
        loader = threading.Thread(target=update_forever, daemon=True)
        loader.start()
        wait_until(lambda: stream_count(name) >= 200, 60, message="load flowing into the stream")
        with nats_outage() as outage:
            proc.wait_log("nats disconnected")
            sleep_until(time.monotonic() + 10)      # the outage itself lasts ~10 s
            outage.start()
        proc.wait_log("nats reconnected")
        before = stream_count(name)
        wait_until(lambda: stream_count(name) > before + 100, 60, message="load resumed")
        stop.set()
        loader.join(30)
        expected = keys * (1 + done["version"])
        wait_stream_count(name, expected, timeout=120)
        stored = stream_messages(name)
        assert len(stored) == expected, "an event was lost or stored twice"
        versions = {}
        for message in stored:
            versions.setdefault(message.subject, []).append(json.loads(message.data)["item"]["v"])
        assert sorted(versions) == sorted(f"{prefix}.public.counters.{i}"
                                          for i in range(1, keys + 1))
        for subject, seen in versions.items():
            assert seen == list(range(0, done["version"] + 1)), f"{subject} out of order"
    finally:
        stop.set()
        delete_stream(name)


@pytest.mark.serial      # stops the shared nats-server
def test_nats_down_at_start_up_holds_events_until_it_comes(lapidus_factory, pg_db,
                                                           private_nats):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db)],
                            # credentials in the URL: they must never reach the log
                            "plugins": {"nats": {"server": private_nats.url.replace(
                                                     "://", "://lapidus:s3cr3tpw@"),
                                                 "jetstream": True,
                                                 "subject_prefix": "late",
                                                 "reconnect_time_wait": 0.3}}})
    proc.wait_log('"streaming"')
    pg_db.sql("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 300) g")
    proc.wait_log("nats connection error")
    # the state is visible to operators, not only in the log
    down = wait_until(lambda: nats_state(proc, connected=False, down_for_more_than=0.5), 15,
                      message="lapidusctl status showing nats down for a while")
    assert "s3cr3tpw" not in json.dumps(down)
    private_nats.start()
    create_stream("LATE", ["late.>"], url=private_nats.url)
    proc.wait_log('"nats connected"')
    wait_until(lambda: stream_count("LATE", private_nats.url) == 300, 60,
               message="300 events stored once NATS came up")
    wait_until(lambda: nats_state(proc, connected=True), 15,
               message="lapidusctl status showing nats up")
    assert "s3cr3tpw" not in proc.log()


def nats_state(proc, connected: bool, down_for_more_than: float = -1):
    """The nats sink's state in ``lapidusctl status --json``, if it is ``connected`` (and
    down for more than ``down_for_more_than`` seconds); else None."""
    state = backend_status(proc.config_path).get("sinks", {}).get("nats")
    if not state or state["connected"] is not connected:
        return None
    if not connected and (state["down_seconds"] or 0) <= down_for_more_than:
        return None
    return state


@pytest.fixture
def counter_script(tmp_path):
    path = tmp_path / "count_lines.py"
    path.write_text(
        "import json, os, sys\n"
        "out = sys.argv[1]\n"
        "ids = open(out + '.ids', 'a')\n"
        "n = 0\n"
        "for line in sys.stdin:\n"
        "    ids.write(json.loads(line)['id'] + '\\n'); ids.flush()\n"
        "    n += 1\n"
        "    with open(out + '.tmp', 'w') as f:\n"
        "        f.write(str(n))\n"
        "    os.replace(out + '.tmp', out)\n")
    return path


def test_exec_pipes_every_event_into_a_command(lapidus_factory, pg_db, tmp_path,
                                               counter_script):
    import sys
    count_file = tmp_path / "count"
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db)],
                            "plugins": {"exec": {"command": [sys.executable, str(counter_script),
                                                             str(count_file)]}}})
    proc.wait_log('"streaming"')
    pg_db.sql("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 500) g")
    pg_db.sql("UPDATE t SET v = 'y' WHERE id <= 10")
    wait_until(lambda: count_file.exists() and count_file.read_text() == "510", 30,
               message=f"510 lines counted; log:\n{proc.log()[-2000:]}")
    ids = (tmp_path / "count.ids").read_text().split()
    assert len(set(ids)) == 510


def test_an_exec_command_that_keeps_exiting_shows_in_status(lapidus_factory, pg_db):
    """lapidusctl status (--json and the table) says the command is down and how it ended."""
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({"backends": [pg_backend(pg_db)],
                            "plugins": {"exec": {"command": "echo 'no consumer' >&2; exit 3",
                                                 "restart_backoff": 0.2}}})
    proc.wait_log('"streaming"')
    pg_db.sql("INSERT INTO t VALUES (1)")
    # The batch is written to one of its runs (confirmed); that run exits too, and with no
    # further batch the command stays down.
    def down(row):
        state = row.get("sinks", {}).get("exec", {})
        # (the stderr line may reach the description a moment after the exit)
        return state.get("connected") is False and "stderr" in (state.get("last_error") or "")
    row = wait_until(lambda: (lambda r: r if down(r) else None)(
        backend_status(proc.config_path)), 60,
        message=f"the exec sink down in status; log:\n{proc.log()[-2000:]}")
    state = row["sinks"]["exec"]
    assert state["last_error"] == "exited with code 3 (last stderr: no consumer)"
    assert state["down_seconds"] is not None
    table = subprocess.run([sys.executable, "-m", "lapidus.ctl", "-c", str(proc.config_path),
                            "status"], capture_output=True, text=True, timeout=30).stdout
    assert "exec down" in table, table
