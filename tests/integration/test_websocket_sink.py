"""PostgreSQL to websocket clients through the real lapidus process.

Every test runs lapidus with two sinks, ``websocket`` and ``stdout``: stdout is the full stream
in commit order, against which what each client received is compared exactly.  The clients
are real ``websockets`` clients (tests/integration/websocket_fixtures.py).  Waiting is always
on a condition with a deadline.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from urllib.parse import urlencode

import pytest
from websockets.exceptions import InvalidStatus

from tests.conftest import wait_until
from tests.integration.conftest import pg_backend, pg_connect, status
from tests.integration.sink_loads import expected_count, finish, pg_load
from tests.integration.websocket_fixtures import client_loop, free_port

__all__ = ["client_loop"]      # a fixture, imported for pytest

pytestmark = pytest.mark.integration

TOKEN = "t0ken-of-the-websocket-test"
ORDERS_TOKEN = "t0ken-for-orders-only-of-the-test"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def start(lapidus_factory, pg_db, port: int, **options):
    plugin = {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN], **options}
    proc = lapidus_factory({"backends": [pg_backend(pg_db)],
                            "plugins": {"websocket": plugin, "stdout": {}}})
    try:
        wait_until(lambda: ('"streaming"' in proc.log() and "websocket listener ready"
                            in proc.log()) or proc.proc.poll() is not None, 30,
                   message="the backend streaming and the websocket listener ready")
        assert proc.proc.poll() is None, "lapidus exited"
    except BaseException:
        print(proc.log()[-5000:])
        raise
    return proc


def url(port: int, **query) -> str:
    return f"ws://127.0.0.1:{port}/events" + (f"?{urlencode(query)}" if query else "")


def subject(event: dict) -> str:
    return f"{event['schema']}.{event['table']}.{event['pk']['id']}"


def stdout_ids(proc, count: int) -> list:
    """The distinct event ids on stdout (repeats after a crash dropped), in commit order, once
    there are ``count`` of them."""
    def distinct():
        seen, ids = set(), []
        for event in proc.events():
            if event["id"] not in seen:
                seen.add(event["id"])
                ids.append(event["id"])
        return ids if len(ids) >= count else None
    return wait_until(distinct, 60, message=f"{count} distinct events on stdout")


def sink_state(proc) -> dict:
    return status(proc.config_path)["pg"]["sinks"].get("websocket", {})


# --------------------------------------------------------------------------------------------

def test_wildcards_and_token_grants_give_exactly_the_matching_events_in_commit_order(
        lapidus_factory, pg_db, client_loop):
    for table in ("items", "orders", "other"):
        pg_db.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
    port = free_port()
    proc = start(lapidus_factory, pg_db, port,
                 tokens=[TOKEN, {"token": ORDERS_TOKEN, "subjects": ["public.orders.>"]}])
    wanted = client_loop.connect(url(port, subjects="public.items.>,public.orders.*"), AUTH)
    orders_only = client_loop.connect(url(port, token=ORDERS_TOKEN))      # asks for all
    one_key = client_loop.connect(url(port, subjects="public.items.1"), AUTH)
    everything = client_loop.connect(url(port), AUTH)
    for n in range(1, 21):
        pg_db.sql(f"INSERT INTO items VALUES ({n}, 0)", f"INSERT INTO orders VALUES ({n}, 0)",
                  f"INSERT INTO other VALUES ({n}, 0)")
    pg_db.sql("UPDATE items SET v = 1 WHERE id IN (1, 2)", "DELETE FROM orders WHERE id = 3")
    # a fence every subscription but one_key matches: once it is in, so is all before it
    pg_db.sql("BEGIN; INSERT INTO items VALUES (999, 0); INSERT INTO orders VALUES (999, 0); "
              "COMMIT")
    total = 60 + 3 + 2
    stream = proc.wait_events(total, 60)
    everything.wait_frames(total)
    wanted.wait_frames(20 + 20 + 3 + 2)
    orders_only.wait_frames(20 + 1 + 1)

    def matching(prefixes):
        return [e["id"] for e in stream if subject(e).startswith(prefixes)]
    assert everything.ids() == [e["id"] for e in stream]
    assert wanted.ids() == matching(("public.items.", "public.orders."))
    assert orders_only.ids() == matching(("public.orders.",))
    assert one_key.ids() == [e["id"] for e in stream if subject(e) == "public.items.1"]
    assert [f["type"] for f in one_key.frames] == ["insert", "update"]
    # each frame is the event exactly as on stdout
    assert wanted.frames == [e for e in stream if e["id"] in set(wanted.ids())]
    state = wait_until(lambda: (lambda s: s if s.get("frames_sent") == total + 45 + 22 + 2
                                else None)(sink_state(proc)), 15,
                       message="the frames sent in lapidusctl status")
    assert state["connected"] is True and state["clients"] == 4
    assert "Traceback" not in proc.log() and TOKEN not in proc.log()


def test_a_client_that_disconnects_during_1000_rows_resumes_with_after_each_once_in_order(
        lapidus_factory, pg_db, client_loop):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    port = free_port()
    proc = start(lapidus_factory, pg_db, port)
    first = client_loop.connect(url(port), AUTH)
    disconnected = threading.Event()

    def write():
        conn = pg_connect(pg_db.name)
        with conn.cursor() as cur:
            for n in range(0, 1000, 10):       # 100 transactions of 10 rows
                if n == 500:
                    # the second half is written while the client is away (the first half
                    # can reach it in less time than a disconnect takes)
                    disconnected.wait(60)
                cur.execute("INSERT INTO t SELECT g, 0 FROM generate_series(%s, %s) g",
                            (n + 1, n + 10))
        conn.close()
    writer = threading.Thread(target=write)
    writer.start()
    first.wait_frames(50)
    first.disconnect()                    # while the rows are being written
    disconnected.set()
    last = first.ids()[-1]
    assert len(first.ids()) < 1000
    second = client_loop.connect(url(port, after=last), AUTH)
    writer.join(60)
    second.wait_frames(1000 - len(first.ids()))
    ids = stdout_ids(proc, 1000)
    assert first.ids() + second.ids() == ids          # every row once, in commit order
    assert [f["item"]["id"] for f in first.frames + second.frames] == list(range(1, 1001))


def test_after_older_than_the_replay_window_or_unknown_gives_a_gap_frame(
        lapidus_factory, pg_db, client_loop):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    port = free_port()
    proc = start(lapidus_factory, pg_db, port, replay_events=100)
    pg_db.sql("INSERT INTO t SELECT g, 0 FROM generate_series(1, 300) g")
    ids = stdout_ids(proc, 300)
    wait_until(lambda: sink_state(proc).get("replay_events") == 100, 15,
               message="the replay window full at 100 events")
    old = client_loop.connect(url(port, after=ids[0]), AUTH)
    unknown = client_loop.connect(url(port, after="pg:0/0:0"), AUTH)
    kept = client_loop.connect(url(port, after=ids[-51]), AUTH)     # inside the window
    pg_db.sql("INSERT INTO t VALUES (301, 0)")
    for client, asked in ((old, ids[0]), (unknown, "pg:0/0:0")):
        frames = client.wait_frames(2)
        gap = frames[0]
        assert gap["type"] == "gap" and gap["backend"] == "pg" and gap["after"] == asked
        assert gap["oldest"] == ids[200] and "reload" in gap["fix"]
        assert frames[1]["item"]["id"] == 301 and len(frames) == 2
    kept.wait_frames(51)
    assert [f["item"]["id"] for f in kept.frames] == list(range(251, 302))
    # an id of no backend served here is refused at the handshake
    with pytest.raises(InvalidStatus) as refused:
        client_loop.run(_open(url(port, after="crm:1-1-1:0"), AUTH))
    assert refused.value.response.status_code == 400
    assert b"not an event id of a backend served here" in refused.value.response.body


async def _open(address, headers=None):
    from websockets.asyncio.client import connect
    async with connect(address, additional_headers=headers or {}, open_timeout=10):
        pass


def test_bad_tokens_origins_and_parameters_are_refused_at_the_handshake(
        lapidus_factory, pg_db, client_loop):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    port = free_port()
    proc = start(lapidus_factory, pg_db, port, origins=["https://app.example.com"])
    good = client_loop.connect(url(port), {**AUTH, "Origin": "https://app.example.com"})
    refusals = {
        "no token": (url(port), {}, 401),
        "wrong token": (url(port), {"Authorization": "Bearer not-the-token-at-all"}, 401),
        "wrong query token": (url(port, token="not-the-token-at-all"), {}, 401),
        "other origin": (url(port), {**AUTH, "Origin": "https://evil.example.com"}, 403),
        "bad pattern": (url(port, subjects="public.>.x"), AUTH, 400),
        "snapshot": (url(port, snapshot=1), AUTH, 400),
        "wrong path": (f"ws://127.0.0.1:{port}/other", AUTH, 404),
    }
    for what, (address, headers, code) in refusals.items():
        with pytest.raises(InvalidStatus) as refused:
            client_loop.run(_open(address, headers))
        assert refused.value.response.status_code == code, what
    by_query = client_loop.connect(url(port, token=TOKEN))
    pg_db.sql("INSERT INTO t VALUES (1, 0)")
    assert good.wait_frames(1)[0]["item"]["id"] == 1
    assert by_query.wait_frames(1)[0]["item"]["id"] == 1
    state = wait_until(lambda: (lambda s: s if s.get("refused") == 7 else None)(
        sink_state(proc)), 15, message="7 refused handshakes in lapidusctl status")
    assert state["clients"] == 2
    assert "not-the-token-at-all" not in proc.log() and TOKEN not in proc.log()


def test_a_stalled_client_is_closed_with_1008_while_another_keeps_receiving(
        lapidus_factory, pg_db, client_loop):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    port = free_port()
    proc = start(lapidus_factory, pg_db, port, client_max_lag=1000)
    stalled = client_loop.connect(url(port), AUTH, stalled=True)
    reader = client_loop.connect(url(port), AUTH)
    rows = 0

    def closed_one():
        nonlocal rows
        if sink_state(proc).get("slow_clients_closed") == 1:
            return True
        pg_db.sql("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(%s, %s) g",
                  args=(rows + 1, rows + 2000))
        rows += 2000
        return False
    wait_until(closed_one, 60, interval=0.2, message="the stalled client closed as too slow")
    stalled.resume()                       # reads what was sent, then the close frame
    assert stalled.ended.wait(30)
    assert stalled.close_code == 1008, (stalled.close_code, stalled.error)
    assert "too slow" in stalled.close_reason and "after=" in stalled.close_reason
    assert len(stalled.frames) < rows
    reader.wait_frames(rows, 60)
    assert reader.ids() == stdout_ids(proc, rows)
    assert "websocket client too slow" in proc.log()
    assert status(proc.config_path)["pg"]["state"] == "RUNNING"


def test_200_clients_at_1000_rows_per_second_each_get_every_matching_event(
        lapidus_factory, pg_db, client_loop):
    tables = [f"a{n}" for n in range(4)]
    for table in tables:
        pg_db.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
    port = free_port()
    proc = start(lapidus_factory, pg_db, port)
    clients = [client_loop.connect(url(port, subjects=f"public.{tables[n % 4]}.*"), AUTH)
               for n in range(200)]
    rows = 5000

    def write():                  # open loop: 10 rows every 10 ms, round robin over tables
        conn = pg_connect(pg_db.name)
        began = time.monotonic()
        with conn.cursor() as cur:
            for tick in range(rows // 10):
                delay = began + tick * 0.01 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)     # the generator's schedule, not a wait for a result
                cur.execute("BEGIN")
                for n in range(tick * 10, tick * 10 + 10):
                    cur.execute(f"INSERT INTO {tables[n % 4]} VALUES (%s, 0)", (n,))
                cur.execute("COMMIT")
        conn.close()
    writer = threading.Thread(target=write)
    writer.start()
    writer.join(60)
    stream = proc.wait_events(rows, 60)
    for n, client in enumerate(clients):
        client.wait_frames(rows // 4, 120)
        assert client.ids() == [e["id"] for e in stream if e["table"] == tables[n % 4]], n
    state = wait_until(lambda: (lambda s: s if s.get("clients") == 200 else None)(
        sink_state(proc)), 15, message="200 clients in lapidusctl status")
    assert state["slow_clients_closed"] == 0


def test_kill_9_of_the_dispatcher_mid_load_a_resuming_client_gets_a_gap_never_a_silent_repeat(
        lapidus_factory, pg_db, client_loop):
    """The replay window is the dispatcher's memory: after a kill -9, a client resuming with
    after= its last id is told ``gap``, unless the worker's replay from its checkpoint has
    already brought that id into the new window (then it continues exactly after it).  The
    replayed events come again with their ids, after the gap frame."""
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
    port = free_port()
    proc = start(lapidus_factory, pg_db, port)
    first = client_loop.connect(url(port), AUTH)
    load = pg_load(pg_db.name)
    first.wait_frames(2000)
    victim = proc.dispatcher_pid()
    os.kill(victim, signal.SIGKILL)
    assert first.ended.wait(15)                       # the connection went with it
    wait_until(lambda: proc.log().count("websocket listener ready") >= 2, 30,
               message="the new dispatcher's websocket listener")
    last = first.ids()[-1]
    second = client_loop.connect(url(port, after=last), AUTH)
    finish(load)
    ids = stdout_ids(proc, expected_count())          # every change once, in commit order
    wait_until(lambda: (second.ids() and second.ids()[-1] == ids[-1]) or second.ended.is_set(),
               60, message="the last change at the resumed client")
    assert not second.ended.is_set(), (second.close_code, second.close_reason)
    order = {event_id: n for n, event_id in enumerate(ids)}
    events = second.events()
    received = [e["id"] for e in events]
    assert len(received) == len(set(received))        # nothing twice within the stream
    if second.frames[0]["type"] == "gap":
        assert second.frames[0]["after"] == last
        # after the gap: a contiguous tail of the stream, in commit order, nothing lost
        tail = ids[order[received[0]]:]
        assert received == tail
    else:
        assert first.ids() + received == ids          # the replay had passed it: seamless
    assert "Traceback" not in proc.log()
