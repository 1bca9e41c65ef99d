"""Core and JetStream publishers against a fake nats-py client: confirmation, window, resends.

The fake has the nats-py internals that lapidus.sinks.nats.wire writes through
(``_send_command`` takes the encoded HPUB frames, ``_transport.write`` the confirming PING,
answered through ``_pongs`` when the fake's ``flush`` says so); the same paths run against the
real server in tests/integration/test_nats_sink.py.
"""

from __future__ import annotations

import asyncio
import ssl
from types import SimpleNamespace

import nats.errors
import pytest

from lapidus.events import Record
from lapidus.sinks.base import SinkError
from lapidus.sinks.nats.connection import Connection, how_to_fix
from lapidus.sinks.nats.core import CorePublisher
from lapidus.sinks.nats.jetstream import JetStreamPublisher
from lapidus.sinks.nats.messages import MessageBuilder
from lapidus.sinks.nats.options import NatsOptions
from lapidus.sinks.nats.wire import parse_header_block


class Log:
    def __init__(self):
        self.lines = []

    def _add(self, level, event, **fields):
        self.lines.append((level, event, fields))

    def info(self, event, **fields):
        self._add("info", event, **fields)

    def warning(self, event, **fields):
        self._add("warning", event, **fields)


class FakeNats:
    """nats-py's public surface, recording publishes; ``ack`` decides each JetStream answer."""

    def __init__(self):
        self.is_connected = True
        self.is_closed = False
        self.connected_url = None
        self.stats = {"reconnects": 0}
        self.max_payload = 1 << 20
        self.published = []
        self.flushes = 0
        self.flush_hangs = False
        self.ack_cb = None
        self.ack = lambda subject, headers, attempt: b'{"stream":"S","seq":1}'
        self.attempts = {}
        self.max_outstanding = 0
        self.outstanding = 0

        # the internals Wire uses (lapidus.sinks.nats.compat.REQUIRED)
        self._pending = []
        self._pending_data_size = 0
        self._flush_queue = None
        self._pongs = []
        self._transport = FakeTransport(self)

    async def _send_command(self, data: bytes) -> None:
        """The HPUB frames Wire encodes, each recorded as a publish."""
        pos = 0
        while pos < len(data):
            line_end = data.index(b"\r\n", pos)
            fields = data[pos:line_end].split()
            subject, reply = fields[1].decode(), (fields[2].decode() if len(fields) == 5 else "")
            header_size, total = int(fields[-2]), int(fields[-1])
            start = line_end + 2
            header = data[start:start + header_size]
            payload = data[start + header_size:start + total]
            pos = start + total + 2
            await self.publish(subject, payload, reply=reply,
                               headers=parse_header_block(header))

    async def _answer_ping(self, pong) -> None:
        """The PONG comes when (and if) the fake's flush() returns."""
        try:
            await self.flush()
        except nats.errors.FlushTimeoutError:
            return
        if not pong.done():
            pong.set_result(True)

    def new_inbox(self):
        return "_INBOX.test"

    async def subscribe(self, subject, cb=None, pending_msgs_limit=0):
        assert subject == "_INBOX.test.*"
        self.ack_cb = cb

    async def publish(self, subject, payload=b"", reply="", headers=None):
        assert self.is_connected, "published while disconnected"
        self.published.append((subject, payload, reply, headers))
        if reply:
            msg_id = headers["Nats-Msg-Id"]
            attempt = self.attempts[msg_id] = self.attempts.get(msg_id, 0) + 1
            answer = self.ack(subject, headers, attempt)
            if answer is not None:
                self.outstanding += 1
                self.max_outstanding = max(self.max_outstanding, self.outstanding)
                asyncio.ensure_future(self._answer(reply, answer))

    async def _answer(self, reply, answer):
        await asyncio.sleep(0)
        self.outstanding -= 1
        data, status = answer if isinstance(answer, tuple) else (answer, None)
        await self.ack_cb(SimpleNamespace(subject=reply, data=data,
                                          headers={"Status": status} if status else None))

    async def flush(self, timeout=10):
        self.flushes += 1
        if self.flush_hangs:
            await asyncio.sleep(3600)


class FakeTransport:
    def __init__(self, nc):
        self.nc = nc

    def write(self, data: bytes) -> None:
        assert data == b"PING\r\n", data
        asyncio.ensure_future(self.nc._answer_ping(self.nc._pongs.pop(0)))

    def writelines(self, parts) -> None:
        raise AssertionError("nothing is left in the fake's buffer")


def records(n, start=0):
    return [Record(f"pg:0/1:{i}", "insert", "public", "t", (str(i),), "0/1", b"{}")
            for i in range(start, start + n)]


async def setup(**options):
    settings = NatsOptions.parse(options)
    log = Log()
    conn = Connection(settings, "shop", log)
    conn.nc = FakeNats()
    conn._came_up("nats connected")
    messages = MessageBuilder("shop", settings)
    if settings.jetstream:
        publisher = JetStreamPublisher(conn, "shop", settings.max_pending_acks,
                                       settings.ack_timeout, settings.flush_timeout, None, log)
    else:
        publisher = CorePublisher(conn, settings.flush_timeout, log)
    await publisher.start()
    return conn, publisher, messages, log


async def drop_and_restore(conn, down_for=0.01):
    conn.nc.is_connected = False
    await conn._on_disconnected()
    await asyncio.sleep(down_for)
    conn.nc.stats["reconnects"] += 1
    conn.nc.is_connected = True
    conn.nc.flush_hangs = False
    await conn._on_reconnected()


def subjects(nc):
    return [p[0] for p in nc.published]


# -- core -------------------------------------------------------------------------------------

def test_core_publishes_in_order_then_flushes():
    async def run():
        conn, publisher, messages, _ = await setup()
        await publisher.publish(messages.build(records(300)))
        assert subjects(conn.nc) == [f"public.t.{i}" for i in range(300)]
        assert conn.nc.published[0][3]["Nats-Msg-Id"] == "pg:0/1:0"
        assert conn.nc.flushes == 1
    asyncio.run(run())


def test_core_batch_is_resent_whole_after_a_reconnect_during_the_flush():
    async def run():
        conn, publisher, messages, log = await setup()
        conn.nc.flush_hangs = True
        task = asyncio.ensure_future(publisher.publish(messages.build(records(5))))
        while conn.nc.flushes == 0:
            await asyncio.sleep(0.001)
        assert not task.done()
        await drop_and_restore(conn)
        await asyncio.wait_for(task, 2)
        expected = [f"public.t.{i}" for i in range(5)]
        assert subjects(conn.nc) == expected + expected
        assert any("lost during a batch" in line[1] for line in log.lines)
    asyncio.run(run())


def test_core_waits_while_disconnected_and_publishes_nothing_meanwhile():
    async def run():
        conn, publisher, messages, _ = await setup()
        conn.nc.is_connected = False
        await conn._on_disconnected()
        task = asyncio.ensure_future(publisher.publish(messages.build(records(3))))
        await asyncio.sleep(0.05)
        assert not task.done() and conn.nc.published == []
        conn.nc.stats["reconnects"] += 1
        conn.nc.is_connected = True
        await conn._on_reconnected()
        await asyncio.wait_for(task, 2)
        assert subjects(conn.nc) == ["public.t.0", "public.t.1", "public.t.2"]
    asyncio.run(run())


def test_core_flush_answered_by_a_new_connection_does_not_confirm():
    async def run():
        conn, publisher, messages, _ = await setup()
        original_flush = conn.nc.flush

        async def flush_after_silent_reconnect(timeout=10):
            # the reconnect counter moved before the disconnect callback ran
            if conn.nc.flushes == 0:
                conn.nc.stats["reconnects"] += 1
            await original_flush(timeout)

        conn.nc.flush = flush_after_silent_reconnect
        await publisher.publish(messages.build(records(2)))
        assert subjects(conn.nc) == ["public.t.0", "public.t.1"] * 2
    asyncio.run(run())


# -- JetStream --------------------------------------------------------------------------------

def test_jetstream_confirms_when_every_ack_arrived():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True)
        await publisher.publish(messages.build(records(1000)))
        replies = [p[2] for p in conn.nc.published]
        assert len(set(replies)) == 1000 and all(r.startswith("_INBOX.test.") for r in replies)
        assert publisher._waiting == {}
    asyncio.run(run())


def test_jetstream_window_bounds_unacknowledged_messages():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True, max_pending_acks=3)
        await publisher.publish(messages.build(records(50)))
        assert conn.nc.max_outstanding <= 3
        assert subjects(conn.nc) == [f"public.t.{i}" for i in range(50)]
    asyncio.run(run())


def test_jetstream_duplicate_ack_counts_as_stored():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True)
        conn.nc.ack = lambda s, h, a: b'{"stream":"S","seq":1,"duplicate":true}'
        await publisher.publish(messages.build(records(3)))
    asyncio.run(run())


def test_jetstream_missing_ack_resends_the_same_message_id():
    async def run():
        conn, publisher, messages, log = await setup(jetstream=True, ack_timeout=0.05)
        # the first ack of event 1 is lost; the resend is acknowledged
        conn.nc.ack = lambda s, h, attempt: (None if h["Nats-Msg-Id"] == "pg:0/1:1"
                                             and attempt == 1 else b'{"stream":"S","seq":1}')
        await asyncio.wait_for(publisher.publish(messages.build(records(3))), 2)
        ids = [p[3]["Nats-Msg-Id"] for p in conn.nc.published]
        assert ids == ["pg:0/1:0", "pg:0/1:1", "pg:0/1:2", "pg:0/1:1"]
        assert any("acks missing" in line[1] for line in log.lines)
    asyncio.run(run())


def test_jetstream_resends_lost_acks_that_fill_the_window():
    async def run():
        # Every first ack is lost and the window holds 3: the three unacknowledged messages
        # fill it, and their resend must not wait for room they already hold.
        conn, publisher, messages, _ = await setup(jetstream=True, max_pending_acks=3,
                                                   ack_timeout=0.05)
        conn.nc.ack = lambda s, h, attempt: None if attempt == 1 else b'{"stream":"S","seq":1}'
        await asyncio.wait_for(publisher.publish(messages.build(records(5))), 5)
        ids = [p[3]["Nats-Msg-Id"] for p in conn.nc.published]
        assert sorted(set(ids)) == [f"pg:0/1:{i}" for i in range(5)]
        assert all(ids.count(i) == 2 for i in set(ids))     # each lost once, resent once
        assert publisher._waiting == {}
    asyncio.run(run())


def test_jetstream_cache_messages_after_a_stalled_full_window_are_still_sent():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True, cache_prefix="cache.",
                                                   max_pending_acks=2, ack_timeout=0.1)
        # the first acks of events 0 and 1 are lost: the window is full, the first send
        # stops there, and the stall's resend must also write the cache messages after it
        conn.nc.ack = lambda s, h, attempt: (None if attempt == 1 and h["Nats-Msg-Id"] in (
            "pg:0/1:0", "pg:0/1:1") else b'{"stream":"S","seq":1}')
        await asyncio.wait_for(publisher.publish(messages.build(records(4))), 5)
        cache = [s for s in subjects(conn.nc) if s.startswith("cache.")]
        assert sorted(cache) == [f"cache.populate.public.t.{i}" for i in range(4)]
    asyncio.run(run())


def test_jetstream_ack_of_a_stream_named_error_is_not_an_error():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True)
        conn.nc.ack = lambda s, h, a: b'{"stream":"error","domain":"error","seq":1}'
        await asyncio.wait_for(publisher.publish(messages.build(records(3))), 2)
        conn.nc.ack = lambda s, h, a: (b'{"error":{"code":503,"err_code":10077,'
                                       b'"description":"maximum messages exceeded"}}')
        with pytest.raises(SinkError, match="maximum messages exceeded"):
            await asyncio.wait_for(publisher.publish(messages.build(records(1))), 2)
    asyncio.run(run())


def test_jetstream_gives_up_after_repeated_silence_with_a_clear_error():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True, ack_timeout=0.02)
        conn.nc.ack = lambda s, h, a: None
        with pytest.raises(SinkError, match="acknowledged nothing"):
            await asyncio.wait_for(publisher.publish(messages.build(records(2))), 2)
        assert publisher._waiting == {}
    asyncio.run(run())


def test_jetstream_no_responders_names_the_subject_and_the_fix():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True)
        conn.nc.ack = lambda s, h, a: (b"", "503")
        with pytest.raises(SinkError) as info:
            await publisher.publish(messages.build(records(1)))
        text = str(info.value)
        assert 'no stream captures subject "public.t.0"' in text and "stream" in text
        assert "jetstream = false" in text
    asyncio.run(run())


def test_jetstream_error_ack_is_reported():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True)
        conn.nc.ack = lambda s, h, a: (b'{"error":{"code":503,"err_code":10077,'
                                       b'"description":"maximum messages exceeded"}}')
        with pytest.raises(SinkError, match="maximum messages exceeded"):
            await publisher.publish(messages.build(records(1)))
    asyncio.run(run())


def test_jetstream_resends_only_unacknowledged_in_order_after_a_reconnect():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True, ack_timeout=5)
        # events 0-2 are acknowledged; 3-5 reach a dying connection and get no ack
        conn.nc.ack = lambda s, h, a: (b'{"stream":"S","seq":1}'
                                       if int(h["Nats-Msg-Id"].rsplit(":", 1)[1]) < 3 or a > 1
                                       else None)
        task = asyncio.ensure_future(publisher.publish(messages.build(records(6))))
        while len(conn.nc.published) < 6:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        assert not task.done()
        await drop_and_restore(conn)
        await asyncio.wait_for(task, 2)
        ids = [int(p[3]["Nats-Msg-Id"].rsplit(":", 1)[1]) for p in conn.nc.published]
        assert ids == [0, 1, 2, 3, 4, 5, 3, 4, 5]
    asyncio.run(run())


def test_jetstream_cache_messages_are_plain_and_confirmed_by_a_flush():
    async def run():
        conn, publisher, messages, _ = await setup(jetstream=True, cache_prefix="c.")
        await publisher.publish(messages.build(records(2)))
        assert [(p[0], bool(p[2])) for p in conn.nc.published] == [
            ("public.t.0", True), ("c.populate.public.t.0", False),
            ("public.t.1", True), ("c.populate.public.t.1", False)]
        assert conn.nc.flushes == 1
    asyncio.run(run())


def test_core_flush_timeout_on_a_live_connection_is_an_error_naming_the_fix():
    import nats.errors

    async def run():
        conn, publisher, messages, _ = await setup(flush_timeout=0.01)

        async def no_pong(timeout=10):
            raise nats.errors.FlushTimeoutError

        conn.nc.flush = no_pong
        with pytest.raises(SinkError, match="raise flush_timeout"):
            await publisher.publish(messages.build(records(1)))
    asyncio.run(run())


# -- the connection ---------------------------------------------------------------------------

def test_disconnect_drops_what_nats_py_buffered_but_had_not_written():
    async def run():
        conn = Connection(NatsOptions.parse({}), "shop", Log())
        conn.nc._pending = [b"HPUB a 1 1\r\nx\r\n"]
        conn.nc._pending_data_size = 14
        session = conn.session()
        await conn._on_disconnected()
        assert conn.nc._pending == [] and conn.nc._pending_data_size == 0
        assert session.lost.done() and not conn.intact(session)
    asyncio.run(run())


def test_health_says_connected_or_down_and_for_how_long():
    async def run():
        conn, _, _, _ = await setup()
        up = conn.health()
        conn.nc.is_connected = False
        await conn._on_disconnected()
        await asyncio.sleep(0.15)
        down = conn.health()
        conn.nc.is_connected = True
        await conn._on_reconnected()
        return up, down, conn.health()
    up, down, again = asyncio.run(run())
    assert up["connected"] is True and up["down_seconds"] is None
    assert down["connected"] is False and down["down_seconds"] >= 0.1
    assert again["connected"] is True and again["down_seconds"] is None


@pytest.mark.timeout(20)
def test_waiting_for_the_connection_yields_while_nats_py_reconnects(monkeypatch):
    async def wait_for_returning_at_once(awaitable, timeout):
        # Python 3.12's wait_for: an awaitable that is already done does not suspend
        async with asyncio.timeout(timeout):
            return await awaitable
    monkeypatch.setattr(asyncio, "wait_for", wait_for_returning_at_once)

    async def run():
        conn, _, _, _ = await setup()
        conn.nc.is_connected = False          # reconnecting; the callback has not run yet
        asyncio.get_running_loop().call_later(0.05, setattr, conn.nc, "is_connected", True)
        await conn.wait_ready()
        return conn.ready
    assert asyncio.run(run())


def test_connect_arguments_reconnect_forever_and_name_the_backend():
    async def run():
        conn = Connection(NatsOptions.parse({"servers": ["nats://a:1", "nats://b:2"],
                                             "user": "u", "password": "pw"}), "shop", Log())
        args = conn.connect_arguments()
        assert args["max_reconnect_attempts"] == -1 and args["allow_reconnect"] is True
        assert args["name"] == "lapidus:shop"
        assert args["servers"] == ["nats://a:1", "nats://b:2"]
        assert (args["user"], args["password"]) == ("u", "pw") and "tls" not in args
    asyncio.run(run())


def test_errors_of_wrong_settings_say_what_to_change_and_outages_do_not():
    assert "refused the credentials" in how_to_fix(nats.errors.AuthorizationError())
    assert "refused the credentials" in how_to_fix(
        nats.errors.Error("nats: 'Authorization Violation'"))
    assert "tls_ca_file" in how_to_fix(ssl.SSLCertVerificationError("self-signed"))
    assert how_to_fix(ConnectionRefusedError(111, "Connect call failed")) is None
    assert how_to_fix(nats.errors.StaleConnectionError()) is None


def test_logged_state_changes_carry_no_credentials():
    async def run():
        log = Log()
        conn = Connection(NatsOptions.parse({"server": "nats://u:s3cr3tpw@h:4222"}), "shop", log)
        conn.nc = FakeNats()
        conn._came_up("nats connected")
        await conn._on_disconnected()
        await conn._on_error(OSError("connection refused"))
        await conn._on_reconnected()
        assert [line[1] for line in log.lines] == [
            "nats connected", "nats disconnected; reconnecting", "nats connection error",
            "nats reconnected"]
        assert "s3cr3tpw" not in repr(log.lines)
        assert log.lines[1][2]["server"] == "nats://h:4222"
    asyncio.run(run())
