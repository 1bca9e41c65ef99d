"""nats plugin options: validation names the key, reason and fix; parsing applies defaults."""

from __future__ import annotations

import pytest

from lapidus.config import parse_config
from lapidus.sinks import registry
from lapidus.sinks.nats import NatsSink
from lapidus.sinks.nats.options import NatsOptions, redact_url, validate


def problems(options):
    return dict(validate(options))


def test_original_lapidus_options_are_valid():
    assert validate({"server": "nats://localhost:4222"}) == []
    assert validate({"server": "nats://localhost:4222", "publishEventData": False,
                     "cachePrefix": "cache."}) == []
    assert validate({}) == []


def test_both_spellings_parse_to_the_same_options():
    original = NatsOptions.parse({"publishEventData": False, "cachePrefix": "c."})
    snake = NatsOptions.parse({"publish_event_data": False, "cache_prefix": "c."})
    assert original == snake
    assert original.publish_event_data is False and original.cache_prefix == "c."


def test_alias_and_name_together_is_a_problem():
    assert "another name" in problems({"cachePrefix": "a.", "cache_prefix": "b."})["cache_prefix"]


def test_unknown_key_suggests_the_nearest():
    assert 'did you mean "jetstream"' in problems({"jetstrem": True})["jetstrem"]
    assert 'did you mean "subject_prefix"' in problems({"subjectPrefix": "x"})["subjectPrefix"]


def test_server_and_servers_together():
    found = problems({"server": "nats://a:4222", "servers": ["nats://b:4222"]})
    assert "not both" in found["servers"]


@pytest.mark.parametrize("options,key,text", [
    ({"servers": "nats://a:4222"}, None, None),
    ({"servers": ["nats://a:4222", 7]}, "servers", "list of strings"),
    ({"servers": ["ftp://a"]}, "servers[0]", 'scheme "ftp"'),
    ({"server": "nats://"}, "server", "no host"),
    ({"jetstream": "yes"}, "jetstream", "true or false"),
    ({"jetstream": True, "max_pending_acks": 0}, "max_pending_acks", "at least 1"),
    ({"jetstream": True, "ack_timeout": -1}, "ack_timeout", "greater than 0"),
    ({"flush_timeout": True}, "flush_timeout", "number of seconds"),
    ({"subject_prefix": "a..b"}, "subject_prefix", "empty token"),
    ({"subject_prefix": "cdc.>"}, "subject_prefix", "wildcard"),
    ({"subject_template": "{schema}.{tab}"}, "subject_template", "unknown placeholder"),
    ({"cache_prefix": "ca che."}, "cache_prefix", "whitespace"),
    ({"password": "x"}, "password", "add user"),
    ({"user": "u", "token": "t"}, "token", "one way to authenticate"),
    ({"tls_cert_file": "/etc/hostname"}, "tls_key_file", "go together"),
    ({"tls_ca_file": "/nonexistent/ca.pem"}, "tls_ca_file", "no such file"),
    ({"stream": "S"}, "stream", "JetStream only"),
    ({"jetstream": True, "stream": "S"}, "stream", "needs its subjects"),
    ({"jetstream": True, "stream": "a.b", "subjects": ["x.>"]}, "stream", "cannot be empty"),
    ({"jetstream": True, "subjects": ["x.>"]}, "subjects", 'add "stream"'),
])
def test_bad_values(options, key, text):
    found = problems(options)
    if key is None:
        assert found == {}
    else:
        assert text in found.get(key, ""), found


def test_a_password_in_a_url_is_never_echoed():
    found = validate({"servers": ["nats://u:s3cr3tpw@:bad"]})
    assert found and all("s3cr3tpw" not in message for _, message in found)
    assert redact_url("nats://u:s3cr3tpw@host:4222") == "nats://host:4222"
    assert "s3cr3tpw" not in repr(NatsOptions.parse({"server": "nats://u:s3cr3tpw@h:4222",
                                                     "user": "u", "password": "pw123456"}))
    assert "pw123456" not in repr(NatsOptions.parse({"user": "u", "password": "pw123456"}))


def test_null_means_the_default():
    assert validate({"publish_event_data": None, "servers": None}) == []
    options = NatsOptions.parse({"publish_event_data": None, "servers": None})
    assert options.publish_event_data is True and options.servers == ("nats://127.0.0.1:4222",)


def test_defaults():
    options = NatsOptions.parse({"server": "nats://h:4222"})
    assert options.servers == ("nats://h:4222",)
    assert NatsOptions.parse({}).servers == ("nats://127.0.0.1:4222",)
    assert NatsOptions.parse({"servers": "nats://x:1"}).servers == ("nats://x:1",)
    assert options.jetstream is False and options.publish_event_data is True
    assert options.max_pending_acks == 4096 and options.duplicate_window == 120.0
    stream = NatsOptions.parse({"jetstream": True, "stream": "S", "subject_prefix": "cdc"})
    assert stream.stream_subjects == ("cdc.>",)


def test_sink_is_registered_and_per_backend():
    assert registry.load("nats") is NatsSink
    assert NatsSink.shared is False


def test_lapidus_config_reports_plugin_problems_with_their_key_path():
    config = {"backends": [{"type": "postgresql", "host": "h", "user": "u", "database": "d",
                            "plugins": {"nats": {"servr": "nats://x:4222"}}}],
              "plugins": {"nats": {"server": "nats://a:4222", "servers": ["nats://b:4222"]}}}
    with pytest.raises(Exception) as info:
        parse_config(config, plugin_validators=registry.validators())
    text = str(info.value)
    assert "plugins.nats.servers: give either" in text
    assert 'backends[0].plugins.nats.servr: unknown option for the nats plugin (did you mean ' \
           '"server"?)' in text


def test_problems_with_original_option_names_are_reported_as_the_file_spells_them():
    config = {"backends": [{"type": "postgresql", "host": "h", "user": "u", "database": "d",
                            "plugins": {"nats": {"publishEventData": "no"}}}],
              "plugins": {"nats": {"cache_prefix": 5}}}
    with pytest.raises(Exception) as info:
        parse_config(config, plugin_validators=registry.validators())
    text = str(info.value)
    assert "backends[0].plugins.nats.publishEventData: " in text
    assert "publish_event_data" not in text
    assert "plugins.nats.cache_prefix: " in text         # the new name where it was written


def test_original_sample_configuration_still_validates():
    config = {"backends": [{"type": "postgresql", "host": "127.0.0.1", "user": "lapidus",
                            "database": "lapidus", "password": "x", "slot": "lapidus_slot"}],
              "plugins": {"nats": {"server": "nats://localhost:4222"}}}
    parsed = parse_config(config, plugin_validators=registry.validators())
    assert parsed.plugins == {"nats": {"server": "nats://localhost:4222"}}


@pytest.mark.parametrize("url,ok", [
    ("nats//nats1:4222", False),          # the colon missing: passed lapidus -t before
    ("nats:/nats1:4222", False),
    ("tls//secure:4222", False),
    ("nats:///", False),
    ("nats://nats1:42x2", False),
    ("nats://nats1:4222/sub", False),
    ("", False),
    ("nats1:4222", True),                 # nats-py reads a bare host:port as nats://
    ("nats1", True),
    ("nats://u:p@nats1:4222", True),
    ("tls://nats1:4222", True),
    ("ws://nats1:8080", True),
    ("wss://nats1", True),
])
def test_server_urls_need_a_scheme_and_a_host(url, ok):
    for options, key in (({"servers": ["nats://ok:4222", url]}, "servers[1]"),
                         ({"server": url}, "server")):
        found = problems(options)
        if ok:
            assert found == {}, found
        else:
            assert key in found, found
            assert "nats://host:4222" in found[key] and "u:p" not in found[key]


def test_a_bad_url_is_reported_with_its_key_path_by_the_configuration_check():
    from lapidus.config import ConfigError
    with pytest.raises(ConfigError) as info:
        parse_config({"backends": [{"name": "a", "type": "postgresql", "database": "d"}],
                      "plugins": {"nats": {"servers": ["nats//nats1:4222"]}}},
                     plugin_validators=registry.validators())
    assert "plugins.nats.servers[0]" in str(info.value)


@pytest.mark.parametrize("options,kinds", [
    ({"servers": ["nats://nats1.example:4222"], "user": "u", "password": "p"},
     ["user/password"]),
    ({"server": "ws://10.0.0.5:8080", "token": "t"}, ["token"]),
    ({"server": "nats://u:pw@nats1.example:4222"}, ["user/password in the URL"]),
    ({"servers": ["tls://nats1.example:4222"], "token": "t"}, None),      # encrypted
    ({"servers": ["nats://127.0.0.1:4222", "nats://[::1]:4222", "localhost:4222"],
      "token": "t"}, None),                                               # loopback
    ({"servers": ["nats://nats1.example:4222"]}, None),                   # no credentials
])
def test_credentials_over_plain_nats_to_another_host_are_found(options, kinds):
    from lapidus.sinks.nats.options import plaintext_credentials
    found, servers = plaintext_credentials(NatsOptions.parse(options))
    if kinds is None:
        assert (found, servers) == ([], [])
    else:
        assert found == kinds and servers and all("@" not in s for s in servers)


def test_credentials_over_plain_nats_are_warned_about_at_start():
    import asyncio

    import structlog

    async def start(options):
        with structlog.testing.capture_logs() as logs:
            sink = NatsSink(options, "shop")
            await sink.start()
            await sink.close()
        return [e for e in logs if "plain-text" in e["event"]]

    warned = asyncio.run(start({"server": "nats://lapidus:s3cret@192.0.2.7:4222"}))
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    assert warned[0]["servers"] == ["nats://192.0.2.7:4222"]
    assert "tls://" in warned[0]["fix"] and "s3cret" not in str(warned[0])
    assert asyncio.run(start({"server": "tls://192.0.2.7:4222", "token": "t"})) == []
