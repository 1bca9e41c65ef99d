"""``snapshot=1``: a websocket client gets its tables' current rows as ``read`` events in its
stream, then the live tail, through the real lapidus process (PostgreSQL, websocket + stdout).

The check is the folding guarantee of docs/snapshots.md, for one client: what it received,
applied in order, equals the table, whatever a concurrent writer did meanwhile and across a
kill -9 of the worker.  The run is that client's alone: stdout (the other sink) and the other
clients never see its ``read`` events.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import ctl, pg_backend, pg_connect, status
from tests.integration.snapshot_helpers import MID_SNAPSHOT_WINDOW, fold, snapshot_state, until
from tests.integration.test_pg_snapshot import Writer, make_table, table_content
from tests.integration.test_status_page import Page, browser
from tests.integration.test_supervisor_lifecycle import reload_with
from tests.integration.websocket_fixtures import client_loop, free_port
from tests.integration.test_websocket_sink import AUTH, ORDERS_TOKEN, TOKEN, url

__all__ = ["client_loop", "browser"]      # fixtures, imported for pytest

pytestmark = pytest.mark.integration

SENTINEL = 10_000_000
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "websocket" / "index.html"


def start(lapidus_factory, pg_db, port: int, **backend_options):
    proc = lapidus_factory({
        "backends": [pg_backend(pg_db, decoder="pgoutput", **backend_options)],
        "plugins": {"websocket": {"listen": f"127.0.0.1:{port}", "tokens": [
            TOKEN, {"token": ORDERS_TOKEN, "subjects": ["public.orders.>"]}]},
                    "stdout": {}}})
    until(proc, lambda: '"streaming"' in proc.log() and "websocket listener ready"
          in proc.log(), 30, "the backend streaming and the websocket listener ready")
    return proc


def start_on_table(lapidus_factory, pg_db, rows: int, **backend_options):
    """Table ``t`` with ``rows`` rows, and lapidus on it: (the process, the websocket port)."""
    make_table(pg_db, rows)
    port = free_port()
    return start(lapidus_factory, pg_db, port, **backend_options), port


def saved_run_rows(proc) -> int:
    """The rows of the snapshot run in the worker's saved checkpoint (0 before one)."""
    path = Path(json.loads(proc.config_path.read_text())["state_dir"]) / "pg" / "checkpoint.json"
    try:
        position = json.loads(path.read_text())["position"]
    except (OSError, ValueError):
        return 0
    return ((position or {}).get("snapshot") or {}).get("rows", 0)


def reading_client(client_loop, proc, port: int, rows: int = 1000):
    """A ``snapshot=1`` client of table ``t``, once ``rows`` of its ``read`` events came."""
    client = client_loop.connect(url(port, subjects="public.t.>", snapshot="1"), AUTH)
    until(proc, lambda: sum(f.get("type") == "read" for f in client.frames) >= rows, 60,
          f"{rows} rows at the client")
    return client


def wait_cancelled(proc, n: int, what: str) -> None:
    """Until ``lapidusctl status`` shows run ``n`` cancelled."""
    until(proc, lambda: snapshot_state(proc).get("state") == "cancelled"
          and snapshot_state(proc).get("n") == n, 30, what)


def states(client):
    return [(f["state"], f["table"]) for f in client.frames if f.get("type") == "snapshot"]


def wait_state(proc, client, state, timeout=90):
    until(proc, lambda: any(f.get("type") == "snapshot" and f["state"] == state
                            for f in client.frames) or client.ended.is_set(),
          timeout, f"the client's snapshot frame {state!r}")
    assert not client.ended.is_set(), (client.close_code, client.close_reason, client.error)


def finish_with_sentinel(pg_db, proc, clients):
    """A row written after everything else: once a client has it, it has all before it."""
    pg_db.sql(f"INSERT INTO t VALUES ({SENTINEL}, 'end', 0)")
    for client in clients:
        until(proc, lambda: any(e["pk"] == {"id": SENTINEL} for e in client.events()), 30,
              "the sentinel row at the client")


def test_snapshot_1_gives_the_client_the_current_rows_under_a_writer_and_to_no_one_else(
        lapidus_factory, pg_db, client_loop):
    proc, port = start_on_table(lapidus_factory, pg_db, 100_000,
                                snapshot_chunk_rows=500, batch_size=500, max_inflight_batches=1)
    writer = Writer(pg_db, 100_000, pause=0.001)
    writer.start()
    try:
        plain = client_loop.connect(url(port, subjects="public.t.>"), AUTH)
        reader = reading_client(client_loop, proc, port, 1000)
        # the run takes about a second: the dispatcher is frozen mid-run (the worker is held
        # one batch further on) until the writer has changed rows, which the remaining
        # chunks' windows must then place between their reads
        dispatcher = proc.worker_pid("dispatch")
        os.kill(dispatcher, signal.SIGSTOP)
        try:
            until(proc, lambda: snapshot_state(proc).get("state") == "running", 15,
                  "the run's progress in lapidusctl status")
            writer.wait_for_changes(100)
        finally:
            os.kill(dispatcher, signal.SIGCONT)
        wait_state(proc, reader, "done")
    finally:
        writer.stop()
    finish_with_sentinel(pg_db, proc, [reader, plain])
    assert fold(reader.events()) == table_content(pg_db)
    assert states(reader) == [("queued", "public.t"), ("done", "public.t")]
    queued, done = [f for f in reader.frames if f.get("type") == "snapshot"]
    assert queued["backend"] == "pg" and done["n"] == queued["n"]
    reads = [e for e in reader.events() if e["type"] == "read"]
    assert done["rows"] == len(reads) > 75_000
    assert all(e["id"].startswith(f"pg:read:{done['n']}@websocket:public.t:") for e in reads)
    # the writer really wrote while the rows were read: changes between the reads
    kinds = [e["type"] for e in reader.events()]
    first, last = kinds.index("read"), len(kinds) - 1 - kinds[::-1].index("read")
    assert sum(k != "read" for k in kinds[first:last]) >= 100
    # the run was this client's: not the other client's, not the other sink's
    assert not [f for f in plain.frames if f.get("type") in ("read", "snapshot")]
    stream = proc.events()
    assert stream and not [e for e in stream if e["type"] in ("read", "snapshot")]
    assert [e["id"] for e in plain.events()] == [e["id"] for e in stream
                                                 if e["id"] in set(e["id"] for e in
                                                                   plain.events())]
    assert plain.events()[-1]["pk"] == {"id": SENTINEL}
    row = until(proc, lambda: (lambda r: r if r.get("state") == "done" else None)(
        snapshot_state(proc)), 10, "the run done in lapidusctl status")
    assert row["sink"] == "websocket" and row["rows"] == done["rows"]
    assert "Traceback" not in proc.log()


def test_a_kill_9_of_the_worker_mid_run_resumes_it_and_the_client_still_folds_to_the_table(
        lapidus_factory, pg_db, client_loop):
    proc, port = start_on_table(lapidus_factory, pg_db, 100_000,
                                snapshot_chunk_rows=500, batch_size=500, max_inflight_batches=1)
    writer = Writer(pg_db, 100_000, pause=0.002)
    writer.start()
    try:
        # early: the client reads its frames more slowly than the dispatcher writes them,
        # and the whole run takes about a second
        reader = reading_client(client_loop, proc, port, 1000)
        dispatcher = proc.worker_pid("dispatch")
        os.kill(dispatcher, signal.SIGSTOP)     # holds the run mid-way until the kill
        try:
            # the worker, held by its one batch in flight, goes on reporting its progress;
            # killed once a chunk of the run is in its saved checkpoint (it resumes there)
            until(proc, lambda: snapshot_state(proc).get("state") == "running", 15,
                  "the run's progress in lapidusctl status")
            until(proc, lambda: saved_run_rows(proc) > 0, 15, "a chunk of the run saved")
            old = proc.worker_pid("pg")
            os.kill(old, signal.SIGKILL)
        finally:
            os.kill(dispatcher, signal.SIGCONT)
        wait_until(lambda: proc.worker_pid("pg") != old, 30, message="a new worker")
        wait_state(proc, reader, "done", 120)
    finally:
        writer.stop()
    assert "snapshot resumed" in proc.log()
    finish_with_sentinel(pg_db, proc, [reader])
    assert fold(reader.events()) == table_content(pg_db)
    reads = [f for f in reader.frames if f.get("type") == "read"]
    # resumed from a chunk: the rows read again are few (repeats are not sent twice)
    assert len(reads) < 100_000 * 1.05
    assert len({e["id"] for e in reads}) == len(reads)
    assert not [e for e in proc.events() if e["type"] in ("read", "snapshot")]


def test_a_kill_9_of_the_dispatcher_mid_run_cancels_it_and_leaks_no_read_to_other_sinks(
        lapidus_factory, pg_db, client_loop):
    proc, port = start_on_table(lapidus_factory, pg_db, 100_000, **MID_SNAPSHOT_WINDOW)
    writer = Writer(pg_db, 100_000, pause=0.002)
    writer.start()
    try:
        lost = reading_client(client_loop, proc, port, 2000)
        n = lost.frames[0]["n"]
        old = proc.worker_pid("dispatch")
        os.kill(old, signal.SIGKILL)
        assert lost.ended.wait(15)
        wait_until(lambda: proc.worker_pid("dispatch") not in (None, old), 30,
                   message="a new dispatcher")
        # the new listener cancels the run of the client that went with the old one: the
        # restarted worker stops it, or never resumes it (no chunk of it was confirmed yet)
        until(proc, lambda: snapshot_state(proc).get("state") != "running", 30,
              "the orphaned run over")
        assert snapshot_state(proc).get("state") in ("cancelled", None)
        assert snapshot_state(proc).get("n") in (n, None)
        assert '"websocket snapshot runs of clients gone cancelled"' in proc.log()
        until(proc, lambda: proc.log().count("websocket listener ready") >= 2, 30,
              "the new listener")
        again = client_loop.connect(url(port, subjects="public.t.>", snapshot="1"), AUTH)
        wait_state(proc, again, "done", 120)
    finally:
        writer.stop()
    finish_with_sentinel(pg_db, proc, [again])
    assert fold(again.events()) == table_content(pg_db)
    # the worker sent its unconfirmed batches again to the new dispatcher: still no read
    # event of either run reached the other sink
    assert not [e for e in proc.events() if e["type"] in ("read", "snapshot")]
    assert "Traceback" not in proc.log()


def test_a_reload_that_changes_the_websocket_options_mid_run_closes_its_client_and_run(
        lapidus_factory, pg_db, client_loop):
    proc, port = start_on_table(lapidus_factory, pg_db, 200_000, **MID_SNAPSHOT_WINDOW)
    client = reading_client(client_loop, proc, port)
    n = client.frames[0]["n"]
    config = json.loads(proc.config_path.read_text())
    config["plugins"]["websocket"]["ping_interval"] = 30      # a new listener
    reload_with(proc, config)
    assert client.ended.wait(20)
    wait_cancelled(proc, n, "the run of the closed client cancelled")
    pg_db.sql(f"INSERT INTO t VALUES ({SENTINEL}, 'end', 0)")
    until(proc, lambda: any(e["pk"] == {"id": SENTINEL} for e in proc.events()), 30,
          "the backend streaming on")
    assert not [e for e in proc.events() if e["type"] in ("read", "snapshot")]
    assert "Traceback" not in proc.log()


def test_refused_and_cancelled_runs_say_so_and_a_client_that_leaves_cancels_its_run(
        lapidus_factory, pg_db, client_loop):
    proc, port = start_on_table(lapidus_factory, pg_db, 200_000, **MID_SNAPSHOT_WINDOW)
    nosuch = client_loop.connect(url(port, subjects="public.nosuch.>", snapshot="pg"), AUTH)
    wait_state(proc, nosuch, "refused", 30)
    refused = [f for f in nosuch.frames if f.get("state") == "refused"][0]
    assert refused["table"] == "public.nosuch" and "nosuch" in refused["reason"]

    # an operator's lapidusctl backfill --cancel stops a client's run too: the client hears it
    stopped = reading_client(client_loop, proc, port)
    code, out, err = ctl(proc.config_path, "backfill", "pg", "--cancel")
    assert code == 0, err
    wait_state(proc, stopped, "cancelled", 30)
    assert states(stopped) == [("queued", "public.t"), ("cancelled", "public.t")]
    stopped.disconnect()

    leaving = reading_client(client_loop, proc, port)
    n = leaving.frames[0]["n"]
    leaving.disconnect()
    wait_cancelled(proc, n, "the run cancelled")
    assert '"websocket snapshot runs cancelled: their client left"' in proc.log()
    sinks = status(proc.config_path)["pg"]["sinks"]["websocket"]
    assert sinks["snapshot_runs"] == 0
    # the backend streams on
    pg_connect(pg_db.name).cursor().execute("SELECT 1")
    assert "Traceback" not in proc.log()


def test_a_table_dropped_during_a_clients_run_still_ends_it_with_done(
        lapidus_factory, pg_db, client_loop):
    proc, port = start_on_table(lapidus_factory, pg_db, 200_000, **MID_SNAPSHOT_WINDOW)
    reader = reading_client(client_loop, proc, port)
    pg_db.sql("DROP TABLE t")
    wait_state(proc, reader, "done", 60)
    done = [f for f in reader.frames if f.get("state") == "done"][0]
    reads = [f for f in reader.frames if f.get("type") == "read"]
    assert done["rows"] == len(reads) < 200_000
    assert '"table dropped during the snapshot; nothing more to read"' in proc.log()
    assert not [e for e in proc.events() if e["type"] in ("read", "snapshot")]


def test_clients_whose_table_waits_behind_another_backfill_share_one_run(
        lapidus_factory, pg_db, client_loop):
    pg_db.sql("CREATE TABLE big (id int PRIMARY KEY, v text)",
              "INSERT INTO big SELECT g, 'x' FROM generate_series(1, 200000) g")
    proc, port = start_on_table(lapidus_factory, pg_db, 3_000, **MID_SNAPSHOT_WINDOW)
    code, _, err = ctl(proc.config_path, "backfill", "pg", "big")    # an operator's, long
    assert code == 0, err
    until(proc, lambda: snapshot_state(proc).get("table") == "public.big", 30,
          "the operator's backfill running")
    first = client_loop.connect(url(port, subjects="public.t.>", snapshot="1"), AUTH)
    second = client_loop.connect(url(port, subjects="public.t.>", snapshot="1"), AUTH)
    for client in (first, second):
        wait_state(proc, client, "queued", 10)
    assert first.frames[0]["n"] == second.frames[0]["n"]      # one run for both
    writer = Writer(pg_db, 3_000, pause=0.002)
    writer.start()
    try:
        code, _, err = ctl(proc.config_path, "backfill", "pg", "big", "--cancel")
        assert code == 0, err
        for client in (first, second):
            wait_state(proc, client, "done", 60)
    finally:
        writer.stop()
    finish_with_sentinel(pg_db, proc, [first, second])
    assert fold(first.events()) == fold(second.events()) == table_content(pg_db)
    assert [f["id"] for f in first.frames if f.get("type") == "read"] == \
        [f["id"] for f in second.frames if f.get("type") == "read"]
    assert proc.log().count('"backfill started"') == 2       # big, then the shared run


def test_snapshot_requests_that_cannot_work_are_refused_at_the_handshake(
        lapidus_factory, pg_db, client_loop):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric(12,2))")
    port = free_port()
    proc = start(lapidus_factory, pg_db, port)
    orders_only = {"token": ORDERS_TOKEN}
    for query, status_code, reason in [
            ({"subjects": "public.>", "snapshot": "1"}, 400, "does not name one table"),
            ({"snapshot": "1"}, 400, "needs subjects"),
            ({"subjects": "public.t.>", "snapshot": "nosuch"}, 400, "backend names"),
            ({"subjects": "public.t.>", "snapshot": "1", "after": "pg:0/0:0"}, 400, "not both"),
            # a token limited to other rows: the table is not read for it
            ({"subjects": "public.t.>", "snapshot": "1", **orders_only}, 403,
             "does not allow every row of public.t")]:
        client = client_loop.connect(url(port, **query), None if "token" in query else AUTH)
        assert client.ended.wait(10)
        assert client.error is not None, query
        assert client.error.response.status_code == status_code, query
        assert reason in client.error.response.body.decode(), query
        assert client.frames == []
    # the limited token may read a table it sees whole
    allowed = client_loop.connect(url(port, subjects="public.orders.>", snapshot="1",
                                      **orders_only))
    wait_state(proc, allowed, "refused", 30)       # allowed, but there is no such table
    wait_until(lambda: status(proc.config_path)["pg"]["sinks"]["websocket"]["refused"] == 5,
               10, message="5 refusals in lapidusctl status")
    assert "Traceback" not in proc.log()


def test_the_example_page_shows_the_current_rows_then_the_changes_in_chromium(
        lapidus_factory, pg_db, browser):
    """examples/websocket/index.html in a real browser: its first connection asks for
    snapshot=1, so rows written before the page opened show, then each change."""
    pg_db.sql("CREATE TABLE items (id int PRIMARY KEY, name text)",
              "INSERT INTO items SELECT g, 'before-' || g FROM generate_series(1, 3) g")
    port = free_port()
    proc = start(lapidus_factory, pg_db, port)
    page = Page(browser, "")
    try:
        query = urlencode({"url": f"ws://127.0.0.1:{port}/events", "token": TOKEN,
                           "subjects": "public.items.>"})
        page.tab.goto(f"{EXAMPLE.as_uri()}?{query}")
        names = ("() => [...document.querySelectorAll('#rows tr')]"
                 ".map(tr => tr.cells[2].textContent).sort().join(',')")
        assert page.until(f"() => ({names})() === 'before-1,before-2,before-3' && "
                          "document.getElementById('state').textContent.includes('loaded')")
        pg_db.sql("INSERT INTO items VALUES (4, 'after-4')", "DELETE FROM items WHERE id = 1")
        assert page.until(f"() => ({names})() === 'after-4,before-2,before-3'")
        assert page.errors == []
    finally:
        page.close()
    assert "Traceback" not in proc.log()
