"""The mqtt sink's pure parts: options, topics (escaping and its inverse), and the hand-made
MQTT 5 properties checked against paho's own decoder."""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from lapidus.events import Record
from lapidus.sinks import optionkit
from lapidus.sinks.mqtt.connection import settings_fix
from lapidus.sinks.mqtt.options import MqttOptions, validate
from lapidus.sinks.mqtt.properties import PropertiesBuilder
from lapidus.sinks.mqtt.topics import (TopicBuilder, check_prefix, decode_key, decode_level,
                                       encode_level)


def test_options_are_checked_by_key_without_echoing_values():
    problems = dict(validate({"url": "https://u:hunter2@h", "qos": 2, "topic_prefix": "a/+",
                              "keepalive": 0, "clientid": "x"}))
    assert problems["url"].startswith('has the scheme "https"')
    assert problems["qos"] == "expected one of 0, 1"
    assert "wildcard" in problems["topic_prefix"]
    assert problems["keepalive"] == "must be at least 1, got 0"
    assert 'did you mean "client_id"' in problems["clientid"]
    assert not any("hunter2" in m for m in problems.values())
    assert validate({}) == []
    assert dict(validate({"url": "mqtt://h:1883/x"}))["url"].startswith("has a path")
    assert dict(validate({"qos": True}))["qos"] == "expected one of 0, 1"


def test_a_missing_aiomqtt_names_the_extra(monkeypatch):
    real = optionkit.importlib.util.find_spec
    monkeypatch.setattr(optionkit.importlib.util, "find_spec",
                        lambda name: None if name == "aiomqtt" else real(name))
    assert validate({}) == [("", "needs the aiomqtt package, which is not installed "
                                 "(pip install 'lapidus[mqtt]')")]


def test_url_parts_and_defaults():
    o = MqttOptions.parse({"url": "mqtts://bob:p%40ss@broker.test"})
    assert (o.host, o.port, o.tls, o.username, o.password) == ("broker.test", 8883, True,
                                                              "bob", "p@ss")
    assert o.target == "mqtts://broker.test:8883" and "p%40ss" not in repr(o)
    assert MqttOptions.parse({}).port == 1883 and MqttOptions.parse({}).qos == 1


@pytest.mark.parametrize("value,level", [
    ("a/b+c#d", "a%2Fb%2Bc%23d"), ("%41", "%2541"), ("_", "%5F"), ("", "%"),
    ("x y", "x y"), ("é/ü", "é%2Fü"), ("\x00z", "%00z"), ("plain", "plain")])
def test_levels_escape_and_decode_back(value, level):
    assert encode_level(value) == level
    assert decode_level(level) == value


def test_topics_of_rows_composite_keys_and_tableless_records():
    build = TopicBuilder("cdc/shop").topic
    row = Record("i", "insert", "public", "t", ("7",), "0/1", b"{}")
    assert build(row) == "cdc/shop/public/t/7"
    pair = Record("i", "insert", "public", "p", ("1", "x/y"), "0/1", b"{}")
    assert build(pair) == "cdc/shop/public/p/1/x%2Fy"
    assert decode_key(build(pair).split("/")[4:]) == ("1", "x/y")
    nokey = Record("i", "truncate", "public", "t", None, "0/1", b"{}")
    assert build(nokey) == "cdc/shop/public/t/_" and decode_key(["_"]) is None
    message = Record("i", "message", None, None, None, "0/1", b'{"prefix":"audit/x"}')
    assert build(message) == "cdc/shop/_message/audit%2Fx"
    assert check_prefix("$SYS/x") and check_prefix("a//b") and check_prefix("") and \
        check_prefix("ok/levels") is None


def test_packed_properties_decode_as_paho_encodes_them():
    packed = PropertiesBuilder("pg").build("pg:0/1A:3", "update", "0/1A").pack()
    decoded = Properties(PacketTypes.PUBLISH)
    decoded.unpack(packed)
    assert decoded.UserProperty == [("Lapidus-Id", "pg:0/1A:3"), ("Lapidus-Backend", "pg"),
                                    ("Lapidus-Type", "update"), ("Lapidus-Position", "0/1A")]
    assert decoded.ContentType == "application/json"
    assert decoded.PayloadFormatIndicator == 1
    # the same bytes as paho's encoder, up to the order of the properties
    ours = Properties(PacketTypes.PUBLISH)
    ours.unpack(packed)
    assert len(ours.pack()) == len(packed)


def test_connack_refusals_of_the_settings_have_a_fix():
    assert "user and password" in settings_fix("Connection refused: Bad username or password")
    assert "user and password" in settings_fix("[code:134] Bad user name or password")
    assert settings_fix("Connection refused: Not authorised")
    assert settings_fix("Server unavailable") == ""
