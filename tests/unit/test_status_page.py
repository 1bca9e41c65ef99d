"""Unit tests of the status page's parts: the server-sent events stream served from a loop like
the arbiter's (a page that stops reading is closed at its backlog bound while the others and
plain requests go on; a vanished page stops its tail), the token, the masking of values, the
dispatcher's tail rings and watch, the chart's rate history, the status pipe's non-blocking
request, and the page's files in the package data."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import select
import socket
import time
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import structlog

from lapidus.events import Record
from lapidus.sinks.base import Delivery
from lapidus.supervisor.dispatcher import Pipeline
from lapidus.supervisor.handles import ChildHandle
from lapidus.supervisor.http import HttpServer, Request, parse_request
from lapidus.supervisor.rates import RateHistory
from lapidus.supervisor.status_page import COOKIE, StatusPage
from lapidus.supervisor.tail_ring import KEEP, WATCH_LAPSES, TailRing, TailWatch
from lapidus.supervisor.tail_view import MASK, TailView, masked
from lapidus.backoff import RestartPolicy
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
LOG = structlog.get_logger()


def status_of(size: int):
    """A status with one backend whose last error makes the document ``size`` bytes big."""
    return lambda: {"pid": 1, "config": "x.toml", "dispatcher": {}, "backends": [
        {"name": "shop", "state": "RUNNING", "restarts": 0, "last_error": "e" * size}]}


class Asked:
    """Stands in for the dispatcher's pipe: records the requests."""

    def __init__(self):
        self.requests = []

    def __call__(self, message):
        self.requests.append(message)
        return True


def serve(token=None, size=100, ask=None):
    tails = TailView(ask or Asked())
    page = StatusPage(status_of(size), lambda: {"shop": RateHistory()}, tails, token, LOG)
    server = HttpServer("127.0.0.1", 0, status_of(size), LOG, page)
    server.open()
    return server, page


def turn(server, timeout: float = 0.01) -> None:
    """One turn of a loop like the arbiter's (Arbiter._wait): poll, serve, wake the page."""
    poller, callbacks = select.poll(), {}
    for fd, mask, callback in server.poll_entries():
        poller.register(fd, mask)
        callbacks[fd] = callback
    for fd, events in poller.poll(timeout * 1000):
        callbacks[fd](events)
    server.expire(time.monotonic())


def connect(server, path: str, headers: str = "") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.bound_port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    return sock


def answer_of(server, sock) -> bytes:
    """A one-shot response, read while the loop turns."""
    sock.setblocking(False)
    data = bytearray()

    def complete():
        turn(server)
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return False
        data.extend(chunk)
        return not chunk
    wait_until(complete, 10, message="the whole answer")
    return bytes(data)


def test_a_page_that_stops_reading_is_closed_at_its_bound_while_others_go_on():
    server, page = serve(size=100_000)
    server.max_backlog = 256 << 10
    try:
        stalled = connect(server, "/events")
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader = connect(server, "/events")
        reader.setblocking(False)
        received = bytearray()
        wait_until(lambda: turn(server) or len(page.viewers) == 2, 5, message="two viewers")
        stalled_client = page.viewers[0].client

        def stalled_is_closed():
            page.due = 0                  # a push every turn, not every second
            turn(server)
            try:
                received.extend(reader.recv(1 << 20))
            except BlockingIOError:
                pass
            assert len(stalled_client.backlog) <= server.max_backlog
            return stalled_client.fileno() not in server.clients
        wait_until(stalled_is_closed, 30, message="the stalled page closed")
        turn(server)

        # the one that reads got every push so far, and is still served
        assert len(page.viewers) == 1 and page.viewers[0].client.stream
        pushes = received.count(b"event: status\n")
        assert pushes > (server.max_backlog // 100_000)
        # so are plain requests
        assert answer_of(server, connect(server, "/healthz")).startswith(b"HTTP/1.1 200 OK")
        stalled.close()
        reader.close()
    finally:
        server.close()


def test_a_vanished_page_is_dropped_and_its_tail_no_longer_watched():
    asked = Asked()
    server, page = serve(ask=asked)
    try:
        sock = connect(server, "/events?tail=shop")
        wait_until(lambda: turn(server) or page.viewers, 5, message="a viewer")
        assert asked.requests[-1] == ("watch", ["shop"])
        sock.close()
        wait_until(lambda: turn(server) or not page.viewers, 5, message="the viewer gone")
        turn(server)
        assert asked.requests[-1] == ("watch", [])
        assert not server.clients and page.next_push() is None
    finally:
        server.close()


def test_the_stream_sends_status_rates_and_the_tail_masked_unless_asked():
    server, page = serve()
    try:
        masked_sock = connect(server, "/events?tail=shop")
        shown_sock = connect(server, "/events?tail=shop&values=1")
        wait_until(lambda: turn(server) or len(page.viewers) == 2, 5, message="two viewers")
        event = b'{"id":"shop:0/1:0","type":"insert","table":"items","pk":{"id":7},' \
                b'"item":{"id":7,"name":"Ada"}}'
        page.tail_arrived({"backend": "shop", "events": [(1, event)]})
        for sock, shown in ((masked_sock, False), (shown_sock, True)):
            sock.setblocking(False)
            data = bytearray()

            def has_tail():
                turn(server)
                try:
                    data.extend(sock.recv(65536))
                except BlockingIOError:
                    pass
                return data.count(b"event: tail\n") == 2   # the kept ones (none), then this
            wait_until(has_tail, 5, message="the tail event")
            assert data.startswith(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream")
            assert b"event: status\n" in data and b"event: rates\n" in data
            tail = json.loads(data.split(b"event: tail\ndata: ")[-1].split(b"\n")[0])
            (item,) = tail["events"]
            assert item["item"] == ({"id": 7, "name": "Ada"} if shown
                                    else {"id": MASK, "name": MASK})
            assert item["id"] == "shop:0/1:0" and item["table"] == "items"
            sock.close()
    finally:
        server.close()


def test_token_refuses_page_json_and_stream_and_a_right_one_becomes_a_cookie():
    server, page = serve(token="s3cret")
    try:
        def get(path, headers=""):
            return page.route(parse_request(
                f"GET {path} HTTP/1.1\r\n{headers}\r\n".encode()))
        assert get("/").code.startswith("401") and b"<form" in get("/").body
        assert get("/status.json").code.startswith("401")
        assert get("/status.json", "Authorization: Bearer nope\r\n").code.startswith("401")
        assert get("/status.json", "Authorization: Bearer s3cret\r\n").code == "200 OK"
        assert get("/status.json", f"Cookie: a=b; {COOKIE}=s3cret\r\n").code == "200 OK"
        assert b"not the one configured" in get("/?token=wrong").body
        entered = get("/?token=s3cret")
        assert entered.code == "303 See Other"
        assert dict(entered.headers)["Set-Cookie"].startswith(f"{COOKIE}=s3cret; HttpOnly")
        assert get("/page.js").code == "200 OK"       # holds nothing of the database
        answer = answer_of(server, connect(server, "/events?tail=shop&values=1"))
        assert answer.startswith(b"HTTP/1.1 401") and not page.viewers
        assert answer_of(server, connect(server, "/metrics")).startswith(b"HTTP/1.1 200")
    finally:
        server.close()


def test_masked_keeps_names_and_replaces_every_value():
    event = {"id": "a:1:0", "type": "update", "schema": "public", "table": "t",
             "pk": {"id": 1}, "item": {"id": 1, "doc": {"nested": "x"}, "n": None},
             "before": {"id": 1, "doc": None}, "position": "0/1", "ts": "2026-01-01T00:00:00Z",
             "unchanged": ["big"], "update": {"set": {"a.b": 3}, "unset": ["c"]},
             "truncated": {"arr": 2}}
    hidden = masked(event)
    assert hidden["pk"] == {"id": MASK}
    assert hidden["item"] == {"id": MASK, "doc": MASK, "n": MASK}
    assert hidden["before"] == {"id": MASK, "doc": MASK}
    assert hidden["update"] == {"set": {"a.b": MASK}, "unset": ["c"]}
    assert hidden["truncated"] == {"arr": MASK}
    assert {k: hidden[k] for k in ("id", "type", "table", "position", "ts", "unchanged")} == \
        {k: event[k] for k in ("id", "type", "table", "position", "ts", "unchanged")}
    assert masked({"type": "message", "prefix": "p", "content": "hello"})["content"] == MASK
    assert event["pk"] == {"id": 1}      # the original is left alone


def record(n: int, size: int = 10) -> Record:
    return Record(f"b:{n}", "insert", "public", "t", (str(n),), "0/1", b"x" * size)


def test_tail_ring_keeps_the_last_records_and_numbers_them():
    ring = TailRing(keep=3)
    ring.add([record(1), record(2)])
    ring.add([record(3), record(4), record(5), record(6)])
    assert [s for s, _ in ring.since(0)] == [4, 5, 6]
    assert [s for s, _ in ring.since(5)] == [6]
    assert len(ring.records) == 3
    big = TailRing()
    big.add([record(1, size=1 << 20)])
    assert b"too_large_to_show" in big.since(0)[0][1]


def test_tail_watch_gives_rings_to_watched_pipelines_only_and_lapses():
    class P:
        tail = None
    pipelines = {"a": P(), "b": P()}
    watch = TailWatch()
    watch.watch(["a"], now=100.0)
    assert watch.apply(pipelines, now=100.0) == []
    assert pipelines["a"].tail is not None and pipelines["b"].tail is None
    pipelines["a"].tail.add([record(1)])
    sent = watch.apply(pipelines, now=100.1)
    assert [(name, [s for s, _ in events]) for name, events in sent] == [("a", [1])]
    assert watch.apply(pipelines, now=100.2) == []          # nothing new
    assert not watch.idle(pipelines)
    watch.apply(pipelines, now=100.0 + WATCH_LAPSES + 0.1)   # no renewal: lapsed
    assert pipelines["a"].tail is None
    assert watch.idle(pipelines)     # the dispatcher's tail task sleeps until a watch


def test_pipeline_fills_its_ring_only_while_it_has_one():
    class Sink:
        shared = False

        async def send(self, records):
            pass

    async def run():
        pipeline = Pipeline("crm", [Sink()], LOG)
        generation = pipeline.attach(None)
        task = asyncio.create_task(pipeline.run())
        pipeline.queue.put_nowait((generation, 1, Delivery([record(1)])))
        while pipeline.delivered < 1:
            await asyncio.sleep(0)
        pipeline.tail = TailRing()
        pipeline.queue.put_nowait((generation, 2, Delivery([record(2), record(3)])))
        while pipeline.delivered < 3:
            await asyncio.sleep(0)
        task.cancel()
        return pipeline.tail
    ring = asyncio.run(run())
    assert [r.id for r in ring.records] == ["b:2", "b:3"]


def test_tail_view_keeps_only_watched_backends_and_renews_its_watch():
    asked = Asked()
    view = TailView(asked)
    view.want(["shop"], now=10.0)
    assert view.arrived("other", [(1, b"{}")]) == []
    assert [e.serial for e in view.arrived("shop", [(1, b'{"id": 1}'), (2, b"{}")])] == [1, 2]
    view.want(["shop"], now=11.0)
    view.want(["shop"], now=12.5)
    assert asked.requests == [("watch", ["shop"])] * 2
    assert len(view.arrived("shop", [(serial, b"{}") for serial in range(3, 60)])) == 57
    assert len(view.last("shop")) == KEEP
    view.dispatcher_started()        # a new dispatcher is told at once, not at the renewal
    assert asked.requests[-1] == ("watch", ["shop"]) and len(asked.requests) == 3
    view.want([], now=13.0)
    assert view.last("shop") == [] and asked.requests[-1] == ("watch", [])


def test_rate_history_points_and_a_restarted_count():
    history = RateHistory(step=2.0, span=10.0)
    for t, count in ((0, 0), (1, 50), (2, 100), (4, 300), (6, 40)):
        history.add(1000.0 + t, count)
    assert history.points[0] == (1002.0, 50.0)
    assert history.points[1] == (1004.0, 100.0)
    assert history.points[2] == (1006.0, 20.0)    # a new worker counting from zero
    assert history.since(1003.0) == [(1004.0, 100.0), (1006.0, 20.0)]
    for t in range(8, 40, 2):
        history.add(1000.0 + t, 0)
    assert len(history.points) == 5


def test_tell_does_not_wait_on_a_child_that_does_not_read():
    handle = ChildHandle("dispatcher", RestartPolicy(1, 1, 1, 1), LOG)
    ours, theirs = multiprocessing.get_context("fork").Pipe(duplex=True)
    handle.conn = ours
    sent = 0
    while handle.tell(("watch", ["x" * 200])):
        sent += 1
        assert sent < 100_000, "the pipe never filled"
    assert sent > 0
    theirs.close()
    ours.close()


def test_the_page_files_are_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["lapidus.supervisor"]
    files = [p.name for p in (ROOT / "lapidus" / "supervisor" / "page").iterdir()]
    assert files and all(any(fnmatch(f"page/{name}", p) for p in patterns) for name in files)


def test_parse_request_reads_path_query_and_headers():
    request = parse_request(b"GET /events?tail=a%20b&values=1 HTTP/1.1\r\nCookie: x=1\r\n\r\n")
    assert request == Request("GET", "/events", {"tail": "a b", "values": "1"}, {"cookie": "x=1"})
    assert parse_request(b"GET / HTTP/1.1\r\n") is None


def test_a_reload_applies_a_new_token_and_only_a_new_listen_needs_a_restart():
    from lapidus.config import parse_config
    from lapidus.supervisor.reload import ReloadPlan

    def config(http):
        return parse_config({"state_dir": "/tmp/x", "http": http, "plugins": {"stdout": {}},
                             "backends": [{"name": "a", "type": "postgresql",
                                           "database": "d"}]})
    old = config({"listen": "127.0.0.1:9187"})
    with_token = config({"listen": "127.0.0.1:9187", "token": "t"})
    moved = config({"listen": "127.0.0.1:9188", "token": "t"})
    assert ReloadPlan.between(old, with_token, {}).not_applied == []
    assert ReloadPlan.between(with_token, moved, {}).not_applied == ["http.listen"]
