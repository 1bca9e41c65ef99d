"""lapidus.events: the frozen Event, its JSON encoding and the Record sent to the sinks."""

from __future__ import annotations

import decimal
import json

import pytest

from lapidus.events import (Event, Record, decode, encode, encode_value, key_values,
                            to_record)

# The example of the event contract (EVENTS.md), joined into one line exactly as written there.
EVENTS_MD_EXAMPLE = (
    '{"id":"shop:0/1928C90:0","type":"update","backend":"shop","schema":"public","table":"items",'
    '"pk":{"id":2},"item":{"id":2,"name":"b","price":"2.00"},'
    '"before":{"id":2,"name":"a","price":"1.50"},'
    '"position":"0/1928C90","txid":"733","ts":"2026-11-30T11:33:35.295384Z"}'
)

BASE_FIELDS = ["id", "type", "backend", "schema", "table", "pk", "item", "before",
               "position", "txid", "ts"]


def make_event(**overrides) -> Event:
    fields = dict(id="shop:0/1928C90:0", type="insert", backend="shop", schema="public",
                  table="items", pk={"id": 2}, item={"id": 2, "name": "b"}, before=None,
                  position="0/1928C90", txid="733", ts="2026-11-30T11:33:35.295384Z")
    fields.update(overrides)
    return Event(**fields)


# -- Event -------------------------------------------------------------------------------

def test_assigning_a_field_of_an_event_raises():
    event = make_event()
    with pytest.raises(AttributeError):
        event.id = "other"
    assert event.id == "shop:0/1928C90:0"


def test_event_has_no_instance_dict_and_cannot_grow_new_attributes():
    event = make_event()
    assert not hasattr(event, "__dict__")
    with pytest.raises(AttributeError):
        event.extra = 1
    assert not hasattr(event, "extra")


def test_replace_makes_a_changed_copy_and_leaves_the_original():
    event = make_event()
    other = event._replace(type="delete")
    assert (event.type, other.type) == ("insert", "delete")
    assert not hasattr(event, "extra")


# -- encode ------------------------------------------------------------------------------

def test_encoded_fields_follow_the_documented_order():
    data = encode(make_event(type="update", before={"id": 2, "name": "a"}))
    assert list(json.loads(data)) == BASE_FIELDS


def test_optional_fields_are_omitted_when_none():
    keys = list(json.loads(encode(make_event())))
    for name in ("unchanged", "update", "prefix", "content", "transactional"):
        assert name not in keys


def test_base_fields_are_present_as_null_when_none():
    event = make_event(schema=None, table=None, pk=None, item=None, before=None, txid=None,
                       ts=None)
    obj = json.loads(encode(event))
    assert list(obj) == BASE_FIELDS
    for name in ("schema", "table", "pk", "item", "before", "txid", "ts"):
        assert obj[name] is None


def test_optional_fields_follow_the_base_fields_in_documented_order():
    event = make_event(unchanged=["big"], update={"set": {"a": 1}, "unset": []}, prefix="p",
                       content="c", transactional=True)
    assert list(json.loads(encode(event))) == BASE_FIELDS + [
        "unchanged", "update", "prefix", "content", "transactional"]


def test_message_event_keeps_transactional_false():
    event = make_event(type="message", schema=None, table=None, pk=None, item=None,
                       txid=None, ts=None, prefix="pfx2", content="nontx", transactional=False)
    obj = json.loads(encode(event))
    assert obj["transactional"] is False
    assert (obj["prefix"], obj["content"]) == ("pfx2", "nontx")


def test_unchanged_columns_are_listed():
    event = make_event(type="update", unchanged=["big", "blob"])
    assert json.loads(encode(event))["unchanged"] == ["big", "blob"]


def test_encoded_event_is_one_line_without_trailing_newline():
    data = encode(make_event(item={"text": "a\nb"}))
    assert b"\n" not in data
    assert json.loads(data)["item"]["text"] == "a\nb"


def test_decimal_inside_json_value_encodes_as_exact_bare_number():
    event = make_event(item={"j": {"v": decimal.Decimal("12345678901234567890.000000001")}})
    assert b'"item":{"j":{"v":12345678901234567890.000000001}}' in encode(event)


def test_decimal_keeps_trailing_zeros_and_huge_integers():
    value = [decimal.Decimal("1.50"), decimal.Decimal("12345678901234567890123")]
    assert encode_value(value) == b"[1.50,12345678901234567890123]"


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_decimal_encodes_as_string(text):
    assert encode_value({"v": decimal.Decimal(text)}) == b'{"v":"%s"}' % text.encode()


@pytest.mark.parametrize("text", ["1E+2", "-1.5E-7", "-0"])
def test_decimal_in_exponent_form_still_encodes_as_valid_json(text):
    data = encode_value(decimal.Decimal(text))
    assert json.loads(data, parse_float=decimal.Decimal, parse_int=decimal.Decimal) \
        == decimal.Decimal(text)


@pytest.mark.parametrize("raw", [b"\n\r", bytearray(b"\n\r"), memoryview(b"\n\r")])
def test_bytes_encode_as_base64(raw):
    assert encode_value({"b": raw}) == b'{"b":"Cg0="}'


def test_events_md_example_round_trips_byte_for_byte():
    event = Event(**json.loads(EVENTS_MD_EXAMPLE))
    assert encode(event) == EVENTS_MD_EXAMPLE.encode()
    assert decode(encode(event)) == json.loads(EVENTS_MD_EXAMPLE)


# -- key_values / to_record --------------------------------------------------------------

def test_key_values_of_composite_key_follow_key_order():
    assert key_values({"b": "x", "a": 1}) == ("x", "1")
    assert key_values({"a": 1, "b": "x"}) == ("1", "x")


def test_key_values_of_table_without_key_is_none():
    assert key_values(None) is None
    assert key_values({}) is None


def test_key_values_render_integers_as_text():
    assert key_values({"id": 2}) == ("2",)
    assert key_values({"id": 2 ** 64 - 1}) == ("18446744073709551615",)
    assert key_values({"id": -(2 ** 63)}) == ("-9223372036854775808",)


def test_key_values_keep_strings_verbatim_and_null_as_empty():
    assert key_values({"email": "a.b@c.com", "n": None}) == ("a.b@c.com", "")


def test_to_record_carries_routing_fields_and_the_encoded_event():
    event = make_event(pk={"a": 1, "b": "x"}, position="0/1928C90")
    record = to_record(event)
    assert isinstance(record, Record)
    assert record == Record("shop:0/1928C90:0", "insert", "public", "items", ("1", "x"),
                            "0/1928C90", encode(event))


def test_to_record_of_keyless_event_has_no_key():
    record = to_record(make_event(type="truncate", pk=None, item=None))
    assert record.key is None
    assert json.loads(record.data)["pk"] is None


# -- read events: the fast encoder gives encode()'s bytes ----------------------------------

def _read(i, **overrides):
    fields = dict(id=f'shop:read:0:public.items:[{i},"ü"]', type="read", backend="shop",
                  schema="public", table="items", pk={"id": i, "name": "ü"},
                  item={"id": i, "name": "ü \"q\" \\ \n\t\x01", "doc": {"n": decimal.Decimal(
                      "12345678901234567890.000000001")}, "raw": b"\x00\xff", "none": None,
                      "floats": [1.5, 1e300], "big": 2 ** 63 - 1},
                  before=None, position="0/16B3748", txid=None, ts="2026-12-01T00:00:00.000Z")
    fields.update(overrides)
    return Event(**fields)


@pytest.mark.parametrize("changes", [
    [{}, {}, {}],                                           # one run: the pieces are reused
    [{}, {"position": "0/2"}, {"ts": None}, {"table": "other"}, {"backend": 'a"b'}],
    [{"before": {"id": 1}}, {"prefix": "p", "content": "c"}, {"unchanged": ["x"]}, {}],
    [{"pk": None}, {"item": None}, {"pk": {}}, {"id": "é\u2028"}, {"pk": {"id": None}},
     {"pk": {"id": -2 ** 63}}, {"pk": {"id": True}}, {"pk": {"id": "k"}}, {"pk": {"a": 1.5}}],
])
def test_read_events_encode_to_exactly_the_bytes_of_encode(changes):
    from lapidus.events import record_fields
    from lapidus.events import batch_fields
    events = [_read(i, **change) for i, change in enumerate(changes)]
    events += [make_event(), make_event(type="delete", pk={"id": "x"}), _read(99)]
    want = [(e.id, e.type, e.schema, e.table, key_values(e.pk), e.position, encode(e))
            for e in events]
    assert [record_fields(e) for e in events] == want
    assert batch_fields(events) == want


def test_other_events_after_a_read_event_still_encode_as_their_own():
    from lapidus.events import record_fields
    record_fields(_read(1))
    update = make_event(type="update", before={"id": 2, "name": "a"})
    assert record_fields(update)[-1] == encode(update)
    assert record_fields(_read(2))[-1] == encode(_read(2))
