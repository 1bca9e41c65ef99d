"""Which record a NATS refusal names (lapidus.sinks.nats.refusals), without a server."""

from __future__ import annotations

import pytest

from lapidus.events import Record
from lapidus.sinks.base import UndeliverableError
from lapidus.sinks.nats.messages import MessageBuilder
from lapidus.sinks.nats.options import NatsOptions
from lapidus.sinks.nats.refusals import (Refusal, check_sizes, refusal_for, refused_subjects,
                                         undeliverable)


def rec(n, kind="insert", size=10, schema="public", table="t"):
    return Record(f"pg:0/1:{n}", kind, schema, table, (str(n),), "0/1", b"x" * size)


def build(records, **options):
    return MessageBuilder("shop", NatsOptions.parse(options)).build(records)


def error(subject):
    return f"nats: permissions violation for publish to \"{subject}\""


def test_refused_subjects_are_read_from_the_server_errors():
    assert refused_subjects([error("a.b"), "nats: stale connection", error("c")]) == ["a.b", "c"]


def test_the_first_refused_message_of_the_batch_names_its_record():
    records = [rec(0), rec(1), rec(2), rec(3)]
    messages = build(records)
    # the server refused record 3's subject first, then record 1's: record 1 comes first
    refusal = refusal_for(messages, [error("public.t.3"), error("public.t.1")])
    assert refusal.message.record == 1
    found = undeliverable(refusal, records)
    assert isinstance(found, UndeliverableError) and found.index == 1
    assert found.reason.startswith("event pg:0/1:1 of table public.t (10 bytes of JSON)")
    assert "permissions" in found.fix


def test_a_refused_cache_message_names_its_event():
    records = [rec(0), rec(1, kind="delete")]
    messages = build(records, cache_prefix="cache.")
    refusal = refusal_for(messages, [error("cache.purge.public.t.1")])
    assert refusal.message.record == 1 and undeliverable(refusal, records).index == 1


def test_a_refusal_of_a_subject_not_in_the_batch_names_nothing():
    assert refusal_for(build([rec(0)]), [error("other.subject")]) is None


def test_sizes_are_checked_against_max_payload_with_the_header_block():
    records = [rec(0, size=100), rec(1, size=900), rec(2, size=2000)]
    messages = build(records)
    limit = len(messages[1].header) + 900            # record 1 fits exactly
    with pytest.raises(Refusal) as info:
        check_sizes(messages, limit)
    assert info.value.message.record == 2
    found = undeliverable(info.value, records)
    assert found.index == 2 and f"max_payload ({limit} bytes)" in found.reason
    assert "publish_event_data = false" in found.fix
    check_sizes(messages[:2], limit)                 # no error


def test_an_event_without_a_table_is_named_by_its_type():
    record = Record("pg:0/1:9", "gap", "shop", None, None, "0/1", b"{}")
    messages = build([record])
    refusal = refusal_for(messages, [error(messages[0].subject)])
    assert "event pg:0/1:9 (gap, no table) (2 bytes" in undeliverable(refusal, [record]).reason
