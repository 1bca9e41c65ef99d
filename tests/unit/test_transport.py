"""Frames and the worker's DispatcherLink, against a real unix socket server in tmp_path."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from lapidus.events import Record
from lapidus.transport import (ACK, BATCH, HEADER, HELD, HELLO, DispatcherLink, LinkLost, pack,
                               pack_batch, unpack_from)

RECORD = Record("shop:0/1:0", "insert", "public", "t", ("1",), "0/1", b'{"id":"shop:0/1:0"}')


# -- frames ------------------------------------------------------------------------------

def test_pack_then_unpack_round_trips():
    data = pack(BATCH, (7, [RECORD]))
    frames, used = unpack_from(bytearray(data))
    assert frames == [(BATCH, (7, [RECORD]))]
    assert used == len(data)


def test_a_batch_packed_without_the_memo_reads_back_the_same_and_in_a_stream():
    shared = "public"                      # the same object many times: written each time
    fields = [(f"shop:read:0:public.t:[{i}]", "read", shared, "t", (str(i),), "0/1",
               b'{"id":%d}' % i) for i in range(300)] + [tuple(RECORD), RECORD]
    data = pack_batch(9, fields, True)
    assert HEADER.unpack_from(data) == (len(data) - HEADER.size, BATCH)
    frames, used = unpack_from(bytearray(pack(ACK, 1) + data + pack(ACK, 2)))
    assert frames == [(ACK, 1), (BATCH, (9, fields, True, False)), (ACK, 2)]
    assert unpack_from(bytearray(pack_batch(1, [])))[0] == [(BATCH, (1, [], False, False))]
    assert unpack_from(bytearray(pack_batch(2, fields, routed=True)))[0] == \
        [(BATCH, (2, fields, False, True))]


def test_frame_header_is_big_endian_length_and_kind():
    data = pack(ACK, 3)
    length, kind = HEADER.unpack_from(data)
    assert kind == ACK
    assert length == len(data) - HEADER.size


def test_several_frames_in_one_buffer_come_out_in_order():
    data = pack(HELLO, {"backend": "shop"}) + pack(BATCH, (1, [])) + pack(ACK, 1)
    frames, used = unpack_from(bytearray(data))
    assert frames == [(HELLO, {"backend": "shop"}), (BATCH, (1, [])), (ACK, 1)]
    assert used == len(data)


@pytest.mark.parametrize("cut", [1, HEADER.size - 1, HEADER.size, HEADER.size + 1])
def test_partial_frame_is_left_in_the_buffer(cut):
    first, second = pack(ACK, 1), pack(BATCH, (2, [RECORD]))
    buffer = bytearray(first + second[:cut])
    frames, used = unpack_from(buffer)
    assert frames == [(ACK, 1)]
    assert used == len(first)
    del buffer[:used]
    buffer += second[cut:]
    assert unpack_from(buffer) == ([(BATCH, (2, [RECORD]))], len(second))


def test_empty_buffer_has_no_frames():
    assert unpack_from(bytearray()) == ([], 0)


# -- DispatcherLink ----------------------------------------------------------------------

class FakeDispatcher:
    """The dispatcher's end: a listening unix socket and the one accepted connection."""

    def __init__(self, path: str):
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.conn = None
        self.buffer = bytearray()

    def accept(self) -> None:
        self.listener.settimeout(5.0)
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(5.0)

    def read_frames(self, count: int) -> list:
        """Exactly ``count`` frames, waiting for them (the socket has a timeout)."""
        frames: list = []
        while len(frames) < count:
            got, used = unpack_from(self.buffer)
            del self.buffer[:used]
            frames.extend(got)
            if len(frames) >= count:
                break
            data = self.conn.recv(65536)
            if not data:
                raise AssertionError(f"worker closed the link after {frames}")
            self.buffer += data
        return frames

    def close(self) -> None:
        for sock in (self.conn, self.listener):
            if sock is not None:
                sock.close()


@pytest.fixture
def dispatcher(tmp_path):
    server = FakeDispatcher(str(tmp_path / "d.sock"))
    yield server
    server.close()


@pytest.fixture
def link(dispatcher):
    link = DispatcherLink(dispatcher.path, "shop", connect_timeout=5.0)
    dispatcher.accept()
    yield link
    link.close()


def test_hello_with_the_backend_name_is_the_first_frame(dispatcher, link):
    link.send_batch(1, [RECORD], True)
    assert dispatcher.read_frames(2) == [(HELLO, {"backend": "shop"}),
                                         (BATCH, (1, [RECORD], True, False))]


def test_batches_arrive_in_order(dispatcher, link):
    for seq in range(1, 51):
        link.send_batch(seq, [RECORD._replace(id=f"shop:0/1:{seq}")])
    frames = dispatcher.read_frames(51)[1:]
    assert [payload[0] for kind, payload in frames] == list(range(1, 51))
    assert {kind for kind, _ in frames} == {BATCH}
    assert frames[-1][1][1][0].id == "shop:0/1:50"


def test_batch_larger_than_the_socket_buffer_arrives_whole(dispatcher, link):
    records = [RECORD._replace(id=f"shop:0/1:{i}", data=bytes([i % 256]) * 1000)
               for i in range(4000)]
    sender = threading.Thread(target=link.send_batch, args=(1, records))
    sender.start()                          # blocks until the dispatcher has read enough
    try:
        assert dispatcher.read_frames(2)[1] == (BATCH, (1, records, False, False))
    finally:
        sender.join(10.0)
    assert not sender.is_alive()


def test_acks_without_anything_received_is_none(dispatcher, link):
    assert link.acks(0.0) is None


def test_acks_returns_the_highest_ack_received(dispatcher, link):
    dispatcher.read_frames(1)
    dispatcher.conn.sendall(pack(ACK, 1) + pack(ACK, 2) + pack(ACK, 3))
    assert link.acks(5.0) == 3
    assert link.acks(0.0) is None


def test_held_names_the_sinks_holding_the_batches_until_an_ack_comes(dispatcher, link):
    dispatcher.read_frames(1)
    assert link.held_by == []
    dispatcher.conn.sendall(pack(ACK, 1) + pack(HELD, ["nats"]))
    assert link.acks(5.0) == 1 and link.held_by == ["nats"]
    dispatcher.conn.sendall(pack(HELD, ["nats", "redis"]))
    assert link.acks(5.0) is None and link.held_by == ["nats", "redis"]
    dispatcher.conn.sendall(pack(ACK, 2))
    assert link.acks(5.0) == 2 and link.held_by == []


def test_ack_split_across_reads_is_reassembled(dispatcher, link):
    dispatcher.read_frames(1)
    frame = pack(ACK, 42)
    dispatcher.conn.sendall(frame[:3])
    assert link.acks(5.0) is None
    dispatcher.conn.sendall(frame[3:])
    assert link.acks(5.0) == 42


def test_link_lost_when_the_dispatcher_closes(dispatcher, link):
    dispatcher.read_frames(1)
    dispatcher.conn.close()
    with pytest.raises(LinkLost):
        link.acks(5.0)


def test_send_after_the_dispatcher_closed_raises_link_lost(dispatcher, link):
    dispatcher.read_frames(1)
    dispatcher.conn.close()
    with pytest.raises(LinkLost):
        link.send_batch(1, [RECORD])


def test_link_lost_when_the_dispatcher_dies_with_batches_unread(dispatcher, link):
    link.send_batch(1, [RECORD])          # the dispatcher never reads it
    dispatcher.conn.close()
    with pytest.raises(LinkLost):
        link.acks(5.0)


def test_link_lost_when_no_dispatcher_accepts_within_the_timeout(tmp_path):
    started = time.monotonic()
    with pytest.raises(LinkLost, match="did not accept"):
        DispatcherLink(str(tmp_path / "missing.sock"), "shop", connect_timeout=0.1)
    assert time.monotonic() - started < 5.0
