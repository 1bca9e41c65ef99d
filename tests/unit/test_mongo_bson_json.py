"""BSON to JSON as EVENTS.md says, one BSON type at a time.

Values go through a real BSON encode/decode with the client's codec options first, so each test
sees exactly the Python types pymongo hands the worker (``Int64``, ``bytes`` for binary subtype 0,
naive UTC datetimes, ``DatetimeMS`` for dates outside Python's range ...).
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections import OrderedDict

import bson
import orjson
import pytest
from bson import json_util
from bson.binary import Binary
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.son import SON
from bson.timestamp import Timestamp

from lapidus.events import encode_value
from lapidus.workers.mongo.bson_json import document_to_json, format_datetime, to_json
from lapidus.workers.mongo.settings import MongoSettings

# The codec options MongoSource's client decodes with.
_, _KWARGS = MongoSettings(backend="t").client_arguments()
DECODE = CodecOptions(tz_aware=_KWARGS["tz_aware"],
                      datetime_conversion=_KWARGS["datetime_conversion"])


def roundtrip(value):
    """``value`` as the driver would hand it over after reading it from the server."""
    return bson.decode(bson.encode({"v": value}), codec_options=DECODE)["v"]


def as_json(value):
    """The mapped value as it appears in an encoded event."""
    return orjson.loads(encode_value(to_json(roundtrip(value))))


def test_decoding_options_are_the_ones_the_mapping_needs():
    assert DECODE.tz_aware is False
    assert DECODE.datetime_conversion == DatetimeConversion.DATETIME_AUTO


@pytest.mark.parametrize("value", ["text", "", "ünïcödé ✓", True, False, None, 0, -1, 2**31 - 1])
def test_json_native_values_pass_through(value):
    assert as_json(value) == value


def test_int32_and_int64_are_exact_numbers():
    assert type(roundtrip(2**31 - 1)) is int
    assert type(roundtrip(2**40)) is Int64
    for value in (2**31, 2**53 + 1, 2**63 - 1, -(2**63)):
        assert encode_value(to_json(roundtrip(Int64(value)))) == str(value).encode()
    assert type(to_json(roundtrip(Int64(5)))) is int


def test_double_is_a_number():
    assert as_json(1.5) == 1.5
    assert as_json(-0.25) == -0.25
    assert orjson.loads(encode_value(to_json(roundtrip(1e300)))) == 1e300


@pytest.mark.parametrize("value, expected", [
    (math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")])
def test_nan_and_infinities_are_strings(value, expected):
    assert as_json(value) == expected


@pytest.mark.parametrize("digits", [
    "1.50", "12345678901234567890.000000001", "0.000", "-0", "1E+10", "0E-10",
    "9.999999999999999999999999999999999E+6144", "NaN", "Infinity", "-Infinity"])
def test_decimal128_is_a_string_with_the_exact_digits(digits):
    assert as_json(Decimal128(digits)) == digits


def test_objectid_is_its_hex_string():
    oid = ObjectId("65a5b2c3d4e5f60718293a4b")
    assert as_json(oid) == "65a5b2c3d4e5f60718293a4b"


@pytest.mark.parametrize("value, expected", [
    (dt.datetime(2026, 11, 30, 11, 33, 35, 295000), "2026-11-30T11:33:35.295Z"),
    (dt.datetime(2026, 11, 30, 11, 33, 35), "2026-11-30T11:33:35.000Z"),
    (dt.datetime(1969, 7, 20, 20, 17, 40), "1969-07-20T20:17:40.000Z"),
    (dt.datetime(1, 1, 1), "0001-01-01T00:00:00.000Z"),
    (dt.datetime(9999, 12, 31, 23, 59, 59, 999000), "9999-12-31T23:59:59.999Z"),
])
def test_dates_are_rfc3339_utc_with_milliseconds(value, expected):
    assert as_json(value) == expected


def test_aware_datetimes_are_converted_to_utc():
    paris = dt.timezone(dt.timedelta(hours=1))
    assert format_datetime(dt.datetime(2026, 11, 30, 12, 33, 35, 295000, tzinfo=paris)) == \
        "2026-11-30T11:33:35.295Z"


@pytest.mark.parametrize("millis", [-62135596800001, 253402300800000])
def test_dates_outside_python_range_are_extended_json(millis):
    decoded = roundtrip(DatetimeMS(millis))
    assert type(decoded) is DatetimeMS     # instead of an exception inside pymongo
    assert to_json(decoded) == {"$date": {"$numberLong": str(millis)}}


def test_generic_binary_is_base64():
    assert type(roundtrip(b"\x00\x01\xfe\xff")) is bytes
    assert as_json(b"\x00\x01\xfe\xff") == "AAH+/w=="
    assert as_json(Binary(b"\x00\x01\xfe\xff", 0)) == "AAH+/w=="
    assert as_json(Binary(b"user-defined", 0x80)) == "dXNlci1kZWZpbmVk"
    assert as_json(Binary(b"", 5)) == ""


def test_uuid_binary_subtype_4_is_the_uuid_string():
    value = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")
    assert as_json(Binary.from_uuid(value)) == "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert to_json(value) == "0f8fad5b-d9cb-469f-a165-70867728950e"


def test_legacy_uuid_subtype_3_stays_base64():
    raw = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e").bytes
    assert as_json(Binary(raw, 3)) == "D4+tW9nLRp+hZXCGdyiVDg=="


def test_timestamp_regex_code_keys_are_relaxed_extended_json():
    assert as_json(Timestamp(1796041809, 7)) == {"$timestamp": {"t": 1796041809, "i": 7}}
    assert as_json(Regex("^a.c$", "imxs")) == \
        {"$regularExpression": {"pattern": "^a.c$", "options": "imsx"}}
    assert as_json(Regex("x", "")) == {"$regularExpression": {"pattern": "x", "options": ""}}
    assert as_json(Code("function () { return 1; }")) == {"$code": "function () { return 1; }"}
    assert as_json(Code("f(x)", {"x": Int64(2**40), "y": math.nan})) == \
        {"$code": "f(x)", "$scope": {"x": 2**40, "y": "NaN"}}
    assert as_json(MinKey()) == {"$minKey": 1}
    assert as_json(MaxKey()) == {"$maxKey": 1}


def test_each_relaxed_form_is_what_bson_json_util_parses_back():
    for value in (Timestamp(5, 6), Regex("^a", "i"), Code("f()"), MinKey(), MaxKey()):
        text = orjson.dumps(to_json(roundtrip(value))).decode()
        assert json_util.loads(text) == value


def test_dbref_keeps_its_fields_and_maps_its_id():
    ref = DBRef("users", ObjectId("65a5b2c3d4e5f60718293a4b"), "crm", extra=Int64(3))
    assert as_json(ref) == {"$ref": "users", "$id": "65a5b2c3d4e5f60718293a4b", "$db": "crm",
                            "extra": 3}


def test_nested_documents_and_arrays_are_mapped_recursively_in_order():
    doc = SON([("z", 1), ("a", {"when": dt.datetime(2026, 1, 2, 3, 4, 5, 6000),
                                "list": [Decimal128("1.10"), [math.inf, ObjectId("0" * 24)],
                                         {"deep": [{"x": Int64(1)}]}]}),
               ("m", None)])
    mapped = document_to_json(roundtrip(doc))
    assert list(mapped) == ["z", "a", "m"]
    assert mapped == {"z": 1, "a": {"when": "2026-01-02T03:04:05.006Z",
                                    "list": ["1.10", ["Infinity", "0" * 24],
                                             {"deep": [{"x": 1}]}]},
                      "m": None}


def test_mapping_subclasses_and_tuples_take_the_slow_path():
    assert to_json(OrderedDict(a=Int64(1))) == {"a": 1}
    assert to_json((1, Decimal128("2"))) == [1, "2"]

    class Tag(str):
        pass

    assert type(to_json(Tag("x"))) is str


def test_input_is_not_modified():
    doc = {"a": {"b": [Decimal128("1")]}}
    document_to_json(doc)
    assert doc == {"a": {"b": [Decimal128("1")]}}


def test_unknown_types_fail_loudly_naming_the_type():
    class Strange:
        pass

    with pytest.raises(TypeError, match="Strange"):
        to_json({"x": Strange()})


def test_every_mapped_value_encodes_with_the_event_encoder():
    doc = roundtrip({
        "i": 1, "l": Int64(2**62), "d": 1.5, "n": math.nan, "dec": Decimal128("1.5"),
        "oid": ObjectId(), "date": dt.datetime(2026, 1, 1), "bin": b"x",
        "uuid": Binary.from_uuid(uuid.uuid4()), "ts": Timestamp(1, 2), "re": Regex("a"),
        "code": Code("c"), "min": MinKey(), "max": MaxKey(), "arr": [1, "a", None],
        "far": DatetimeMS(-62135596800001)})
    encode_value(document_to_json(doc))     # raises if a value has no JSON form
