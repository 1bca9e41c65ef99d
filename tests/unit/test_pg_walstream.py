"""The confirmation rule of the cluster-mode replication reader (lapidus.workers.postgresql
.walstream): the slot is never confirmed past what the worker saved after the sinks acked."""

from __future__ import annotations

import struct

from lapidus.workers.postgresql.walstream import Confirmation, Receiver, start_command


def test_nothing_is_confirmed_before_the_worker_acks():
    rule = Confirmation()
    rule.keepalive((1, 500), 9000)
    assert rule.flush_lsn() == 0          # 0: the server ignores it


def test_the_flush_position_is_the_acked_lsn_not_what_was_read():
    rule = Confirmation()
    rule.keepalive((1, 100), 5000)          # read and spooled up to byte 100, server at 5000
    rule.ack(1001, (1, 60))                 # the sinks have the transaction committed at 1000
    assert rule.flush_lsn() == 1001


def test_a_keepalive_counts_only_once_everything_written_before_it_is_delivered():
    rule = Confirmation()
    rule.keepalive((1, 100), 5000)
    rule.ack(1001, (1, 99))
    assert rule.flush_lsn() == 1001
    rule.ack(1001, (1, 100))                # delivered all that was spooled before it
    assert rule.flush_lsn() == 5000


def test_keepalives_are_taken_in_order_and_a_later_one_waits_for_its_own_data():
    rule = Confirmation()
    rule.keepalive((1, 0), 2000)            # idle before anything was written
    rule.keepalive((1, 300), 6000)          # after a transaction was spooled
    rule.ack(0, (1, 0))
    assert rule.flush_lsn() == 2000
    rule.ack(4001, (1, 200))                # part of what came before the second keepalive
    assert rule.flush_lsn() == 4001
    rule.ack(5001, (2, 0))                  # segment 1 delivered whole, reader in segment 2
    assert rule.flush_lsn() == 6000


def test_the_flush_position_never_goes_back():
    rule = Confirmation(floor=7000)         # the slot's position when the stream started
    rule.ack(3001, (1, 0))                  # an older transaction, as the bucket has it
    assert rule.flush_lsn() == 7000
    rule.ack(2001, (1, 50))                 # an ack can never lower it either
    assert rule.flush_lsn() == 7000
    rule.ack(8001, (1, 80))
    assert rule.flush_lsn() == 8001


def test_a_keepalive_at_the_same_spool_position_replaces_the_previous_one():
    rule = Confirmation()
    for wal_end in (100, 200, 300):
        rule.keepalive((1, 10), wal_end)
    assert len(rule.keepalives) == 1
    rule.ack(0, (1, 10))
    assert rule.flush_lsn() == 300


class _Spy(Receiver):
    """A Receiver without libpq: what it would send."""

    def __init__(self, floor=0):
        from lapidus.workers.postgresql.walstream import Confirmation as C
        self.rule = C(floor)
        self.received = 0
        self.sent_flush = -1
        self.pending, self.pending_bytes, self.stdin_buffer = [], 0, b""
        self.segment, self.offset = 1, 0
        self.sent = []

        class Lib:
            @staticmethod
            def PQputCopyData(_conn, message, _n):
                self.sent.append(message)
                return 1

            @staticmethod
            def PQflush(_conn):
                return 0
        self.lib, self.conn = Lib(), None


def test_feedback_carries_the_rule_s_position_and_the_acks_arrive_as_lines():
    spy = _Spy()
    spy.received = 90_000
    spy.take_acks(b"1001 1 60\n2001 1 9")      # the second line is not complete yet
    assert spy.feedback(force=True)
    kind, write, flush, apply, _t, reply = struct.unpack(">cQQQqB", spy.sent[-1])
    assert (kind, write, flush, apply, reply) == (b"r", 90_000, 1001, 1001, 0)
    assert not spy.feedback()                   # nothing moved: nothing sent
    spy.take_acks(b"0\n")
    assert spy.feedback()
    assert struct.unpack(">cQQQqB", spy.sent[-1])[2] == 2001
    assert spy.feedback(reply=True)             # the server asked: sent even if unchanged


def test_the_start_command_quotes_names_and_values():
    assert start_command("lapidus_pg", ["proto_version=1", 'publication_names="my pub"',
                                        "messages=true"]) == (
        'START_REPLICATION SLOT "lapidus_pg" LOGICAL 0/0 ("proto_version" \'1\', '
        '"publication_names" \'"my pub"\', "messages" \'true\')')
    assert start_command("s", ["add-tables=it's"], 0x1_0000_00FF).endswith(
        "LOGICAL 1/FF (\"add-tables\" 'it''s')")


def test_the_worker_acks_the_saved_checkpoint_s_last_commit_plus_one():
    from lapidus.workers.postgresql.source import PostgresSource

    class Child:
        def __init__(self):
            self.acks = []

        def ack(self, lsn, segment, offset):
            self.acks.append((lsn, segment, offset))

    child = Child()
    # a transaction (commit 0x500) partly delivered after the one committed at 0x400: the
    # server must send 0x500 again whole, so only 0x401 is confirmed
    PostgresSource._ack(child, {"last_lsn": 0x400, "segment": 3, "offset": 77,
                                "tx": {"lsn": 0x500, "xid": "9", "ts": None, "index": 2,
                                       "skip": 0}, "replay": False})
    PostgresSource._ack(child, {"last_lsn": 0, "segment": 1, "offset": 0, "tx": None})
    assert child.acks == [(0x401, 3, 77), (0, 1, 0)]
