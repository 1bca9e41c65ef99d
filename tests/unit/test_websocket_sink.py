"""The websocket sink's parts without Lapidus around it: options, subject patterns, the replay
window and its frames, and the sink itself on a loopback port with a real ``websockets``
client (same process, no database)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tomllib

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.frames import Frame, Opcode

from lapidus.events import Record
from lapidus.sinks import optionkit
from lapidus.sinks.websocket import WebsocketSink
from lapidus.sinks.websocket.options import WebsocketOptions, validate
from lapidus.sinks.websocket.patterns import both, matcher, pattern_problem
from lapidus.sinks.websocket.replay import ReplayBuffer, text_frame

TOKEN = "a-token-long-enough-for-the-test"


def record(i: int, table: str = "t") -> Record:
    data = json.dumps({"id": f"pg:0/{i}:0", "type": "insert", "table": table,
                       "pk": {"id": i}, "position": f"0/{i}"}).encode()
    return Record(f"pg:0/{i}:0", "insert", "public", table, (str(i),), f"0/{i}", data)


# -- options ---------------------------------------------------------------------------------

def test_options_are_checked_by_key_without_echoing_tokens():
    problems = dict(validate({
        "listen": "localhost", "path": "events", "tokens": ["tiny-s3cr3t", 3, {"subjects": []}],
        "tls_cert_file": "/nonexistent/cert.pem", "origins": ["https://a.example/"],
        "replay_events": 0, "max_client": 3}))
    assert problems["listen"].startswith('expected "host:port"')
    assert "starting with \"/\"" in problems["path"]
    assert "shorter than 16" in problems["tokens[0]"]
    assert "expected a string" in problems["tokens[1]"]
    assert problems["tokens[2]"] == 'has no "token"'
    assert "non-empty list" in problems["tokens[2].subjects"]
    assert problems["tls_cert_file"].startswith("no such file")
    assert "is required with tls_cert_file" in problems["tls_key_file"]
    assert "no trailing" in problems["origins[0]"]
    assert problems["replay_events"] == "must be at least 1, got 0"
    assert 'did you mean "max_clients"' in problems["max_client"]
    assert not any("tiny-s3cr3t" in message for message in problems.values())
    assert validate({}) == []


def test_a_listener_beyond_loopback_needs_tokens():
    problems = dict(validate({"listen": "0.0.0.0:8765"}))
    assert "are required when listen is not a loopback address" in problems["tokens"]
    assert validate({"listen": "0.0.0.0:8765", "tokens": [TOKEN]}) == []
    assert validate({"listen": "[::1]:8765"}) == []


def test_both_token_shapes_parse_into_grants_and_the_repr_hides_them():
    config = tomllib.loads(f'''
        tokens = ["{TOKEN}"]
        [[more]]
        token = "{TOKEN}-limited"
        subjects = ["public.orders.>"]
    ''')
    options = WebsocketOptions.parse({"tokens": config["tokens"] + config["more"]})
    assert [(g.token, g.subjects) for g in options.grants] == [
        (TOKEN, None), (TOKEN + "-limited", ("public.orders.>",))]
    assert TOKEN not in repr(options)
    assert dict(validate({"tokens": [TOKEN, TOKEN]}))["tokens[1]"].startswith("is given twice")
    # lapidus -t: a token from an unset variable arrives as None and is not checked
    assert validate({"tokens": [None, {"token": None, "subjects": ["a.>"]}]}) == []


def test_a_missing_websockets_names_the_extra(monkeypatch):
    real = optionkit.importlib.util.find_spec
    monkeypatch.setattr(optionkit.importlib.util, "find_spec",
                        lambda name: None if name == "websockets" else real(name))
    assert validate({}) == [
        ("", "needs the websockets package, which is not installed (pip install "
             "'lapidus[websocket]')")]


def test_lapidus_t_lists_every_websocket_problem_and_exits_2(tmp_path):
    config = tmp_path / "lapidus.toml"
    config.write_text('[[backends]]\ntype = "postgresql"\ndatabase = "x"\n'
                      '[plugins.websocket]\nlisten = "0.0.0.0:80800"\n'
                      'tokens = [{ token = "${NOT_SET_HERE}", subjects = ["a.>.b"] }]\n')
    result = subprocess.run([sys.executable, "-m", "lapidus", "-t", "-c", str(config)],
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin"})
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert 'plugins.websocket.listen: expected "host:port"' in out
    assert 'plugins.websocket.tokens[0].subjects[0]: "a.>.b": ">" may only be the last' in out
    assert "Traceback" not in out


# -- subject patterns ------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, subject, matches", [
    ("public.items.>", "public.items.2", True),
    ("public.items.>", "public.items.1.x", True),
    ("public.items.>", "public.items", False),
    ("public.*.*", "public.orders.7", True),
    ("public.*.*", "public.pairs.1.x", False),
    ("public.items.2", "public.items.2", True),
    ("public.items.2", "public.items.20", False),
    ("*.items.>", "sales.items.a%2Eb", True),
    ("_message.>", "_message.audit", True),
    (">", "_gap.shop", True),
    ("public.it.ms.>", "public.items.2", False),     # "." is literal, never "any character"
])
def test_nats_wildcards(pattern, subject, matches):
    assert pattern_problem(pattern) is None
    assert matcher([pattern])(subject) is matches


def test_bad_patterns_and_the_grant_limits_a_subscription():
    assert ">" in pattern_problem("a.>.b")
    assert "whole token" in pattern_problem("public.it*")
    assert "empty token" in pattern_problem("public..items")
    assert "empty" in pattern_problem("")
    limited = both(("public.>",), ("public.orders.>",))
    assert limited("public.orders.1") and not limited("public.items.1")
    assert both(None, None)("anything.at.all")


# -- the replay window -----------------------------------------------------------------------

def test_text_frames_are_what_the_websockets_library_encodes():
    for size in (0, 125, 126, 65535, 65536):
        payload = b"x" * size
        assert text_frame(payload) == Frame(Opcode.TEXT, payload).serialize(mask=False)


def test_the_window_is_bounded_by_events_and_bytes_and_skips_repeats():
    buffer = ReplayBuffer(max_events=3, max_bytes=1 << 20)
    for i in range(5):
        assert buffer.add(f"pg:{i}", "s", b"f%d" % i)
    buffer.trim()
    assert (buffer.base, buffer.head, len(buffer)) == (2, 5, 3)
    assert buffer.after("pg:1") is None and buffer.after("pg:3") == 4
    assert buffer.entries(3, 5) == [("s", b"f3"), ("s", b"f4")]
    assert not buffer.add("pg:4", "s", b"again") and buffer.head == 5
    assert buffer.oldest_id() == "pg:2" and buffer.newest_id() == "pg:4"
    by_bytes = ReplayBuffer(max_events=100, max_bytes=10)
    for i in range(4):
        by_bytes.add(f"pg:{i}", "s", b"12345")
    by_bytes.trim()
    assert len(by_bytes) == 2 and by_bytes.bytes == 10
    big = ReplayBuffer(max_events=100, max_bytes=1)   # one event is always kept
    big.add("pg:0", "s", b"larger than the bound")
    big.trim()
    assert len(big) == 1


def test_random_access_survives_compaction():
    buffer = ReplayBuffer(max_events=10, max_bytes=1 << 20)
    for i in range(20_000):
        buffer.add(f"pg:{i}", "s", str(i).encode())
        buffer.trim()
    assert buffer.entries(19_995, 19_997) == [("s", b"19995"), ("s", b"19996")]
    assert buffer.after("pg:19998") == 19_999


# -- the sink on a loopback port -------------------------------------------------------------

def test_send_reaches_a_subscriber_resumes_and_refuses_without_a_token():
    async def scenario():
        sink = WebsocketSink({"listen": "127.0.0.1:0", "tokens": [TOKEN]}, "pg")
        await sink.start()
        port = next(iter(sink.hub.server.sockets)).getsockname()[1]
        base = f"ws://127.0.0.1:{port}/events"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        try:
            await sink.send([record(1), record(2, "other"), record(3)])
            async with connect(f"{base}?subjects=public.t.*&after=pg:0/1:0",
                               additional_headers=headers) as ws:
                await sink.send([record(4), record(3)])        # 3 again: a replay
                got = [json.loads(await ws.recv())["id"] for _ in range(2)]
                assert got == ["pg:0/3:0", "pg:0/4:0"]
            with pytest.raises(InvalidStatus) as refused:
                async with connect(base):
                    pass
            assert refused.value.response.status_code == 401
            health = sink.health()
            assert health["connected"] and health["repeats_skipped"] == 1
            assert health["refused"] == 1 and health["frames_sent"] == 2
        finally:
            await sink.close()
        assert sink.hub is None
    asyncio.run(scenario())


def test_two_backends_share_one_listener_and_different_options_are_refused():
    async def scenario():
        options = {"listen": "127.0.0.1:0", "path": "/x"}
        first, second = WebsocketSink(options, "pg"), WebsocketSink(options, "crm")
        other = WebsocketSink({**options, "max_clients": 5}, "cms")
        await first.start()
        await second.start()
        try:
            assert first.hub is second.hub and sorted(first.hub.buffers) == ["crm", "pg"]
            with pytest.raises(Exception) as clash:
                await other.start()
            assert "with other options" in str(clash.value)
        finally:
            await first.close()
            await second.close()
    asyncio.run(scenario())


def test_the_sink_figures_are_exported_as_metrics():
    from prometheus_client.parser import text_string_to_metric_families

    from lapidus.supervisor.metrics import render
    state = {"connected": True, "down_seconds": None, "clients": 3, "frames_sent": 120,
             "slow_clients_closed": 1, "refused": 2, "replay_events": 40, "snapshot_runs": 1}
    text = render({"backends": [{"name": "pg", "state": "RUNNING",
                                 "sinks": {"websocket": state}}]})
    found = {s.name: (s.labels, s.value)
             for family in text_string_to_metric_families(text) for s in family.samples
             if s.labels.get("sink") == "websocket"}
    labels = {"backend": "pg", "sink": "websocket"}
    assert found == {"lapidus_websocket_clients": (labels, 3),
                     "lapidus_websocket_frames_total": (labels, 120),
                     "lapidus_websocket_slow_clients_total": (labels, 1),
                     "lapidus_websocket_refused_total": (labels, 2),
                     "lapidus_websocket_replay_events": (labels, 40),
                     "lapidus_websocket_snapshot_runs": (labels, 1),
                     "lapidus_sink_up": (labels, 1),
                     "lapidus_sink_down_seconds": (labels, 0)}


def test_max_clients_and_a_client_that_never_answers_pings():
    import base64
    import os

    async def scenario():
        sink = WebsocketSink({"listen": "127.0.0.1:0", "max_clients": 1, "ping_interval": 0.2,
                              "ping_timeout": 0.2}, "pg")
        await sink.start()
        port = next(iter(sink.hub.server.sockets)).getsockname()[1]
        try:
            # a raw client: it completes the handshake, then never reads or answers a ping
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            key = base64.b64encode(os.urandom(16)).decode()
            writer.write(f"GET /events HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                         f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                         f"Sec-WebSocket-Version: 13\r\n\r\n".encode())
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
            with pytest.raises(InvalidStatus) as full:
                async with connect(f"ws://127.0.0.1:{port}/events"):
                    pass
            assert full.value.response.status_code == 503
            assert b"max_clients" in full.value.response.body
            # the server pings, gets no pong, and closes: the stream ends with a close frame
            rest = await asyncio.wait_for(reader.read(), 10)
            close = rest[rest.rindex(b"\x88"):]
            assert int.from_bytes(close[2:4], "big") == 1011      # keepalive ping timeout
            writer.close()
        finally:
            await sink.close()
    asyncio.run(scenario())


def test_wss_with_the_configured_certificate(tmp_path):
    import ssl

    from tests.integration.tls_fixtures import make_pki

    pki = make_pki(tmp_path)

    async def scenario():
        sink = WebsocketSink({"listen": "127.0.0.1:0", "tls_cert_file": str(pki.server_cert),
                              "tls_key_file": str(pki.server_key)}, "pg")
        await sink.start()
        port = next(iter(sink.hub.server.sockets)).getsockname()[1]
        trusted = ssl.create_default_context(cafile=str(pki.ca))
        try:
            assert sink.health()["server"].startswith("wss://")
            async with connect(f"wss://127.0.0.1:{port}/events", ssl=trusted) as ws:
                await sink.send([record(1)])
                assert json.loads(await ws.recv())["id"] == "pg:0/1:0"
            with pytest.raises(ssl.SSLCertVerificationError):
                async with connect(f"wss://127.0.0.1:{port}/events",
                                   ssl=ssl.create_default_context(cafile=str(pki.wrong_ca))):
                    pass
        finally:
            await sink.close()
    asyncio.run(scenario())


def test_a_certificate_that_does_not_load_is_one_clear_error(tmp_path):
    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")

    async def scenario():
        sink = WebsocketSink({"listen": "127.0.0.1:0", "tls_cert_file": str(tmp_path / "cert.pem"),
                              "tls_key_file": str(tmp_path / "key.pem")}, "pg")
        try:
            with pytest.raises(Exception) as failed:
                await sink.start()
            assert "cannot load tls_cert_file / tls_key_file" in str(failed.value)
            assert sink.health()["connected"] is False
            assert "tls_cert_file" in sink.health()["last_error"]
        finally:
            await sink.close()
    asyncio.run(scenario())


def test_a_port_in_use_is_one_clear_error():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def scenario():
            sink = WebsocketSink({"listen": f"127.0.0.1:{port}"}, "pg")
            with pytest.raises(Exception) as failed:
                await sink.start()
            assert f"cannot listen on 127.0.0.1:{port}" in str(failed.value)
            assert "choose another listen port" in str(failed.value)
        asyncio.run(scenario())
