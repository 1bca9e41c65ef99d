"""The redis sink without a server: options (validation with key paths, a missing extra),
stream entries, and what the sink may skip after a crash (positions and ids compared)."""

from __future__ import annotations

import importlib.util

import pytest

from lapidus.config import parse_config
from lapidus.events import Record
from lapidus.sinks import registry
from lapidus.sinks.redis import RedisSink
from lapidus.sinks.redis.entries import EntryBuilder
from lapidus.sinks.redis.options import RedisOptions, validate
from lapidus.sinks.redis.resume import Mark, Skipper, compare, newest_of, order_key


def problems(options):
    return dict(validate(options))


def test_defaults_and_registration():
    assert validate({}) == []
    parsed = RedisOptions.parse({})
    assert (parsed.url, parsed.stream, parsed.maxlen) == ("redis://127.0.0.1:6379",
                                                          "lapidus:{backend}", None)
    assert registry.load("redis") is RedisSink and RedisSink.shared is False
    assert RedisSink.merge_batches is True


@pytest.mark.parametrize("options,key,text", [
    ({"url": "http://h:6379"}, "url", 'has the scheme "http"; expected redis:// or rediss://'),
    ({"url": "redis//h"}, "url", "is not a URL"),
    ({"url": "redis://h:port"}, "url", "is the port a number?"),
    ({"url": "redis://"}, "url", "has no host"),
    ({"url": 6379}, "url", "expected a string"),
    ({"stream": "cdc:{tabel}"}, "stream", "unknown placeholder {tabel}"),
    ({"stream": "cdc:{table!r}"}, "stream", "no format spec"),
    ({"stream": "cdc:{"}, "stream", "not a valid template"),
    ({"maxlen": 0}, "maxlen", "at least 1"),
    ({"maxlen": "1000"}, "maxlen", "whole number"),
    ({"reply_timeout": 0}, "reply_timeout", "greater than 0"),
    ({"tls_ca_file": "/nonexistent/ca.pem"}, "tls_ca_file", "no such file"),
    ({"streem": "x"}, "streem", 'did you mean "stream"'),
])
def test_bad_values(options, key, text):
    found = problems(options)
    assert text in found[key], found


def test_a_password_in_the_url_is_never_echoed():
    found = problems({"url": "http://:hunter2@h:6379"})
    assert "hunter2" not in str(found)
    assert "hunter2" not in repr(RedisOptions.parse({"url": "rediss://u:hunter2@h:6380/1"}))
    assert RedisOptions.parse({"url": "rediss://u:hunter2@h:6380/1"}).server == "rediss://h:6380"


def test_problems_carry_their_key_path():
    config = {"backends": [{"type": "postgresql", "host": "h", "user": "u", "database": "d",
                            "plugins": {"redis": {"maxlen": -1}}}],
              "plugins": {"redis": {"url": "amqp://h"}}}
    with pytest.raises(Exception) as info:
        parse_config(config, plugin_validators=registry.validators())
    text = str(info.value)
    assert 'plugins.redis.url: has the scheme "amqp"' in text
    assert "backends[0].plugins.redis.maxlen: must be at least 1" in text


def test_a_missing_redis_package_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "redis" else real(name, *a))
    assert ("", "needs the redis package, which is not installed "
                "(pip install 'lapidus[redis]')") in validate({})


def record(n: int, index: int = 0, schema="public", table="t", kind="insert") -> Record:
    lsn = f"0/{n:X}"
    return Record(f"pg:{lsn}:{index}", kind, schema, table, (str(n),), lsn, b'{"x":1}')


def packed(*args) -> bytes:
    """What redis-py itself would write for the command."""
    from redis.connection import Connection
    return b"".join(Connection().pack_command(*args))


def test_entries_carry_id_type_subject_and_event():
    builder = EntryBuilder("pg", "cdc:{backend}:{schema}.{table}", maxlen=1000)
    odd = Record("pg:0/10:1", "delete", "public", "t", ("a.b",), "0/10", b"{}")
    message = Record("pg:0/11:0", "message", None, None, None, "0/11", b'{"prefix":"audit"}')
    entries = builder.build([record(1), odd, message])
    assert entries[0] == ("cdc:pg:public.t", packed(
        "XADD", "cdc:pg:public.t", "MAXLEN", "~", 1000, "*", "id", "pg:0/1:0", "type", "insert",
        "subject", "public.t.1", "event", b'{"x":1}'), 0)
    # escaped as EVENTS.md says; table-less events in the stream of "_"
    assert entries[1].command == packed("XADD", "cdc:pg:public.t", "MAXLEN", "~", 1000, "*",
                                        "id", "pg:0/10:1", "type", "delete",
                                        "subject", "public.t.a%2Eb", "event", b"{}")
    assert entries[2].stream == "cdc:pg:_._" and b"_message.audit" in entries[2].command
    plain = EntryBuilder("pg", "x:{table}").build([record(1)])[0]
    assert plain.command == packed("XADD", "x:t", "*", "id", "pg:0/1:0", "type", "insert",
                                   "subject", "public.t.1", "event", b'{"x":1}')


@pytest.mark.parametrize("a,b,expected", [
    (("pg:0/1:0", "0/1"), ("pg:0/2:0", "0/2"), -1),
    (("pg:1/0:0", "1/0"), ("pg:0/FFFFFFFF:0", "0/FFFFFFFF"), 1),
    (("pg:0/2:3", "0/2"), ("pg:0/2:10", "0/2"), -1),                  # index in the transaction
    (("m:0-1-9:0", "0-1-9"), ("m:0-2-10:0", "0-2-10"), -1),            # another server, one domain
    (("m:0-1-9:0", "0-1-9"), ("m:1-1-10:0", "1-1-10"), None),          # two domains
    (("m:bin.000009:400:0", "bin.000009:400"), ("m:bin.000010:4:0", "bin.000010:4"), -1),
    (("m:3E11FA47-71CA-11E1-9E33-C80AA9429562:5:0", "3E11FA47-71CA-11E1-9E33-C80AA9429562:5"),
     ("m:3e11fa47-71ca-11e1-9e33-c80aa9429562:7:0", "3e11fa47-71ca-11e1-9e33-c80aa9429562:7"), -1),
    (("pg:read:0:public.t:[1]", "0/5"), ("pg:read:0:public.t:[2]", "0/5"), None),  # reads
    (("g:8263A1:0", "8263A1"), ("g:8263A2:0", "8263A2"), None),       # a resume token
])
def test_positions_compare_only_where_the_order_is_certain(a, b, expected):
    backend = a[0].split(":", 1)[0]
    assert compare(Mark(*a), Mark(*b), backend) == expected
    assert order_key("nonsense") is None


def test_skipper_skips_up_to_the_mark_in_the_batch_or_before_it_by_position():
    skipper = Skipper("pg")
    batch = [record(n) for n in range(1, 7)]
    streams = ["s"] * 6
    assert skipper.unknown(streams) == ["s"]
    skipper.learn("s", Mark("pg:0/4:0", "0/4"))
    assert skipper.keep(streams[:2], batch[:2]) == []          # before the mark, by position
    assert skipper.keep(streams[2:], batch[2:]) == [2, 3]      # the mark at 1: past it from 2
    assert skipper.skipped == 4
    assert skipper.keep(streams, batch) == list(range(6))      # passed: nothing more skipped
    skipper.forget()
    assert skipper.unknown(streams) == ["s"]


def test_skipper_sends_what_it_cannot_prove():
    skipper = Skipper("g")
    batch = [Record(f"g:AA{n}:0", "insert", "d", "c", ("1",), f"AA{n}", b"{}") for n in range(3)]
    skipper.learn("s", Mark("g:FF:0", "FF"))                    # not in the batch, not orderable
    assert skipper.keep(["s"] * 3, batch) == [0, 1, 2]
    skipper.learn("s", Mark("g:AA1:0", "AA1"))                  # in the batch: skip up to it
    assert skipper.keep(["s"] * 3, batch) == [2]
    skipper.learn("s", None)                                    # a stream without our entries
    assert skipper.keep(["s"] * 3, batch) == [0, 1, 2]


def test_the_newest_entry_of_this_backend_is_the_mark():
    replies = [(b"2-0", {b"id": b"other:0/9:0", b"event": b'{"position":"0/9"}'}),
               (b"1-0", {b"id": b"pg:0/5:1", b"event": b'{"position":"0/5"}'}),
               (b"0-1", {b"id": b"pg:0/5:0", b"event": b'{"position":"0/5"}'})]
    assert newest_of("pg", replies) == Mark("pg:0/5:1", "0/5")
    assert newest_of("pg", replies[:1]) is None and newest_of("pg", []) is None
    assert newest_of("pg", [(b"1-0", {b"id": b"pg:x", b"event": b"not json"})]) == \
        Mark("pg:x", None)
