"""Records -> NATS messages: subjects, headers, payloads and the cache_prefix extras."""

from __future__ import annotations

from lapidus.events import Record
from lapidus.sinks.nats.messages import MessageBuilder, header_block
from lapidus.sinks.nats.options import NatsOptions
from lapidus.sinks.nats.wire import parse_header_block


def rec(kind="insert", key=("1",), rid="pg:0/1:0"):
    return Record(rid, kind, "public", "items", key, "0/16B3748", b'{"id":"x"}')


def build(records, **options):
    return MessageBuilder("shop", NatsOptions.parse(options)).build(records)


def test_every_message_carries_the_routing_headers():
    (message,) = build([rec()])
    assert message.subject == "public.items.1"
    assert message.payload == b'{"id":"x"}'
    assert parse_header_block(message.header) == {
        "Nats-Msg-Id": "pg:0/1:0", "Lapidus-Backend": "shop", "Lapidus-Type": "insert",
        "Lapidus-Position": "0/16B3748"}
    assert message.header.startswith(b"NATS/1.0\r\n") and message.header.endswith(b"\r\n\r\n")
    assert message.stored is False
    assert build([rec()], jetstream=True)[0].stored is True


def test_publish_event_data_false_sends_empty_payloads():
    assert [m.payload for m in build([rec(), rec("delete")], publish_event_data=False)] == \
        [b"", b""]


def test_cache_prefix_verbs_follow_each_event():
    records = [rec("insert", rid="a"), rec("update", rid="b"), rec("delete", rid="c"),
               rec("truncate", key=None, rid="d")]
    messages = build(records, cache_prefix="cache.", jetstream=True)
    assert [(m.subject, m.msg_id, m.stored) for m in messages] == [
        ("public.items.1", "a", True), ("cache.populate.public.items.1", "a:populate", False),
        ("public.items.1", "b", True), ("cache.invalidate.public.items.1", "b:invalidate", False),
        ("public.items.1", "c", True), ("cache.purge.public.items.1", "c:purge", False),
        ("public.items._", "d", True),
    ]


def test_cache_prefix_is_prepended_as_written_and_covers_the_subject_prefix():
    messages = build([rec("update")], cache_prefix="", subject_prefix="cdc")
    assert [m.subject for m in messages] == ["cdc.public.items.1",
                                             "invalidate.cdc.public.items.1"]


def test_a_line_break_can_never_end_the_header_block_early():
    block = header_block("id\r\nX: y", "b", "insert", "pos\n")
    assert block.count(b"\r\n\r\n") == 1 and block.endswith(b"\r\n\r\n")
