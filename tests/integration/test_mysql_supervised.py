"""MySQL/MariaDB through the real supervisor, worker and dispatcher into stdout.

Each test runs ``lapidus -c CONFIG`` as a process with a mysql backend and the stdout plugin:
whole events of insert/update/delete; a ``kill -9`` of the worker in the middle of one 100-row
transaction; a MariaDB restart in the middle of a load; a wrong password (that backend FATAL,
another keeps streaming, the password shown nowhere); an address nobody listens on (waited for
in WAITING, named in the log and in ``lapidusctl status``).

Waiting is always on a condition with a deadline.  The restart test shuts the shared local
MariaDB down: it always starts it again, even when it fails.
"""

from __future__ import annotations

import calendar
import collections
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pymysql
import pytest

from tests.conftest import wait_until
from tests.integration.conftest import LapidusProcess, ctl, pg_backend

# The fixtures come in as a plugin, so test arguments do not shadow imported names.
pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import (  # noqa: E402
    DATABASE, HOST, PORT, Sql, begin_server_shutdown, gtid_sequence, lapidus_backend,
    restart_server, root_connection, start_server,
)

pytestmark = pytest.mark.integration

GTID = re.compile(r"^\d+-\d+-\d+$")                                  # MariaDB domain-server-seq
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")                # binlog: whole seconds, UTC


# --------------------------------------------------------------------------------- helpers

def status(config_path) -> dict:
    """``lapidusctl status --json`` by backend name; {} while the socket is not up yet."""
    code, out, err = ctl(config_path, "status", "--json")
    if code == 3:
        return {}
    assert code == 0, err
    return {b["name"]: b for b in json.loads(out)["backends"]}


def state_of(config_path, name):
    row = status(config_path).get(name)
    return row["state"] if row else None


def checkpoint_of(proc, backend: str):
    path = Path(proc.config["state_dir"]) / backend / "checkpoint.json"
    try:
        return json.loads(path.read_text())["position"]
    except (FileNotFoundError, ValueError):
        return None      # not written yet, or caught between write and rename


def assert_same_content_per_id(events) -> dict:
    """A change seen twice is the same event (same id, same content); returns id -> event."""
    by_id = {}
    for event in events:
        first = by_id.setdefault(event["id"], event)
        assert first == event, f"id {event['id']} delivered with different content"
    return by_id


def assert_mariadb_form(event, backend: str = "crm") -> None:
    """The per-run fields have their documented form: id = backend:GTID:index."""
    assert GTID.match(event["position"]), event
    assert event["txid"] == event["position"], event
    assert re.fullmatch(rf"{backend}:{re.escape(event['position'])}:\d+", event["id"]), event
    assert TS.match(event["ts"]), event


class PipedLapidus(LapidusProcess):
    """Lapidus whose standard output is a one-page pipe that a thread copies to the events
    file, whole lines only, and stops copying after ``hold_after(n)`` lines: the stdout sink
    then blocks on a full pipe and the worker, out of unconfirmed batches, stops reading.
    That makes "some of a transaction is on stdout, the rest is not" a state the test can
    hold for as long as it needs, instead of a race against a fast sink."""

    def __init__(self, config, workdir, extra_args=(), env=None):
        super().__init__(config, workdir, extra_args, env)
        self.config = config
        self._limit = None                  # lines to copy before holding; None: no limit
        self._copied = 0
        self._changed = threading.Condition()
        self._pump = None

    def start(self):
        err = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lapidus", "-c", str(self.config_path), *self.extra_args],
            stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=self.workdir, env=self.env)
        err.close()
        fcntl.fcntl(self.proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        self._pump = threading.Thread(target=self._copy, daemon=True)
        self._pump.start()
        return self

    def hold_after(self, lines):
        with self._changed:
            self._limit = lines
            self._changed.notify_all()

    def release(self):
        self.hold_after(None)

    def _copy(self):
        fd = self.proc.stdout.fileno()
        pending = b""
        with open(self.stdout_path, "ab") as out:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._limit is None
                                           or self._copied < self._limit)
                    room = None if self._limit is None else self._limit - self._copied
                if b"\n" not in pending:
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        return
                    pending += chunk
                    continue
                lines = pending.split(b"\n")
                pending = lines.pop()
                if room is not None and len(lines) > room:
                    pending = b"\n".join(lines[room:] + [pending])
                    lines = lines[:room]
                out.write(b"".join(line + b"\n" for line in lines))
                out.flush()
                with self._changed:
                    self._copied += len(lines)

    def cleanup(self):
        self.release()      # a blocked stdout would delay the shutdown to the kill timeout
        super().cleanup()
        if self._pump is not None:
            self._pump.join(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def piped_lapidus(tmp_path):
    started = []

    def start(config: dict):
        config.setdefault("state_dir", str(tmp_path / "state"))
        config.setdefault("log", {"format": "json", "level": "info"})
        proc = PipedLapidus(config, tmp_path).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()


# ----------------------------------------------------------------------------------- tests

def test_insert_update_delete_whole_events(lapidus_factory, sql):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20), price DECIMAL(6,2), "
            "seen DATETIME(6))")
    proc = lapidus_factory({"backends": [lapidus_backend()], "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"')
    # (asked before any event: see test_status_after_events_answers_and_lapidus_survives)
    wait_until(lambda: state_of(proc.config_path, "crm") == "RUNNING", 10, message="RUNNING")
    before = time.time()
    sql.run("INSERT INTO items VALUES (2, 'a', 1.50, '2026-11-30 11:33:35.295384')")
    g1 = sql.value("SELECT @@last_gtid")
    sql.run("UPDATE items SET name = 'b', price = 2.00 WHERE id = 2")
    g2 = sql.value("SELECT @@last_gtid")
    sql.run("DELETE FROM items WHERE id = 2")
    g3 = sql.value("SELECT @@last_gtid")
    events = proc.wait_events(3)
    after = time.time()

    assert len(events) == 3
    for event in events:
        assert_mariadb_form(event)
        stamp = calendar.timegm(time.strptime(event["ts"], "%Y-%m-%dT%H:%M:%SZ"))
        assert int(before) - 1 <= stamp <= after + 1, event["ts"]
    assert [e["position"] for e in events] == [g1, g2, g3]
    a = {"id": 2, "name": "a", "price": "1.50", "seen": "2026-11-30T11:33:35.295384"}
    b = dict(a, name="b", price="2.00")
    common = {"backend": "crm", "schema": DATABASE, "table": "items", "pk": {"id": 2}}
    assert [{k: v for k, v in e.items() if k != "ts"} for e in events] == [
        dict(common, id=f"crm:{g1}:0", type="insert", item=a, before=None, position=g1, txid=g1),
        dict(common, id=f"crm:{g2}:0", type="update", item=b, before=a, position=g2, txid=g2),
        dict(common, id=f"crm:{g3}:0", type="delete", item=None, before=b, position=g3, txid=g3),
    ]
    assert "Traceback" not in proc.log()


ROWS = 100
BATCH = 10
ON_STDOUT_AT_KILL = 15
# ~300 bytes a row: the events of the 100-row INSERT (about 40 KB) cannot all fit in the
# one-page pipe plus the copier's buffer, so holding the copier stalls the transaction's tail.
BIG_INSERT = "INSERT INTO items VALUES " + ", ".join(
    f"({i}, REPEAT('x', 300))" for i in range(ROWS))


def test_kill_worker_in_the_middle_of_a_100_row_insert(piped_lapidus, sql):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, pad VARCHAR(400))",
            "CREATE TABLE warm (id INT PRIMARY KEY)", "CREATE TABLE marker (id INT)")
    proc = piped_lapidus({"backends": [lapidus_backend(batch_size=BATCH)],
                          "plugins": {"stdout": {}},
                          "supervisor": {"backoff_initial": 0.1}})
    proc.wait_log('"streaming"')
    for i in range(3):                      # transactions completed before the big one
        sql.run(f"INSERT INTO warm VALUES ({i})")
    warm = proc.wait_events(3)
    warmed = gtid_sequence(warm[-1]["position"])
    wait_until(lambda: gtid_sequence((checkpoint_of(proc, "crm") or {}).get("gtid") or "0-0-0")
               >= warmed, 10, message="checkpoint after the warm-up transactions")

    proc.hold_after(3 + ON_STDOUT_AT_KILL)
    sql.run(BIG_INSERT)
    gtid = sql.value("SELECT @@last_gtid")

    # Wait for the stall: ON_STDOUT_AT_KILL rows on stdout, and a checkpoint saved inside
    # the transaction (delivered batches confirmed, the rest held up behind the full pipe).
    proc.wait_events(3 + ON_STDOUT_AT_KILL)
    inside = wait_until(lambda: (lambda c: c if c and c.get("tx") == gtid else None)(
        checkpoint_of(proc, "crm")), 20, message="a checkpoint inside the 100-row transaction")
    shown = [e for e in proc.events() if e["table"] == "items"]
    assert BATCH <= len(shown) < ROWS
    # the big transaction is not complete: the position stays before it
    assert warmed <= gtid_sequence(inside["gtid"]) < gtid_sequence(gtid)
    assert 0 <= inside["index"] < ROWS - 1

    worker = proc.worker_pid("crm")
    os.kill(worker, signal.SIGKILL)
    proc.release()
    wait_until(lambda: proc.log().count('"streaming"') >= 2, 30, message="worker restarted")
    assert '"resumed": true' in proc.log()
    sql.run("INSERT INTO marker VALUES (1)")   # commit order: after it, nothing can be missing
    wait_until(lambda: any(e["table"] == "marker" for e in proc.events()), 30,
               message=f"the marker row; log:\n{proc.log()[-3000:]}")

    events = proc.events()
    by_id = assert_same_content_per_id(events)
    big = [e for e in events if e["table"] == "items"]
    assert {e["pk"]["id"] for e in big} == set(range(ROWS))     # every row arrived
    for event in big:
        assert event["id"] == f"crm:{gtid}:{event['pk']['id']}"
        assert event["item"] == {"id": event["pk"]["id"], "pad": "x" * 300}
        assert_mariadb_form(event)
    assert len(by_id) == 3 + ROWS + 1
    # Nothing confirmed before the kill came again: not the earlier transactions, not the
    # rows of the big one up to the saved index.  Repeats are only of the unconfirmed tail.
    counts = collections.Counter(e["id"] for e in events)
    again = sorted(int(i.rsplit(":", 1)[1]) for i, n in counts.items() if n > 1)
    assert all(counts[e["id"]] == 1 for e in warm)
    assert not again or again[0] > inside["index"], (again, inside)
    assert proc.worker_pid("crm") != worker
    assert "Traceback" not in proc.log()


LOAD_ROWS = 20_000
PAUSE_AT = 8_000


@pytest.mark.serial      # restarts the shared MariaDB server
def test_mariadb_restart_in_the_middle_of_a_load_loses_nothing(lapidus_factory, sql):
    sql.run("CREATE TABLE load_rows (id INT PRIMARY KEY, v VARCHAR(20))",
            "CREATE TABLE marker (id INT)")
    config = {"backends": [lapidus_backend()],
              "plugins": {"stdout": {}},
              "supervisor": {"backoff_initial": 0.1, "max_restarts": 20}}
    proc = lapidus_factory(config)
    proc.wait_log('"streaming"')

    shutdown_begun = threading.Event()
    progress = {"committed": 0, "reconnects": 0, "error": None}

    def write():
        """Single-row transactions; through the restart it reconnects and goes on.  A commit
        whose answer was lost is retried with INSERT IGNORE (it may have been committed)."""
        conn = None
        next_id = 0
        give_up = time.monotonic() + 180
        try:
            while next_id < LOAD_ROWS:
                if next_id == PAUSE_AT:
                    # the restart must hit the load, not follow it
                    shutdown_begun.wait(120)
                try:
                    if conn is None:
                        conn = root_connection(database=DATABASE, connect_timeout=2)
                    with conn.cursor() as cur:
                        cur.execute("INSERT IGNORE INTO load_rows VALUES (%s, %s)",
                                    (next_id, f"v{next_id}"))
                    next_id += 1
                    progress["committed"] = next_id
                except pymysql.err.MySQLError:
                    if time.monotonic() > give_up:
                        raise
                    if conn is not None and conn.open:
                        conn.close()
                    conn = None
                    progress["reconnects"] += 1
                    time.sleep(0.05)        # the server is down: retry pace of the load
        except BaseException as exc:
            progress["error"] = exc
        finally:
            if conn is not None and conn.open:
                conn.close()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        wait_until(lambda: progress["committed"] >= PAUSE_AT // 2
                   and len(proc.events()) >= 1_000, 120, interval=0.2,
                   message="the load under way and streaming")
        shutdown = begin_server_shutdown()
        shutdown_begun.set()
        restart_server(shutdown)
    finally:
        shutdown_begun.set()
        start_server()          # whatever happened, the shared server runs when we leave
    writer.join(240)
    assert not writer.is_alive()
    assert progress["error"] is None, repr(progress["error"])
    assert progress["reconnects"] >= 1, "the writer never saw the restart"

    after = Sql()
    try:
        committed = {row[0] for row in after.rows(f"SELECT id FROM `{DATABASE}`.load_rows")}
        assert committed == set(range(LOAD_ROWS))
        after.run(f"INSERT INTO `{DATABASE}`.marker VALUES (1)")
    finally:
        after.close()

    wait_until(lambda: any(e["table"] == "marker" for e in proc.events()), 180, interval=0.5,
               message=f"the marker after the load; log:\n{proc.log()[-3000:]}")
    events = [e for e in proc.events() if e["table"] == "load_rows"]
    assert_same_content_per_id(events)
    by_row = collections.defaultdict(set)
    for event in events:
        assert event["type"] == "insert"
        assert event["item"] == {"id": event["pk"]["id"], "v": f"v{event['pk']['id']}"}
        by_row[event["pk"]["id"]].add(event["id"])
    missing = committed - set(by_row)
    assert not missing, f"{len(missing)} committed rows lost, e.g. {sorted(missing)[:10]}"
    assert all(len(ids) == 1 for ids in by_row.values()), "one row delivered under two ids"
    log = proc.log()
    assert log.count('"streaming"') >= 2          # the worker reconnected through a restart
    assert "Traceback" not in log
    assert '"backend is FATAL' not in log
    assert proc.proc.poll() is None


WRONG = "Wr0ng-pw-never-shown-7f3a"
RIGHT = "R1ght-pw-never-shown-c52e"


def test_wrong_password_is_fatal_for_that_backend_only_and_never_shown(
        lapidus_factory, mysql_user, pg_db):
    user = mysql_user(RIGHT)
    pymysql.connect(host=HOST, port=PORT, user=user, password=RIGHT).close()  # the user works
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    proc = lapidus_factory({
        "backends": [lapidus_backend(user=user, password=WRONG), pg_backend(pg_db)],
        "plugins": {"stdout": {}}})
    path = proc.config_path

    wait_until(lambda: state_of(path, "crm") == "FATAL", 30,
               message=f"crm FATAL; log:\n{proc.log()[-3000:]}")
    wait_until(lambda: state_of(path, "pg") == "RUNNING", 30, message="pg RUNNING")
    crm = status(path)["crm"]
    assert crm["restarts"] < 5                         # within the default retry budget
    assert crm["pid"] is None
    assert "access denied" in crm["last_error"] and user in crm["last_error"]
    assert f"{HOST}:{PORT}" in crm["last_error"]

    # (status is asked before any event: see test_status_after_events_answers_and_...)
    shown = [ctl(path, "status", "--json")[1], ctl(path, "status")[1]]
    assert "FATAL" in shown[1] and "RUNNING" in shown[1]

    pg_db.sql("INSERT INTO t VALUES (1)")              # the other backend keeps streaming
    events = proc.wait_events(1)
    assert [(e["backend"], e["type"], e["item"]) for e in events] == [("pg", "insert",
                                                                       {"id": 1})]
    log = proc.log()
    starts = [r for r in proc.records() if r.get("event") == "started"
              and r.get("backend") == "crm"]
    assert len(starts) == 1                            # FATAL: never started again
    for text in shown + [log]:
        assert WRONG not in text and RIGHT not in text
    assert proc.proc.poll() is None


def free_port() -> int:
    """A local TCP port nobody listens on (bound, never listened on, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_unreachable_server_is_waited_for_and_named_in_log_and_status(lapidus_factory):
    port = free_port()
    address = f"127.0.0.1:{port}"
    proc = lapidus_factory({
        "backends": [lapidus_backend(host="127.0.0.1", port=port, connect_timeout=2,
                                     reconnect_max_delay=1)],
        "plugins": {"stdout": {}},
        "supervisor": {"backoff_initial": 0.2, "backoff_max": 1.0, "max_restarts": 1}})
    path = proc.config_path

    def waiting():
        row = status(path).get("crm")
        return row if row and row["state"] == "WAITING" else None

    first = wait_until(waiting, 60, message=f"WAITING; log:\n{proc.log()[-3000:]}")
    assert first["waiting_for"] == address, first
    assert address in first["last_error"] and "cannot reach" in first["last_error"]
    wait_until(lambda: (status(path).get("crm") or {}).get("waiting_seconds", 0) > 3, 30,
               message="a few seconds of waiting")
    row = status(path)["crm"]
    assert row["state"] == "WAITING" and row["restarts"] == 0, row

    waits = [r for r in proc.records()
             if r.get("event") == "cannot reach the database; waiting, then retrying"]
    assert len(waits) >= 2, proc.log()[-3000:]
    for record in waits:
        assert f"cannot reach MySQL/MariaDB at {address}" in record["error"], record
    assert not [r for r in proc.records() if r.get("event") == "backend failed"]
    assert "Traceback" not in proc.log()


def test_status_after_events_answers_and_lapidus_survives(lapidus_factory, sql):
    sql.run("CREATE TABLE items (id INT PRIMARY KEY)")
    proc = lapidus_factory({"backends": [lapidus_backend()], "plugins": {"stdout": {}}})
    proc.wait_log('"streaming"')
    sql.run("INSERT INTO items VALUES (1)")
    proc.wait_events(1)

    def reported():
        code, out, err = ctl(proc.config_path, "status", "--json")
        assert code == 0, f"lapidusctl status failed ({code}): {err}"
        return json.loads(out)["backends"][0].get("events", 0) >= 1

    wait_until(reported, 20, message="the worker's stats after the event")
    assert proc.proc.poll() is None, f"lapidus died:\n{proc.log()[-3000:]}"
    code, out, _ = ctl(proc.config_path, "status", "--json")
    assert code == 0
    assert json.loads(out)["backends"][0]["event_counts"]
