"""The rabbitmq sink without a broker: options (validation with key paths, a missing extra)
and the messages built from records (routing key, properties, headers)."""

from __future__ import annotations

import importlib.util

import pytest

from lapidus.config import parse_config
from lapidus.events import Record
from lapidus.sinks import registry
from lapidus.sinks.rabbitmq import RabbitmqSink
from lapidus.sinks.rabbitmq.messages import MessageBuilder, TooLong
from lapidus.sinks.rabbitmq.options import RabbitOptions, validate


def problems(options):
    return dict(validate(options))


def test_defaults_and_registration():
    assert validate({}) == []
    parsed = RabbitOptions.parse({})
    assert (parsed.url, parsed.exchange, parsed.mandatory) == (
        "amqp://guest:guest@127.0.0.1:5672/", "lapidus", False)
    assert registry.load("rabbitmq") is RabbitmqSink and RabbitmqSink.shared is False


@pytest.mark.parametrize("options,key,text", [
    ({"url": "redis://h:5672"}, "url", 'has the scheme "redis"; expected amqp:// or amqps://'),
    ({"url": "amqp:/h"}, "url", "is not a URL"),
    ({"url": "amqp://"}, "url", "has no host"),
    ({"exchange": ""}, "exchange", "is empty"),
    ({"exchange": "amq.topic"}, "exchange", "reserved"),
    ({"exchange": "a b"}, "exchange", "letters, digits"),
    ({"mandatory": "yes"}, "mandatory", "true or false"),
    ({"confirm_timeout": -1}, "confirm_timeout", "greater than 0"),
    ({"tls_ca_file": "/nonexistent/ca.pem"}, "tls_ca_file", "no such file"),
    ({"exchnage": "x"}, "exchnage", 'did you mean "exchange"'),
])
def test_bad_values(options, key, text):
    found = problems(options)
    assert text in found[key], found


def test_credentials_are_never_echoed():
    assert "hunter2" not in str(problems({"url": "http://u:hunter2@h"}))
    parsed = RabbitOptions.parse({"url": "amqps://u:hunter2@h:5671/prod"})
    assert "hunter2" not in repr(parsed) and parsed.server == "amqps://h:5671"


def test_problems_carry_their_key_path():
    config = {"backends": [{"type": "postgresql", "host": "h", "user": "u", "database": "d",
                            "plugins": {"rabbitmq": {"mandatory": 1}}}],
              "plugins": {"rabbitmq": {"url": "http://h"}}}
    with pytest.raises(Exception) as info:
        parse_config(config, plugin_validators=registry.validators())
    text = str(info.value)
    assert 'plugins.rabbitmq.url: has the scheme "http"' in text
    assert "backends[0].plugins.rabbitmq.mandatory: expected true or false" in text


def test_a_missing_aiormq_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "aiormq" else real(name, *a))
    assert ("", "needs the aiormq package, which is not installed "
                "(pip install 'lapidus[rabbitmq]')") in validate({})


def test_messages_route_by_subject_with_the_contract_properties():
    records = [Record("pg:0/10:0", "update", "public", "t", ("a.b",), "0/10", b'{"x":1}'),
               Record("pg:0/11:0", "message", None, None, None, "0/11", b'{"prefix":"audit"}')]
    first, second = MessageBuilder("pg").build(records)
    assert (first.routing_key, first.body, first.record) == ("public.t.a%2Eb", b'{"x":1}', 0)
    p = first.properties
    assert (p.message_id, p.content_type, p.delivery_mode, p.message_type) == (
        "pg:0/10:0", "application/json", 2, "update")
    assert p.headers == {"Lapidus-Backend": "pg", "Lapidus-Type": "update",
                         "Lapidus-Position": "0/10"}
    assert second.routing_key == "_message.audit"


def test_a_routing_key_over_255_bytes_is_refused_before_publishing():
    record = Record("pg:0/1:0", "insert", "public", "t", ("é" * 200,), "0/1", b"{}")
    with pytest.raises(TooLong) as info:
        MessageBuilder("pg").build([Record("pg:0/0:0", "insert", "public", "t", ("1",), "0/0",
                                           b"{}"), record])
    assert info.value.index == 1
