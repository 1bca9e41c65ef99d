"""Unit tests: MySQL/MariaDB value mapping (temporal text, converters, geometry), no server."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from types import SimpleNamespace

import orjson
import pytest
from pymysqlreplication.constants import FIELD_TYPE

from lapidus.events import encode_value
from lapidus.workers.mysql import temporal, values
from lapidus.workers.mysql.geometry import geometry_text


# ----------------------------------------------------------------------------- temporal
# Reference encoders written from the server's side (sql-common/my_time.c), so the decoders
# are checked against the format, not against themselves.

def encode_time2(text: str, fsp: int) -> bytes:
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("-")
    hms, _, frac = body.partition(".")
    h, m, s = (int(x) for x in hms.split(":"))
    micro = int((frac + "000000")[:6]) if frac else 0
    packed = ((h << 12 | m << 6 | s) << 24) + micro
    packed *= sign
    if fsp in (5, 6):
        return (packed + 0x800000000000).to_bytes(6, "big")
    # C semantics, as in my_time_packed_to_binary: ">>" floors, "%" and "/" truncate.
    intpart = packed >> 24
    fracpart = -((-packed) % (1 << 24)) if packed < 0 else packed % (1 << 24)
    head = (intpart + 0x800000).to_bytes(3, "big")
    if fsp == 0:
        return head
    if fsp in (1, 2):
        return head + bytes([int(fracpart / 10000) & 0xFF])
    return head + (int(fracpart / 100) & 0xFFFF).to_bytes(2, "big")


@pytest.mark.parametrize("text,fsp", [
    ("00:00:00", 0), ("838:59:59", 0), ("-838:59:59", 0), ("25:00:00", 0),
    ("-838:59:59.000000", 6), ("838:59:59.999999", 6), ("-01:00:00.000001", 6),
    ("-00:00:00.000001", 6), ("-12:34:56.100000", 6), ("-00:00:00.500000", 6),
    ("-838:59:58.999999", 6), ("-01:00:00.5", 1), ("-12:34:56.99", 2), ("-00:00:01.001", 3),
    ("12:34:56.1234", 4), ("-00:00:00.00001", 5),
])
def test_time2_text_matches_server_encoding_including_negative_fractions(text, fsp):
    assert temporal.time2_text(encode_time2(text, fsp), fsp) == text


def encode_datetime2(y, mo, d, h, mi, s, micro, fsp) -> bytes:
    ymd = ((y * 13 + mo) << 5) | d
    hms = (h << 12) | (mi << 6) | s
    intpart = (ymd << 17) | hms
    head = (intpart + 0x8000000000).to_bytes(5, "big")
    if fsp in (1, 2):
        return head + (micro // 10000).to_bytes(1, "big")
    if fsp in (3, 4):
        return head + (micro // 100).to_bytes(2, "big")
    if fsp in (5, 6):
        return head + micro.to_bytes(3, "big")
    return head


@pytest.mark.parametrize("parts,fsp,text", [
    ((2026, 11, 30, 11, 33, 35, 295384), 6, "2026-11-30T11:33:35.295384"),
    ((2026, 11, 30, 11, 33, 35, 0), 6, "2026-11-30T11:33:35.000000"),
    ((2026, 11, 30, 11, 33, 35, 0), 0, "2026-11-30T11:33:35"),
    ((2026, 11, 30, 11, 33, 35, 120000), 2, "2026-11-30T11:33:35.12"),
    ((9999, 12, 31, 23, 59, 59, 999900), 4, "9999-12-31T23:59:59.9999"),
    ((0, 0, 0, 0, 0, 0, 0), 6, "0000-00-00T00:00:00.000000"),
    ((2026, 0, 15, 10, 0, 0, 500000), 1, "2026-00-15T10:00:00.5"),
])
def test_datetime2_text_keeps_declared_digits_and_zero_dates(parts, fsp, text):
    assert temporal.datetime2_text(encode_datetime2(*parts, fsp), fsp) == text


def test_date_text_keeps_zero_and_partial_dates():
    assert temporal.date_text(30 | 11 << 5 | 2026 << 9) == "2026-11-30"
    assert temporal.date_text(0) == "0000-00-00"
    assert temporal.date_text(15 | 0 << 5 | 2026 << 9) == "2026-00-15"


def test_timestamp2_text_is_utc_with_z_and_zero_timestamp():
    second = int(dt.datetime(2026, 11, 30, 11, 33, 35, tzinfo=dt.timezone.utc).timestamp())
    data = second.to_bytes(4, "big") + (295384).to_bytes(3, "big")
    assert temporal.timestamp2_text(data, 6) == "2026-11-30T11:33:35.295384Z"
    assert temporal.timestamp2_text(second.to_bytes(4, "big"), 0) == "2026-11-30T11:33:35Z"
    assert temporal.timestamp2_text(bytes(7), 6) == "0000-00-00T00:00:00.000000Z"
    assert temporal.timestamp2_text((1).to_bytes(4, "big"), 0) == "1970-01-01T00:00:01Z"


def test_timedelta_text_for_old_format_time():
    negative = dt.timedelta(hours=-838, minutes=-59, seconds=-59)
    assert temporal.timedelta_text(negative) == "-838:59:59"
    assert temporal.timedelta_text(dt.timedelta(days=1, hours=1, microseconds=250000), 6) == \
        "25:00:00.250000"


# ----------------------------------------------------------------------------- converters

def column(kind, name="c", **attrs):
    return SimpleNamespace(type=kind, name=name, **attrs)


def test_decimal_text_never_uses_an_exponent():
    assert values.decimal_text(decimal.Decimal("1E-30")) == "0.000000000000000000000000000001"
    assert values.decimal_text(decimal.Decimal("0E-30")) == "0.000000000000000000000000000000"
    assert values.decimal_text(decimal.Decimal("1.50")) == "1.50"
    assert values.decimal_text(decimal.Decimal("-12345678901234567890.000000001")) == \
        "-12345678901234567890.000000001"


def test_float32_prints_the_shortest_text_of_the_stored_float():
    stored = struct.unpack("<f", struct.pack("<f", 1.1))[0]
    assert stored != 1.1
    assert values.float32_value(stored) == 1.1
    largest = struct.unpack("<f", struct.pack("<f", 3.4028234e38))[0]
    assert values.float32_value(largest) == 3.4028235e38


def test_non_finite_floats_are_strings():
    assert values.float_value(float("nan")) == "NaN"
    assert values.float_value(float("inf")) == "Infinity"
    assert values.float_value(float("-inf")) == "-Infinity"
    assert values.float_value(-0.5) == -0.5


def test_year_zero_is_given_back():
    assert values.year_value(1900) == 0
    assert values.year_value(1901) == 1901


def test_set_is_an_array_in_definition_order():
    convert = values.converter_for(column(FIELD_TYPE.SET, set_values=["a", "b", "c", "d"]))
    assert convert({"d", "a", "c"}) == ["a", "c", "d"]


def test_binary_is_padded_back_to_its_length_and_base64():
    convert = values.converter_for(column(FIELD_TYPE.STRING, character_set_name="binary",
                                          max_length=4))
    assert convert(b"a") == "YQAAAA=="
    assert convert(b"\x00\x01\x02\x03") == "AAECAw=="


def test_varbinary_and_blob_base64_text_untouched():
    blob = values.converter_for(column(FIELD_TYPE.BLOB, character_set_name="binary"))
    assert blob(b"\x00\xff") == "AP8="
    assert values.converter_for(column(FIELD_TYPE.BLOB, character_set_name="utf8")) is None
    assert values.converter_for(column(FIELD_TYPE.VARCHAR, character_set_name="utf8")) is None
    varbinary = values.converter_for(column(FIELD_TYPE.VARCHAR, character_set_name="binary"))
    assert varbinary(b"\xff\x00") == "/wA="


def test_integers_enum_bit_and_temporal_text_pass_as_they_are():
    for kind in (FIELD_TYPE.TINY, FIELD_TYPE.LONGLONG, FIELD_TYPE.ENUM, FIELD_TYPE.BIT,
                 FIELD_TYPE.DATE, FIELD_TYPE.TIME2, FIELD_TYPE.DATETIME2, FIELD_TYPE.TIMESTAMP2):
        assert values.converter_for(column(kind)) is None


def test_mysql_binary_json_has_no_bytes_keys_and_exact_numbers():
    raw = {b"name": b"\xf0\x9f\x98\x80", b"n": decimal.Decimal("12345678901234567890.000000001"),
           b"list": [1, 2.5, None, True, {b"k": b"v"}], b"big": 18446744073709551615}
    mapped = values.json_binary_value(raw)
    assert mapped == {"name": "😀", "n": decimal.Decimal("12345678901234567890.000000001"),
                      "list": [1, 2.5, None, True, {"k": "v"}], "big": 18446744073709551615}
    assert encode_value(mapped) == (
        b'{"name":"\xf0\x9f\x98\x80","n":12345678901234567890.000000001,'
        b'"list":[1,2.5,null,true,{"k":"v"}],"big":18446744073709551615}')


def test_mariadb_json_text_becomes_nested_with_exact_numbers():
    mapped = values.json_text_value('{"a": 1.50, "b": [1, 12345678901234567890.000000001], '
                                    '"c": 18446744073709551616, "d": -9223372036854775809}')
    assert encode_value(mapped) == (b'{"a":1.50,"b":[1,12345678901234567890.000000001],'
                                    b'"c":18446744073709551616,"d":-9223372036854775809}')
    assert values.json_text_value("not json") == "not json"


def test_convert_row_null_empty_set_and_not_logged_columns():
    plan = values.build_plan("s", "t", [column(FIELD_TYPE.LONG, "id"),
                                        column(FIELD_TYPE.SET, "tags", set_values=["x", "y"]),
                                        column(FIELD_TYPE.VARCHAR, "name",
                                               character_set_name="utf8")], [0])
    row, missing = values.convert_row(plan, {"id": 1, "tags": None, "name": None},
                                      {"tags": "empty set", "name": "null"})
    assert row == {"id": 1, "tags": [], "name": None} and missing is None
    row, missing = values.convert_row(plan, {"id": 1, "tags": {"y"}, "name": None},
                                      {"name": "cols bitmap"})
    assert row == {"id": 1, "tags": ["y"]} and missing == ["name"]
    assert plan.pk == ("id",)


def test_plan_keeps_key_order_of_the_table_map():
    columns = [column(FIELD_TYPE.LONG, "b"),
               column(FIELD_TYPE.VARCHAR, "a", character_set_name="utf8"),
               column(FIELD_TYPE.LONG, "id")]
    assert values.build_plan("s", "t", columns, [2, 1]).pk == ("id", "a")
    assert values.build_plan("s", "t", columns, []).pk == ()


# ----------------------------------------------------------------------------- geometry

def wkb(kind, body, order="<"):
    return struct.pack(order + "BI", 1 if order == "<" else 0, kind) + body


def point(x, y, order="<"):
    return wkb(1, struct.pack(order + "dd", x, y), order)


def test_geometry_point_with_and_without_srid():
    assert geometry_text(b"\x00\x00\x00\x00" + point(1, 2)) == "POINT(1 2)"
    with_srid = (4326).to_bytes(4, "little") + point(1.5, -2.25)
    assert geometry_text(with_srid) == "SRID=4326;POINT(1.5 -2.25)"
    assert geometry_text(b"\x00\x00\x00\x00" + point(0.1, 1e-300, ">")) == "POINT(0.1 1e-300)"


def test_geometry_collections_and_polygons():
    line = wkb(2, struct.pack("<I", 2) + struct.pack("<4d", 0, 0, 1, 1))
    ring = struct.pack("<I", 4) + struct.pack("<8d", 0, 0, 1, 0, 1, 1, 0, 0)
    polygon = wkb(3, struct.pack("<I", 1) + ring)
    multipoint = wkb(4, struct.pack("<I", 2) + point(1, 1) + point(2, 2))
    collection = wkb(7, struct.pack("<I", 3) + point(1, 2) + line + multipoint)
    srid0 = b"\x00\x00\x00\x00"
    assert geometry_text(srid0 + polygon) == "POLYGON((0 0,1 0,1 1,0 0))"
    assert geometry_text(srid0 + multipoint) == "MULTIPOINT(1 1,2 2)"
    assert geometry_text(srid0 + collection) == \
        "GEOMETRYCOLLECTION(POINT(1 2),LINESTRING(0 0,1 1),MULTIPOINT(1 1,2 2))"
    assert geometry_text(srid0 + wkb(7, struct.pack("<I", 0))) == "GEOMETRYCOLLECTION EMPTY"


def test_broken_geometry_falls_back_to_base64():
    assert geometry_text(b"\x00\x00\x00\x00\x01\x01\x00") is None
    assert values.geometry_value(b"\x00\x00\x00\x00\x01\x01\x00") == "AAAAAAEBAA=="


def test_every_converter_output_is_encodable():
    samples = [values.decimal_text(decimal.Decimal("1.5")), values.float_value(1.0),
               values.json_text_value('{"x": [1.0]}'), values.bytes_or_text(b"\x00")]
    orjson.loads(encode_value(samples))
