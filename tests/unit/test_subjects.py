"""Subject tokens: every value maps to exactly one token and back; subjects per EVENTS.md."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from lapidus.events import Record
from lapidus.sinks.subjects import (SubjectBuilder, check_subject_part, check_template,
                                    decode_key, decode_token, decoder_for, encode_key,
                                    encode_token)

# What a token may contain: no ".", "*", ">", whitespace or control characters.
VALID_TOKEN = re.compile(r"[^.*>\s\x00-\x1f\x7f]+")


def record(schema="public", table="items", key=("1",), kind="insert", data=b"{}"):
    return Record("pg:0/1:0", kind, schema, table, key, "0/1", data)


def assert_round_trip(value: str) -> None:
    token = encode_token(value)
    assert VALID_TOKEN.fullmatch(token), (value, token)
    assert decode_token(token) == value, (value, token)


def test_example_from_the_event_contract():
    assert encode_token("a.b@c.com") == "a%2Eb@c%2Ecom"
    assert decode_token("a%2Eb@c%2Ecom") == "a.b@c.com"


@pytest.mark.parametrize("value,token", [
    ("2", "2"), ("x", "x"), ("*", "%2A"), (">", "%3E"), ("%", "%25"), (" ", "%20"),
    ("a b", "a%20b"), ("\t", "%09"), ("\n", "%0A"), ("\x00", "%00"), ("\x7f", "%7F"),
    ("\u00a0", "%C2%A0"), ("\u2028", "%E2%80%A8"), ("é", "é"), ("日本", "日本"),
    ("", "%"), ("_", "%5F"), ("__", "__"), ("_a", "_a"), ("-1", "-1"), ("1.5", "1%2E5"),
])
def test_tokens(value, token):
    assert encode_token(value) == token
    assert decode_token(token) == value


def test_every_code_point_of_the_first_planes_round_trips_alone_and_in_context():
    for code in itertools.chain(range(0, 0x3000), range(0xD7F0, 0xE010), range(0xFFF0, 0x10000),
                                range(0x1F600, 0x1F650), (0x10FFFF,)):
        char = chr(code)
        assert_round_trip(char)
        assert_round_trip(f"a{char}b")
        assert_round_trip(f"{char}{char}")


def test_all_pairs_and_triples_of_the_special_characters_round_trip():
    specials = ".*>% \t\r\n\x00_%aZ9é\u00a0"
    for size in (1, 2, 3):
        for combo in itertools.product(specials, repeat=size):
            assert_round_trip("".join(combo))


def test_many_random_strings_round_trip_and_distinct_values_get_distinct_tokens():
    rng = random.Random(20261130)
    alphabet = (list(".*>% _\t\n\r\x00\x1b\x7fazAZ09-@/+:=") + ["é", "ß", "日", "\u00a0",
                "\u200b", "\ufeff", "\U0001F600", "\ud800", "\udfff"])
    seen = {}
    for _ in range(20000):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        token = encode_token(value)
        assert VALID_TOKEN.fullmatch(token), (value, token)
        assert decode_token(token) == value
        assert seen.setdefault(token, value) == value, "two values share a token"


@pytest.mark.parametrize("bad", ["_", "a.b", "%2e", "%2", "%ZZ", "%41", "a%", "%C3%A9", "%FF",
                                 "a b"])
def test_decode_rejects_what_encode_never_produces(bad):
    with pytest.raises(ValueError):
        decode_token(bad)


def test_key_tokens_follow_key_order_and_no_key_is_underscore():
    assert encode_key(("1", "x")) == "1.x"
    assert encode_key(("a.b", "")) == "a%2Eb.%"
    assert encode_key(None) == "_"
    assert encode_key(("_",)) == "%5F"
    assert decode_key(["_"]) is None
    assert decode_key(["%5F"]) == ("_",)
    assert decode_key("a%2Eb.%".split(".")) == ("a.b", "")


def test_builder_default_subjects():
    builder = SubjectBuilder("pg")
    assert builder.subject(record()) == "public.items.1"
    assert builder.subject(record(key=("1", "x"))) == "public.items.1.x"
    assert builder.subject(record(key=None)) == "public.items._"
    assert builder.subject(record(key=("a.b *>", ))) == "public.items.a%2Eb%20%2A%3E"
    assert builder.subject(record(schema="my schema", table="t.1")) == "my%20schema.t%2E1.1"


def test_builder_prefix_and_template():
    assert SubjectBuilder("pg", "cdc.prod").subject(record()) == "cdc.prod.public.items.1"
    builder = SubjectBuilder("shop", "x", "cdc.{backend}.{type}.{schema}.{table}.{key}")
    assert builder.subject(record(key=("1", "2"))) == "x.cdc.shop.insert.public.items.1.2"
    assert builder.subject(record(kind="delete")) == "x.cdc.shop.delete.public.items.1"
    assert SubjectBuilder("pg", "", "{table}.rows").subject(record()) == "items.rows"


def test_builder_caches_per_table_and_type_only():
    builder = SubjectBuilder("pg")
    builder.subject(record(key=("1",)))
    builder.subject(record(key=("2",)))
    builder.subject(record(table="other"))
    assert len(builder._cache) == 2


def test_events_without_a_table():
    builder = SubjectBuilder("pg", "cdc")
    message = record(schema=None, table=None, key=None, kind="message",
                     data=b'{"type":"message","prefix":"audit.log"}')
    assert builder.subject(message) == "cdc._message.audit%2Elog"
    assert builder.subject(record(schema="db", table=None, key=None, kind="schema")) == \
        "cdc._schema.db"
    assert builder.subject(record(schema=None, table=None, key=None, kind="gap")) == "cdc._gap._"
    # a truncate (or a schema event) on a table goes to the table with the no-key token
    assert builder.subject(record(key=None, kind="truncate")) == "cdc.public.items._"


def test_decoder_for_prefixed_subjects():
    decode = decoder_for("cdc.prod")
    assert decode("cdc.prod.public.items.a%2Eb.%") == ("public", "items", ("a.b", ""))
    assert decode("cdc.prod.public.items._") == ("public", "items", None)
    with pytest.raises(ValueError):
        decode("cdc.prod._message.audit")


@pytest.mark.parametrize("template,problem", [
    ("{schema}.{table}.{key}", None),
    ("cdc.{backend}.{schema}.{table}.{key}", None),
    ("{schema}.{tabel}", "unknown placeholder {tabel}"),
    ("{key!r}", "no format spec"),
    ("{", "not a valid template"),
    ("a..{key}", "empty token"),
    ("{schema} {table}", "whitespace"),
    ("*.{key}", "wildcard"),
    ("{schema}.{key}.{table}.{key}", "{key} more than once"),
    ("{table}.{type}.{table}", None),
])
def test_template_check(template, problem):
    found = check_template(template)
    if problem is None:
        assert found is None
        # what the check accepts must also build subjects
        assert SubjectBuilder("pg", template=template).subject(record(key=("7",))).endswith(
            "7" if "{key}" in template else "items")
    else:
        assert problem in found


def test_subject_part_check():
    assert check_subject_part("cdc.prod") is None
    assert "empty token" in check_subject_part("cdc.")
    assert "wildcard" in check_subject_part("cdc.>")
    assert check_subject_part("", allow_empty=True) is None


def test_digit_keys_take_the_short_path_to_the_same_subject_as_any_key():
    """SubjectBuilder passes a one-column key of digits through as its own token: that must
    be what encode_key gives for every kind of digit, ASCII or not."""
    builder = SubjectBuilder("pg", "cdc")
    digits = [c for c in map(chr, range(0x30000)) if c.isdigit()]
    assert len(digits) > 500        # Unicode digits beyond 0-9: superscripts, other scripts
    for value in ["0", "12345678901234567890", "".join(digits[:40])] + digits:
        assert builder.subject(record(key=(value,))) == f"cdc.public.items.{encode_key((value,))}"
        assert encode_key((value,)) == value
