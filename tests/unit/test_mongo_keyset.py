"""The snapshot's keyset over ``_id`` across BSON type brackets, and ``_id`` values as JSON."""

from __future__ import annotations

import datetime

import orjson
import pytest
from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp

from lapidus.workers.mongo.keyset import (BRACKETS, after, bracket, id_text, key_from_json,
                                          key_text, key_to_json, parse_filter)
from lapidus.workers.mongo.snapshot import MongoWindow, watermark_namespace
from lapidus.workers.base import BackendError

# one _id of each bracket, in MongoDB's sort order
ORDERED = [MinKey(), None, 3, "a", {"x": 1}, Binary(b"\x01"), ObjectId("65a1b2c3d4e5f60718293a4b"),
           True, datetime.datetime(2026, 1, 1), Timestamp(1, 2), MaxKey()]


def test_brackets_follow_the_sort_order():
    positions = [bracket(v) for v in ORDERED]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    # numbers of every kind share a bracket, and so do bool's neighbours not
    assert {bracket(v) for v in (1, 2.5, Int64(3), Decimal128("1.5"))} == {bracket(3)}
    assert bracket(True) != bracket(1)


def test_after_adds_every_later_bracket_by_type():
    condition = after(3)
    assert condition["$or"][0] == {"_id": {"$gt": 3}}
    later = condition["$or"][1]["_id"]["$type"]
    assert "string" in later and "objectId" in later and "maxKey" in later
    assert "int" not in later and "null" not in later and "minKey" not in later
    assert after(MaxKey()) == {"_id": {"$gt": MaxKey()}}
    assert sum(map(len, BRACKETS)) == len({a for b in BRACKETS for a in b})


@pytest.mark.parametrize("value", ORDERED + [Int64(2**40), 2.5, Decimal128("1.50"),
                                             Binary(b"\x00" * 16, 4)])
def test_a_key_survives_the_checkpoint_exactly(value):
    stored = orjson.loads(orjson.dumps(key_to_json(value)))
    back = key_from_json(stored)
    # the same BSON value (binary subtype 0 comes back as bytes, as pymongo decodes it)
    assert key_text(back) == key_text(value)
    assert (back == value and type(back) is type(value)) or isinstance(value, Binary)


def test_an_objectid_and_its_hex_string_are_different_keys():
    oid = ObjectId("65a1b2c3d4e5f60718293a4b")
    assert key_text(oid) != key_text(str(oid))
    window = MongoWindow("m", "shop", "docs", ("_id",))
    window.hold_documents([(oid, {"_id": str(oid)}, {"v": 1}),
                           (str(oid), {"_id": str(oid)}, {"v": 2})], None)
    window.evict(oid)
    assert window.remaining() == [({"_id": str(oid)}, {"v": 2})]


def test_an_objectid_and_its_hex_string_get_two_read_ids():
    """Read ids must differ where documents differ, or JetStream's dedup drops one."""
    oid = ObjectId("65a1b2c3d4e5f60718293a4b")
    window = MongoWindow("m", "shop", "docs", ("_id",))
    window.hold_documents([(7, {"_id": 7}, {"v": 0}), ("a", {"_id": "a"}, {"v": 0}),
                           (oid, {"_id": str(oid)}, {"v": 1}),
                           (str(oid), {"_id": str(oid)}, {"v": 2})], None)
    assert [text for text, _ in window.remaining_keyed()] == [
        "[7]", '["a"]', '[{"$oid":"65a1b2c3d4e5f60718293a4b"}]', '["65a1b2c3d4e5f60718293a4b"]']
    window.evict("a")
    assert [row for _, row in window.remaining_keyed()] == window.remaining()


@pytest.mark.parametrize("value", ORDERED)
def test_read_id_texts_are_compact_json_and_one_per_bson_value(value):
    text = id_text(value)
    assert text.startswith("[") and ", " not in text and ": " not in text
    others = [v for v in ORDERED if key_text(v) != key_text(value)]
    assert text not in {id_text(v) for v in others}


def test_filters_parse_as_extended_json_documents():
    assert parse_filter('{"n": {"$numberLong": "5"}}') == {"n": Int64(5)}
    assert parse_filter(None) is None and parse_filter("  ") is None
    with pytest.raises(ValueError, match="not JSON"):
        parse_filter("{n: 1")
    with pytest.raises(ValueError, match="JSON document"):
        parse_filter("[1]")


def test_the_watermark_collection_must_be_inside_the_watched_database():
    assert watermark_namespace("b", "shop", {}) == ("shop", "lapidus_watermarks")
    assert watermark_namespace("b", None, {}) == ("lapidus", "lapidus_watermarks")
    assert watermark_namespace("b", None, {"snapshot_watermarks": "ops.marks"}) == ("ops", "marks")
    with pytest.raises(BackendError, match='outside the watched database "shop"') as caught:
        watermark_namespace("b", "shop", {"snapshot_watermarks": "ops.marks"})
    assert caught.value.fatal
