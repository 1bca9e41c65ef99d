"""The webhook sink without Lapidus around it: options, requests, answers, and the retry and
narrowing logic of send() against a scripted client (no network)."""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import hmac
import json
import time

import pytest

from lapidus.events import Record
from lapidus.sinks import optionkit
from lapidus.sinks.base import UndeliverableError
from lapidus.sinks.webhook import WebhookSink, answers
from lapidus.sinks.webhook.options import WebhookOptions, validate
from lapidus.sinks.webhook.requests import RequestBuilder, body_of, signature, verify


def record(i: int) -> Record:
    data = json.dumps({"id": f"pg:0/{i}:0", "type": "insert", "pk": {"id": i}}).encode()
    return Record(f"pg:0/{i}:0", "insert", "public", "t", (str(i),), f"0/{i}", data)


# -- options ---------------------------------------------------------------------------------

def test_options_are_checked_by_key_without_echoing_values():
    problems = dict(validate({"url": "mqtt://u:hunter2@h/x", "batch_size": 0, "timout": 3,
                              "headers": {"Content-Type": "x"}, "secret": ""}))
    assert problems["url"].startswith('has the scheme "mqtt"')
    assert problems["batch_size"] == "must be at least 1, got 0"
    assert 'did you mean "timeout"' in problems["timout"]
    assert "set by the webhook plugin" in problems["headers.Content-Type"]
    assert "is empty" in problems["secret"]
    assert not any("hunter2" in m for m in problems.values())
    assert dict(validate({}))["url"].startswith("is required")
    assert validate({"url": "https://example.test/hook", "secret": "k"}) == []


def test_a_missing_aiohttp_names_the_extra(monkeypatch):
    real = optionkit.importlib.util.find_spec
    monkeypatch.setattr(optionkit.importlib.util, "find_spec",
                        lambda name: None if name == "aiohttp" else real(name))
    assert validate({"url": "http://h/"}) == [
        ("", "needs the aiohttp package, which is not installed (pip install "
             "'lapidus[webhook]')")]


def test_url_credentials_become_basic_auth_and_never_show():
    options = WebhookOptions.parse({"url": "https://bob:p%40ss@h.test:8443/in?x=1"})
    assert options.credentials == ("bob", "p@ss")
    assert options.bare_url == "https://h.test:8443/in?x=1"
    assert options.target == "https://h.test:8443/in"
    assert "p%40ss" not in repr(options) and "bob" not in repr(options)


# -- requests --------------------------------------------------------------------------------

def test_requests_cut_by_batch_size_signed_and_keyed():
    records = [record(i) for i in range(1, 6)]
    requests = list(RequestBuilder("pg", "key").build(records, 2))
    assert [(r.first, r.count) for r in requests] == [(0, 2), (2, 2), (4, 1)]
    first = requests[0]
    assert json.loads(first.body) == {"events": [json.loads(r.data) for r in records[:2]]}
    assert first.body == body_of(records[:2])
    expected = "sha256=" + hmac.new(b"key", first.body, hashlib.sha256).hexdigest()
    assert first.headers["Lapidus-Signature"] == expected == signature("key", first.body)
    assert verify("key", first.body, expected) and not verify("other", first.body, expected)
    assert first.headers["Idempotency-Key"] == "pg:0/1:0..pg:0/2:0"
    assert "Lapidus-Signature" not in RequestBuilder("pg", None).one(records).headers


# -- answers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("status,kind", [
    (200, answers.OK), (204, answers.OK), (429, answers.RETRY), (503, answers.RETRY),
    (500, answers.RETRY), (408, answers.RETRY), (409, answers.RETRY),
    (401, answers.SETTINGS), (403, answers.SETTINGS), (301, answers.SETTINGS),
    (400, answers.REFUSED), (413, answers.REFUSED), (422, answers.REFUSED)])
def test_each_status_has_its_verdict(status, kind):
    assert answers.judge(status, "X").kind == kind


def test_an_unverified_certificate_is_a_settings_error_other_failures_are_retried():
    import ssl
    untrusted = answers.transport_failure(ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed "
           "certificate in certificate chain"), 30.0)
    assert untrusted.kind == answers.UNTRUSTED and "tls_ca_file" in untrusted.fix
    assert "certificate verify failed" in untrusted.reason
    refused = answers.transport_failure(ConnectionRefusedError(111, "Connection refused"), 30)
    assert refused.kind == answers.RETRY and refused.fix == answers.REACH_FIX
    handshake = answers.transport_failure(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong "
                                                          "version number"), 30)
    assert handshake.kind == answers.RETRY and handshake.fix == answers.TLS_FIX
    timeout = answers.transport_failure(asyncio.TimeoutError(), 30.0)
    assert timeout.kind == answers.RETRY and "30 s" in timeout.reason


@pytest.fixture
def unused_tcp_port():
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_refused_plain_http_url_is_told_to_check_the_receiver_not_tls(unused_tcp_port):
    """aiohttp names "ssl:default" in every connection error, http:// too: not a TLS hint."""
    import aiohttp

    async def post():
        async with aiohttp.ClientSession() as session:
            await session.post(f"http://127.0.0.1:{unused_tcp_port}/", data=b"{}")
    with pytest.raises(aiohttp.ClientConnectorError) as info:
        asyncio.run(post())
    verdict = answers.transport_failure(info.value, 30.0)
    assert "ssl:default" in verdict.reason
    assert verdict.fix == answers.REACH_FIX and "tls_ca_file" not in verdict.fix


def test_retry_after_in_seconds_or_as_a_date():
    assert answers.retry_after("7") == 7.0
    assert answers.retry_after("999999") == answers.RETRY_AFTER_MAX
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28 <= answers.retry_after(date, now) <= 31
    assert answers.retry_after("soon") is None and answers.retry_after(None) is None
    assert answers.judge(503, "", "", "2").retry_after == 2.0


# -- send() against a scripted client ----------------------------------------------------------

class ScriptedClient:
    """Answers each POST with the verdict ``answer(events)`` gives; records what it took."""

    def __init__(self, answer):
        self.answer = answer
        self.posted = []

    async def post(self, request):
        events = json.loads(request.body)["events"]
        self.posted.append([e["pk"]["id"] for e in events])
        return self.answer(events)

    async def close(self):
        pass


def sink_with(answer, **options):
    sink = WebhookSink({"url": "http://127.0.0.1:9/hook", "retry_max": 0.01, **options}, "pg")
    sink.client = ScriptedClient(answer)
    return sink


def test_a_refusal_is_narrowed_down_to_its_event_in_order():
    refuse = answers.judge(422, "Unprocessable", "bad row")
    ok = answers.Verdict(answers.OK, "")
    sink = sink_with(lambda events: refuse if any(e["pk"]["id"] == 3 for e in events) else ok,
                     batch_size=10)
    records = [record(i) for i in range(1, 6)]
    with pytest.raises(UndeliverableError) as caught:
        asyncio.run(sink.send(records))
    assert caught.value.index == 2
    assert "event pg:0/3:0 of table public.t" in caught.value.reason
    assert "HTTP 422" in caught.value.reason and caught.value.fix
    assert sink.client.posted == [[1, 2, 3, 4, 5], [1], [2], [3]]


def test_unavailable_is_retried_until_taken_and_shows_in_health():
    answers_left = [answers.judge(503, "Unavailable")] * 3

    def answer(events):
        return answers_left.pop() if answers_left else answers.Verdict(answers.OK, "")
    sink = sink_with(answer, batch_size=2)
    seen_down = []
    real_went_down = sink._went_down

    def went_down(*args):
        real_went_down(*args)
        seen_down.append(sink.health())
    sink._went_down = went_down
    asyncio.run(sink.send([record(i) for i in range(1, 4)]))
    assert sink.client.posted == [[1, 2]] * 4 + [[3]]
    assert seen_down[0]["connected"] is False and "HTTP 503" in seen_down[0]["last_error"]
    assert sink.health()["connected"] is True and sink.health()["server"] == \
        "http://127.0.0.1:9/hook"
