"""Unit tests: the ack pre-parser of lapidus.sinks.nats.wire keeps the protocol stream whole.

A real nats-py protocol parser is fed bytes as a socket would deliver them; the client is a
stand-in that records what nats-py's parser dispatches.  Acks taken off the front of a read and
everything left to nats-py must come out in the order the server sent them.
"""

from __future__ import annotations

import asyncio

from nats.protocol.parser import Parser

from lapidus.sinks.nats.wire import Wire

INBOX = "_INBOX.abc."
SID = 5


class RecordingClient:
    def __init__(self):
        self._ps = Parser(self)
        self.seen = []

    async def _process_msg(self, sid, subject, reply, data, headers):
        self.seen.append(("nats-py", sid, bytes(subject), data, headers))

    async def _process_ping(self):
        self.seen.append(("ping",))


def ack(n: int, sid: int = SID) -> bytes:
    # as nats-server writes it: two spaces where a reply subject would be
    return f"MSG {INBOX}{n} {sid}  2\r\n{{}}\r\n".encode()


def wired():
    client = RecordingClient()
    wire = Wire(client)
    wire._read_acks_first(INBOX + "*", SID,
                          lambda subject, data, headers: client.seen.append(
                              ("ack", bytes(subject), data)))
    return client


def feed(client, *reads):
    async def run():
        for data in reads:
            await client._ps.parse(data)
    asyncio.run(run())


def test_acks_at_the_front_of_a_read_are_taken_directly():
    client = wired()
    feed(client, ack(1) + ack(2))
    assert client.seen == [("ack", b"_INBOX.abc.1", b"{}"), ("ack", b"_INBOX.abc.2", b"{}")]


def test_everything_after_another_line_goes_to_nats_py_in_order():
    client = wired()
    split = ack(4)
    feed(client, ack(1) + b"PING\r\n" + ack(3) + split[:-3], split[-3:] + ack(5))
    assert client.seen == [
        ("ack", b"_INBOX.abc.1", b"{}"),
        ("ping",),
        ("nats-py", SID, b"_INBOX.abc.3", b"{}", None),
        ("nats-py", SID, b"_INBOX.abc.4", b"{}", None),    # split across reads
        ("nats-py", SID, b"_INBOX.abc.5", b"{}", None),    # nats-py held partial input
    ]


def test_error_acks_with_headers_and_other_subscriptions_are_left_to_nats_py():
    client = wired()
    status = b"NATS/1.0 503\r\n\r\n"
    error_ack = (f"HMSG {INBOX}7 {SID} {len(status)} {len(status)}\r\n".encode() + status
                 + b"\r\n")
    other = b"MSG _INBOX.abc.8 9 2\r\n{}\r\n"          # same prefix, another subscription
    feed(client, error_ack + ack(8), other)
    assert client.seen == [
        ("nats-py", SID, b"_INBOX.abc.7", b"", status),
        ("nats-py", SID, b"_INBOX.abc.8", b"{}", None),
        ("nats-py", 9, b"_INBOX.abc.8", b"{}", None),
    ]


def test_a_payload_that_looks_like_an_ack_stays_a_payload():
    client = wired()
    payload = ack(9)
    feed(client, f"MSG other.subject 9 {len(payload)}\r\n".encode(), payload + b"\r\n")
    assert client.seen == [("nats-py", 9, b"other.subject", payload, None)]


def test_a_control_line_cut_between_reads_is_joined_and_read_as_an_ack():
    client = wired()
    second = ack(2)
    feed(client, ack(1) + second[:9], second[9:] + ack(3))
    assert [entry[:2] for entry in client.seen] == [
        ("ack", b"_INBOX.abc.1"), ("ack", b"_INBOX.abc.2"), ("ack", b"_INBOX.abc.3")]


class WritesRecorder:
    def __init__(self):
        self.calls = []

    def write(self, data: bytes) -> None:
        self.calls.append([data])

    def writelines(self, parts) -> None:
        self.calls.append(list(parts))


def test_a_ping_goes_after_what_nats_py_still_buffers_in_the_same_write():
    async def run():
        client = RecordingClient()
        client._transport = WritesRecorder()
        client._pongs = []
        client._pending = [b"HPUB a  12 14\r\n", b"payload\r\n"]
        client._pending_data_size = 24
        pong = Wire(client).ping(1.0)
        assert client._transport.calls == [[b"HPUB a  12 14\r\n", b"payload\r\n",
                                            b"PING\r\n"]]
        assert client._pending == [] and client._pending_data_size == 0
        assert client._pongs == [pong] and not pong.done()
        # nothing buffered: the PING alone
        second = Wire(client).ping(1.0)
        assert client._transport.calls[-1] == [b"PING\r\n"]
        assert client._pongs == [pong, second]
    asyncio.run(run())
