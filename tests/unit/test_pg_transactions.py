"""TransactionAssembler: ids, replays after pg_recvlogical restarts, resumable state."""

from __future__ import annotations

import json

import pytest

from lapidus.workers.postgresql.decoding import Begin, Change, Commit, parse_lsn
from lapidus.workers.postgresql.transactions import TransactionAssembler

TS = "2026-11-30T12:28:33.126894Z"


def B(lsn: int, xid: int = 700) -> Begin:
    return Begin(lsn, str(xid), TS)


def C(lsn: int) -> Commit:
    return Commit(lsn)


def I(row: int) -> Change:  # noqa: E743 - reads like the wal2json action letter
    return Change("insert", "public", "t", {"id": row}, {"id": row, "v": f"r{row}"})


def U(row: int) -> Change:
    return Change("update", "public", "t", {"id": row}, {"id": row, "v": "new"},
                  {"id": row}, unchanged=["big"])


def D(row: int) -> Change:
    return Change("delete", "public", "t", {"id": row}, None, {"id": row})


def T() -> Change:
    return Change("truncate", "public", "t")


def M(lsn: int, content: str = "nontx") -> Change:
    """A logical message emitted with transactional = false: it carries its own LSN."""
    return Change("message", prefix="pfx", content=content, transactional=False, lsn=lsn)


def run(assembler: TransactionAssembler, messages) -> list:
    out: list = []
    for message in messages:
        assembler.feed(message, out)
    return out


def ids(events) -> list:
    return [e.id for e in events]


# -- ids ---------------------------------------------------------------------------------

def test_between_transactions_only_after_a_commit():
    """What a batch's at_boundary says: no transaction open, the checkpoint's ``tx`` null;
    a consumed BEGIN opens one even before its first change."""
    assembler = TransactionAssembler("shop")
    assert assembler.between_transactions
    run(assembler, [B(100), I(1)])
    assert not assembler.between_transactions and assembler.state()["tx"] is not None
    run(assembler, [C(100)])
    assert assembler.between_transactions and assembler.state()["tx"] is None
    run(assembler, [B(200)])
    assert not assembler.between_transactions
    run(assembler, [I(2), C(200), M(300)])       # a message outside any transaction
    assert assembler.between_transactions


def test_event_id_is_backend_commit_lsn_and_index_in_transaction():
    lsn = parse_lsn("0/1928C90")
    events = run(TransactionAssembler("shop"), [B(lsn, 733), I(1), I(2), C(lsn)])
    assert ids(events) == ["shop:0/1928C90:0", "shop:0/1928C90:1"]
    first = events[0]
    assert (first.position, first.txid, first.ts) == ("0/1928C90", "733", TS)
    assert (first.type, first.schema, first.table) == ("insert", "public", "t")
    assert (first.pk, first.item, first.before) == ({"id": 1}, {"id": 1, "v": "r1"}, None)


def test_event_carries_the_change_fields():
    events = run(TransactionAssembler("shop"), [B(0x100), U(5), D(6), T(), C(0x100)])
    update, delete, truncate = events
    assert (update.type, update.before, update.unchanged) == ("update", {"id": 5}, ["big"])
    assert (delete.type, delete.item, delete.before) == ("delete", None, {"id": 6})
    assert (truncate.type, truncate.pk, truncate.item) == ("truncate", None, None)


def test_position_uses_postgresql_spelling_of_high_lsns():
    lsn = (0x1A << 32) | 0xB
    events = run(TransactionAssembler("shop"), [B(lsn), I(1), C(lsn)])
    assert ids(events) == ["shop:1A/B:0"]
    assert events[0].position == "1A/B"


def test_indexes_restart_at_zero_in_the_next_transaction():
    events = run(TransactionAssembler("shop"),
                 [B(0x100), I(1), I(2), C(0x100), B(0x200), I(3), C(0x200)])
    assert ids(events) == ["shop:0/100:0", "shop:0/100:1", "shop:0/200:0"]


# -- replays after a pg_recvlogical restart ----------------------------------------------

def test_replayed_transaction_is_skipped_entirely():
    assembler = TransactionAssembler("shop")
    first = run(assembler, [B(0x100), I(1), I(2), C(0x100), B(0x200), I(3), C(0x200)])
    assert len(first) == 3
    replay = run(assembler, [B(0x100), I(1), I(2), C(0x100), B(0x200), I(3), C(0x200)])
    assert replay == []
    later = run(assembler, [B(0x300), I(4), C(0x300)])
    assert ids(later) == ["shop:0/300:0"]


def test_transaction_with_lower_commit_lsn_than_last_complete_is_skipped():
    assembler = TransactionAssembler("shop")
    run(assembler, [B(0x200), I(1), C(0x200)])
    assert run(assembler, [B(0x150), I(9), C(0x150)]) == []


def test_transaction_cut_in_the_middle_yields_exactly_the_missing_rows():
    assembler = TransactionAssembler("shop")
    before_cut = run(assembler, [B(0x200, 734), I(1), I(2)])
    assert ids(before_cut) == ["shop:0/200:0", "shop:0/200:1"]
    resent = run(assembler, [B(0x200, 734), I(1), I(2), I(3), C(0x200)])
    assert ids(resent) == ["shop:0/200:2"]
    assert resent[0].item == {"id": 3, "v": "r3"}
    assert resent[0].txid == "734"


def test_transaction_cut_after_its_last_row_yields_nothing_more():
    assembler = TransactionAssembler("shop")
    run(assembler, [B(0x200), I(1), I(2)])
    assert run(assembler, [B(0x200), I(1), I(2), C(0x200)]) == []
    assert ids(run(assembler, [B(0x300), I(3), C(0x300)])) == ["shop:0/300:0"]


def test_transaction_cut_twice_yields_each_row_once():
    assembler = TransactionAssembler("shop")
    events = run(assembler, [B(0x200), I(1),
                             B(0x200), I(1), I(2),
                             B(0x200), I(1), I(2), I(3), C(0x200)])
    assert ids(events) == ["shop:0/200:0", "shop:0/200:1", "shop:0/200:2"]
    assert [e.item["id"] for e in events] == [1, 2, 3]


def test_transaction_cut_again_while_skipping_its_resent_rows_yields_each_row_once():
    assembler = TransactionAssembler("shop")
    events = run(assembler, [B(0x200), I(1), I(2),
                             B(0x200), I(1),                      # cut while skipping
                             B(0x200), I(1), I(2), I(3), C(0x200)])
    assert [e.item["id"] for e in events] == [1, 2, 3]


def test_full_replay_of_earlier_transaction_does_not_disturb_the_open_one():
    assembler = TransactionAssembler("shop")
    run(assembler, [B(0x100), I(1), C(0x100)])
    assert ids(run(assembler, [B(0x200), I(2)])) == ["shop:0/200:0"]
    # pg_recvlogical restarted: the server resends from before the first transaction
    assert run(assembler, [B(0x100), I(1), C(0x100)]) == []
    assert assembler.state()["tx"]["lsn"] == 0x200
    assert assembler.state()["tx"]["index"] == 1
    rest = run(assembler, [B(0x200), I(2), I(3), C(0x200)])
    assert ids(rest) == ["shop:0/200:1"]
    assert rest[0].item["id"] == 3


# -- messages outside transactions ------------------------------------------------------

def test_non_transactional_message_gets_its_own_lsn_as_id():
    lsn = parse_lsn("0/21C75A0")
    events = run(TransactionAssembler("shop"), [M(lsn)])
    assert ids(events) == ["shop:0/21C75A0:0"]
    message = events[0]
    assert (message.type, message.prefix, message.content) == ("message", "pfx", "nontx")
    assert message.transactional is False
    assert (message.position, message.txid, message.ts) == ("0/21C75A0", None, None)


def test_replayed_non_transactional_message_is_skipped():
    assembler = TransactionAssembler("shop")
    assert len(run(assembler, [M(0x150), B(0x200), I(1), C(0x200), M(0x250)])) == 3
    assert run(assembler, [M(0x150), B(0x200), I(1), C(0x200), M(0x250)]) == []
    assert ids(run(assembler, [M(0x260)])) == ["shop:0/260:0"]


def test_non_transactional_message_older_than_last_commit_is_a_replay():
    assembler = TransactionAssembler("shop")
    run(assembler, [B(0x200), I(1), C(0x200)])
    assert run(assembler, [M(0x150)]) == []


def test_transaction_after_a_non_transactional_message_is_not_a_replay():
    assembler = TransactionAssembler("shop")
    events = run(assembler, [M(0x150), B(0x200), I(1), C(0x200)])
    assert ids(events) == ["shop:0/150:0", "shop:0/200:0"]


def test_replayed_non_transactional_message_does_not_join_a_cut_transaction():
    assembler = TransactionAssembler("shop")
    first = run(assembler, [M(0x150), B(0x200), I(1), I(2)])        # pg_recvlogical dies here
    assert ids(first) == ["shop:0/150:0", "shop:0/200:0", "shop:0/200:1"]
    # the server resends everything after the slot's confirmed position, the message included
    resent = run(assembler, [M(0x150), B(0x200), I(1), I(2), I(3), C(0x200)])
    assert ids(resent) == ["shop:0/200:2"]
    assert resent[0].item["id"] == 3


# -- state -------------------------------------------------------------------------------

def test_state_is_json_serialisable_at_every_step():
    assembler = TransactionAssembler("shop")
    for message in SESSION:
        assembler.feed(message, [])
        state = assembler.state()
        assert json.loads(json.dumps(state)) == state


def test_state_of_fresh_assembler_has_no_open_transaction():
    assert TransactionAssembler("shop").state() == {"last_lsn": 0, "tx": None, "replay": False}


def test_state_accepts_a_checkpoint_with_extra_keys():
    saved = dict(TransactionAssembler("shop").state(), segment=3, offset=120)
    assembler = TransactionAssembler("shop", saved)
    assert ids(run(assembler, [B(0x100), I(1), C(0x100)])) == ["shop:0/100:0"]


# A realistic spool: two pg_recvlogical restarts, one in the middle of a transaction.
SESSION = [
    B(0x100, 501), I(1), I(2), C(0x100),
    B(0x200, 502), I(3), I(4),                          # pg_recvlogical dies mid-transaction
    B(0x100, 501), I(1), I(2), C(0x100),                # restart: full replay of the first
    B(0x200, 502), I(3), I(4), I(5), C(0x200),          # the cut one, complete this time
    M(0x250),
    B(0x300, 503), U(1), D(2), T(), C(0x300),
    M(0x250),                                           # second restart: replays
    B(0x300, 503), U(1), D(2), T(), C(0x300),
    B(0x400, 504), I(6), C(0x400),
    M(0x450, "last"),
]

SESSION_IDS = [
    "shop:0/100:0", "shop:0/100:1",
    "shop:0/200:0", "shop:0/200:1", "shop:0/200:2",
    "shop:0/250:0",
    "shop:0/300:0", "shop:0/300:1", "shop:0/300:2",
    "shop:0/400:0",
    "shop:0/450:0",
]


def test_realistic_session_yields_every_change_exactly_once():
    events = run(TransactionAssembler("shop"), SESSION)
    assert ids(events) == SESSION_IDS
    assert [e.type for e in events] == ["insert"] * 5 + ["message", "update", "delete",
                                                         "truncate", "insert", "message"]


@pytest.mark.parametrize("cut", range(len(SESSION) + 1))
def test_assembler_rebuilt_from_state_at_any_point_emits_exactly_the_remaining_events(cut):
    expected = run(TransactionAssembler("shop"), SESSION)
    original = TransactionAssembler("shop")
    head = run(original, SESSION[:cut])
    saved = json.loads(json.dumps(original.state()))      # as the checkpoint stores it
    resumed = TransactionAssembler("shop", saved)
    tail = run(resumed, SESSION[cut:])
    assert head == expected[:len(head)]
    assert tail == expected[len(head):]
