"""PostgreSQL text output -> event values (lapidus.workers.postgresql.types).  No server needed.

Inputs are what PostgreSQL 15 prints with the replication session's settings (TimeZone=UTC,
DateStyle=ISO, IntervalStyle=postgres, extra_float_digits=3, bytea_output=hex) and what
wal2json 2.5 sends (numbers as literals, bool as a JSON bool, bytea as bare hex), checked
against the real server.  The pg_type rows of the resolve() tests are copied from PostgreSQL 15.
"""

from __future__ import annotations

import decimal
import math

import orjson
import pytest

from lapidus.events import encode_value
from lapidus.workers.postgresql.types import (
    PgType, TypeMap, array_converter, timestamptz_to_utc, to_bool, to_int, to_text,
)

# Built-in type OIDs (pg_type.dat).
BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT2VECTOR, INT4, TEXT, OID, OIDVECTOR = (
    16, 17, 18, 19, 20, 21, 22, 23, 25, 26, 30)
JSON, XML, POINT, BOX, CIDR, FLOAT4, FLOAT8, MACADDR8, MONEY, MACADDR, INET = (
    114, 142, 600, 603, 650, 700, 701, 774, 790, 829, 869)
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = (
    1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266)
BIT, VARBIT, NUMERIC, UUID, TSVECTOR, JSONB, INT4RANGE, PG_LSN = (
    1560, 1562, 1700, 2950, 3614, 3802, 3904, 3220)
# Arrays.
A_BOOL, A_BYTEA, A_INT2, A_INT4, A_TEXT, A_INT8, A_BOX, A_FLOAT8, A_INT2VECTOR = (
    1000, 1001, 1005, 1007, 1009, 1016, 1020, 1022, 1006)
A_TIMESTAMP, A_TIMESTAMPTZ, A_NUMERIC, A_JSONB, A_INTERVAL, A_INT4RANGE, A_UUID = (
    1115, 1185, 1231, 3807, 1187, 3905, 2951)

TYPES = TypeMap()


def convert(oid, value):
    return TYPES.converter(oid)(value)


# -- integers ------------------------------------------------------------------------------

@pytest.mark.parametrize("oid, text, expected", [
    (INT2, "-32768", -32768),
    (INT2, "32767", 32767),
    (INT4, "-2147483648", -2147483648),
    (INT4, "2147483647", 2147483647),
    (INT8, "-9223372036854775808", -9223372036854775808),
    (INT8, "9223372036854775807", 9223372036854775807),
    (OID, "4294967295", 4294967295),
    (INT4, "0", 0),
])
def test_integers_are_exact_ints(oid, text, expected):
    value = convert(oid, text)
    assert value == expected and type(value) is int
    assert encode_value(value) == text.encode()


def test_integers_already_parsed_by_the_wal2json_decoder_pass_through():
    assert convert(INT8, 9223372036854775807) == 9223372036854775807


def test_int_converter_is_the_builtin_for_speed():
    assert TYPES.converter(INT4) is int is to_int


# -- numeric -------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "1.50", "0", "-0.001", "12345678901234567890.000000001", "0.00000000000000000001",
    "9" * 131072 + "." + "1" * 100,         # numeric's largest precision: no int() digit limit
    "NaN", "Infinity", "-Infinity",
])
def test_numeric_is_the_exact_text(text):
    value = convert(NUMERIC, text)
    assert value == text and type(value) is str
    assert encode_value(value) == orjson.dumps(text)


def test_integral_numeric_parsed_as_int_by_the_wal2json_decoder_becomes_exact_text():
    # wal2json writes numeric 12345678901234567890123 as a JSON integer.
    assert convert(NUMERIC, 12345678901234567890123) == "12345678901234567890123"


def test_numeric_refuses_a_float_rather_than_invent_digits():
    with pytest.raises(ValueError):
        convert(NUMERIC, 1.5)


# -- float ---------------------------------------------------------------------------------

@pytest.mark.parametrize("oid, text, expected, encoded", [
    (FLOAT8, "0.1", 0.1, b"0.1"),
    (FLOAT4, "0.1", 0.1, b"0.1"),               # float4 prints its shortest exact form
    (FLOAT8, "1e+300", 1e300, b"1e+300"),
    (FLOAT8, "1e-07", 1e-7, b"1e-7"),
    (FLOAT4, "1.5e+20", 1.5e20, b"1.5e+20"),
    (FLOAT8, "100", 100.0, b"100.0"),
    (FLOAT8, "-1.7976931348623157e+308", -1.7976931348623157e308,
     b"-1.7976931348623157e+308"),
])
def test_floats_are_numbers(oid, text, expected, encoded):
    value = convert(oid, text)
    assert value == expected and type(value) is float
    assert encode_value(value) == encoded


def test_negative_zero_keeps_its_sign():
    value = convert(FLOAT8, "-0")
    assert value == 0.0 and math.copysign(1.0, value) == -1.0


@pytest.mark.parametrize("oid", [FLOAT4, FLOAT8])
@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_float_nan_and_infinities_are_strings(oid, text):
    assert convert(oid, text) == text
    assert encode_value(convert(oid, text)) == b'"' + text.encode() + b'"'


def test_float_from_an_integer_literal_of_wal2json():
    assert convert(FLOAT8, 100) == 100.0


# -- boolean -------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (True, True), (False, False),       # wal2json
    ("t", True), ("f", False),          # pgoutput and array elements
])
def test_booleans(value, expected):
    assert convert(BOOL, value) is expected


def test_boolean_text_postgresql_does_not_print_is_an_error():
    with pytest.raises(ValueError, match="not t or f"):
        to_bool("yes")


# -- strings -------------------------------------------------------------------------------

@pytest.mark.parametrize("oid, text", [
    (TEXT, "a\nb \\ \"q\" é ☃"),
    (TEXT, ""),
    (VARCHAR, "varchar"),
    (BPCHAR, "ab  "),                       # char(4): the padding is part of the value
    (NAME, "relname"),
    (CHAR, "a"),
    (CHAR, "\\377"),                        # "char" with the high bit: PG 15 prints octal
    (UUID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    (XML, "<a>x</a>"),
])
def test_string_types_are_unchanged(oid, text):
    assert convert(oid, text) == text


# -- bytea ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("\\x0a0d", "Cg0="),                    # pgoutput
    ("0a0d", "Cg0="),                       # wal2json drops the \x
    ("\\x", ""),                            # empty, pgoutput
    ("", ""),                               # empty, wal2json
    ("\\x00ff", "AP8="),
    ("\\x" + "ab" * 3000, "q6ur" * 1000),
])
def test_bytea_is_base64(text, expected):
    assert convert(BYTEA, text) == expected


def test_bytea_that_is_not_hex_is_an_error():
    with pytest.raises(ValueError):
        convert(BYTEA, "\\xzz")


# -- date and time -------------------------------------------------------------------------

@pytest.mark.parametrize("oid, text", [
    (DATE, "2026-11-30"),
    (DATE, "infinity"),
    (DATE, "-infinity"),
    (DATE, "4713-01-01 BC"),
    (DATE, "0044-03-15"),
    (TIME, "11:33:35.295384"),
    (TIME, "11:33:35"),
    (TIME, "24:00:00"),
    (TIMETZ, "11:33:35.5+05:30"),
    (TIMETZ, "11:33:35-08"),
])
def test_date_time_and_timetz_are_unchanged(oid, text):
    assert convert(oid, text) == text


@pytest.mark.parametrize("text, expected", [
    ("2026-11-30 11:33:35.295384", "2026-11-30T11:33:35.295384"),
    ("2026-11-30 11:33:35", "2026-11-30T11:33:35"),
    ("2026-11-30 11:33:35.5", "2026-11-30T11:33:35.5"),
    ("0044-03-15 12:00:00", "0044-03-15T12:00:00"),
    # No RFC 3339 form: PostgreSQL's text.
    ("infinity", "infinity"),
    ("-infinity", "-infinity"),
    ("0044-03-15 12:00:00 BC", "0044-03-15 12:00:00 BC"),
    ("294276-12-31 23:59:59", "294276-12-31 23:59:59"),
    ("10000-01-01 00:00:00", "10000-01-01 00:00:00"),
    # Another DateStyle is passed through rather than mangled.
    ("11/30/2026 11:33:35.295384", "11/30/2026 11:33:35.295384"),
    ("Mon Nov 30 11:33:35.295384 2026", "Mon Nov 30 11:33:35.295384 2026"),
])
def test_timestamp(text, expected):
    assert convert(TIMESTAMP, text) == expected


@pytest.mark.parametrize("text, expected", [
    # The replication session runs in UTC: the fast path.
    ("2026-11-30 11:33:35.295384+00", "2026-11-30T11:33:35.295384Z"),
    ("2026-11-30 11:33:35+00", "2026-11-30T11:33:35Z"),            # no ".000000" added
    ("2026-11-30 11:33:35.5+00", "2026-11-30T11:33:35.5Z"),         # digits as given
    ("0001-01-01 00:00:00+00", "0001-01-01T00:00:00Z"),
    ("9999-12-31 23:59:59.999999+00", "9999-12-31T23:59:59.999999Z"),
    # Other offsets, converted to UTC.
    ("2026-11-30 17:03:35.295384+05:30", "2026-11-30T11:33:35.295384Z"),
    ("2026-11-30 03:33:35.295384-08", "2026-11-30T11:33:35.295384Z"),
    ("2026-11-30 02:03:35-09:30", "2026-11-30T11:33:35Z"),           # Marquesas
    ("2026-11-30 08:03:35.1-03:30", "2026-11-30T11:33:35.1Z"),       # Newfoundland
    ("2026-11-30 17:18:35+05:45", "2026-11-30T11:33:35Z"),           # Nepal
    ("2026-12-01 01:33:35+14", "2026-11-30T11:33:35Z"),              # Kiritimati: day back
    ("2026-11-30 23:00:00-02", "2026-12-01T01:00:00Z"),              # day forward
    ("2026-12-31 23:30:00-01", "2027-01-01T00:30:00Z"),              # year forward
    ("1900-01-01 00:00:00+00:19:32", "1899-12-31T23:40:28Z"),        # Amsterdam LMT
    ("1880-01-01 00:00:00-00:25:21", "1880-01-01T00:25:21Z"),        # Dublin LMT
    # Local time outside years 1-9999 but the UTC instant inside (PostgreSQL prints these).
    ("10000-01-01 05:29:59.999999+05:30", "9999-12-31T23:59:59.999999Z"),
    ("0001-12-31 20:29:08-03:30:52 BC", "0001-01-01T00:00:00Z"),
    # No RFC 3339 form: PostgreSQL's text.
    ("infinity", "infinity"),
    ("-infinity", "-infinity"),
    ("0044-03-15 12:00:00+00 BC", "0044-03-15 12:00:00+00 BC"),
    ("294276-12-31 23:59:59+00", "294276-12-31 23:59:59+00"),
    ("0001-01-01 00:30:00+05:30", "0001-01-01 00:30:00+05:30"),      # UTC would be 1 BC
    ("9999-12-31 23:00:00-02", "9999-12-31 23:00:00-02"),            # UTC would be 10000
    # Another DateStyle.
    ("11/30/2026 11:33:35.295384 UTC", "11/30/2026 11:33:35.295384 UTC"),
])
def test_timestamptz_is_rfc3339_utc(text, expected):
    assert convert(TIMESTAMPTZ, text) == expected
    assert timestamptz_to_utc(text) == expected


# -- json and jsonb ------------------------------------------------------------------------

def test_jsonb_is_nested_values_with_exact_numbers():
    value = convert(JSONB, '{"a": 1.50, "b": 12345678901234567890123, "c": [1, "x", null, true]}')
    assert value == {"a": decimal.Decimal("1.50"), "b": decimal.Decimal("12345678901234567890123"),
                     "c": [1, "x", None, True]}
    assert type(value["c"][0]) is int


def test_jsonb_big_numbers_survive_the_event_encoder():
    value = convert(JSONB, '{"b": 12345678901234567890123, "a": 1.50}')
    encoded = encode_value(value)
    assert encoded == b'{"b":12345678901234567890123,"a":1.50}'
    assert b"12345678901234567890123" in encoded and b"1.50" in encoded


@pytest.mark.parametrize("literal, kind", [
    ("9223372036854775807", int),
    ("-9223372036854775808", int),
    ("999999999999999999", int),
    ("9223372036854775808", decimal.Decimal),        # orjson cannot encode it as an int
    ("-9223372036854775809", decimal.Decimal),
    ("18446744073709551616", decimal.Decimal),
])
def test_jsonb_integers_at_the_64_bit_limits(literal, kind):
    value = convert(JSONB, "[" + literal + "]")[0]
    assert type(value) is kind
    assert encode_value(value) == literal.encode()


def test_jsonb_integer_longer_than_pythons_int_digit_limit():
    literal = "7" * 5000                # int(str) refuses more than 4300 digits by default
    value = convert(JSONB, "[" + literal + "]")[0]
    assert encode_value(value) == literal.encode()


def test_jsonb_decimal_digits_stay_exact():
    text = '[12345678901234567890.000000001, -0.5, 1.10]'
    assert encode_value(convert(JSONB, text)) == b"[12345678901234567890.000000001,-0.5,1.10]"


def test_json_keeps_the_literal_as_entered():
    # json (not jsonb) stores the text as given, exponent included.
    value = convert(JSON, '{"x": 1e5, "y": 2}')
    assert value == {"x": decimal.Decimal("1E+5"), "y": 2}
    assert orjson.loads(encode_value(value)) == {"x": 100000.0, "y": 2}


@pytest.mark.parametrize("text, expected", [
    ('"str"', "str"), ("null", None), ("true", True), ("3", 3), ("[]", []), ("{}", {}),
    ('{"k": "\\u00e9\\n"}', {"k": "é\n"}),
])
def test_jsonb_scalars_and_escapes(text, expected):
    assert convert(JSONB, text) == expected


def test_json_that_is_not_json_is_an_error():
    with pytest.raises(ValueError):
        convert(JSONB, "{not json")


# -- types without a natural JSON form: their text ----------------------------------------

@pytest.mark.parametrize("oid, text", [
    (INTERVAL, "1 day 02:03:04.5"),
    (INTERVAL, "-1 years -2 mons +3 days"),
    (MONEY, "$12.34"),
    (INET, "10.0.0.1/8"),
    (CIDR, "10.0.0.0/8"),
    (MACADDR, "08:00:2b:01:02:03"),
    (MACADDR8, "08:00:2b:01:02:03:04:05"),
    (TSVECTOR, "'a' 'cat' 'fat'"),
    (POINT, "(1,2)"),
    (BOX, "(3,4),(1,2)"),
    (INT4RANGE, "[1,5)"),
    (INT4RANGE, "empty"),
    (BIT, "1010"),
    (VARBIT, "101"),
    (PG_LSN, "0/1928C90"),
])
def test_text_form_types_are_unchanged(oid, text):
    assert convert(oid, text) == text


def test_int_vectors_are_lists_of_ints():
    assert convert(INT2VECTOR, "1 2 3") == [1, 2, 3]
    assert convert(OIDVECTOR, "") == []


# -- arrays --------------------------------------------------------------------------------

@pytest.mark.parametrize("oid, text, expected", [
    (A_INT4, "{1,NULL,3}", [1, None, 3]),
    (A_INT4, "{}", []),
    (A_INT4, "{{1,2},{3,4}}", [[1, 2], [3, 4]]),
    (A_INT4, "[0:2]={1,2,3}", [1, 2, 3]),
    (A_INT8, "{-9223372036854775808,9223372036854775807}",
     [-9223372036854775808, 9223372036854775807]),
    (A_INT2, "{{{1}},{{2}}}", [[[1]], [[2]]]),
    (A_NUMERIC, "{1.50,NaN,-Infinity,12345678901234567890.000000001}",
     ["1.50", "NaN", "-Infinity", "12345678901234567890.000000001"]),
    (A_FLOAT8, "{1e+300,-0,Infinity,NaN,NULL}", [1e300, -0.0, "Infinity", "NaN", None]),
    (A_BOOL, "{t,f,NULL}", [True, False, None]),
    (A_BYTEA, r'{"\\x00ff","\\x",NULL}', ["AP8=", "", None]),
    (A_TIMESTAMPTZ, '{"2026-11-30 11:33:35.295384+00",infinity,NULL}',
     ["2026-11-30T11:33:35.295384Z", "infinity", None]),
    (A_TIMESTAMPTZ, '{"2026-11-30 17:03:35.5+05:30"}', ["2026-11-30T11:33:35.5Z"]),
    (A_TIMESTAMP, '{"2026-11-30 11:33:35",-infinity}', ["2026-11-30T11:33:35", "-infinity"]),
    (A_TEXT, r'{"a b","c,d","x\"y","back\\slash",NULL,"NULL",""}',
     ["a b", "c,d", 'x"y', "back\\slash", None, "NULL", ""]),
    (A_JSONB, r'{"{\"k\": [1, 2.50]}",NULL}', [{"k": [1, decimal.Decimal("2.50")]}, None]),
    (A_BOX, "{(3,4),(1,2);(1,1),(0,0)}", ["(3,4),(1,2)", "(1,1),(0,0)"]),
    (A_INTERVAL, '{"1 day","-1 years"}', ["1 day", "-1 years"]),
    (A_INT4RANGE, '{"[1,5)",empty}', ["[1,5)", "empty"]),
    (A_UUID, "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    (A_INT2VECTOR, '{"1 2","3"}', [[1, 2], [3]]),
])
def test_arrays_map_each_element(oid, text, expected):
    assert convert(oid, text) == expected


def test_array_of_numeric_encodes_exact_strings():
    value = convert(A_NUMERIC, "{1.50,12345678901234567890.000000001}")
    assert encode_value(value) == b'["1.50","12345678901234567890.000000001"]'


def test_malformed_array_is_an_error():
    with pytest.raises(ValueError, match="malformed array"):
        convert(A_INT4, "{1,2")


def test_array_converter_of_text_elements_is_the_parser_alone():
    assert array_converter(to_text)('{a,"b c"}') == ["a", "b c"]


# -- TypeMap: built-ins, unknown OIDs, pre-filled entries ---------------------------------

def test_unknown_oid_falls_back_to_text():
    types = TypeMap()
    assert types.converter(999_999) is to_text
    assert types.convert(999_999, "(1,x)") == "(1,x)"
    assert not types.known(999_999)
    assert types.unknown([999_999, INT4, 999_999]) == [999_999]


def test_convert_keeps_null():
    assert TypeMap().convert(INT4, None) is None


def test_prefilled_converters_need_no_connection():
    types = TypeMap(converters={50_000: int})
    assert types.convert(50_000, "7") == 7
    assert types.known(50_000)


# pg_type rows of PostgreSQL 15 for:
#   create type mood as enum ('sad','ok','happy');
#   create domain posint as int check (value > 0);  create domain dposint as posint;
#   create domain posints as int[];  create domain nested_arr as posints;
#   create type pair as (a int, b text);  create domain mybox as box;
#   create domain tsd as timestamptz;  create type floatrange as range (subtype = float8);
#   create extension citext;
#   (oid, typname, typtype, typcategory, typelem, typlen, typbasetype, typdelim)
CATALOG = [
    (16406, "_mood", "b", "A", 16407, -1, 0, ","),
    (16407, "mood", "e", "E", 0, 4, 0, ","),
    (16413, "_posint", "b", "A", 16414, -1, 0, ","),
    (16414, "posint", "d", "N", 0, 4, 23, ","),
    (16416, "_posints", "b", "A", 16417, -1, 0, ","),
    (16417, "posints", "d", "A", 0, -1, 1007, ","),
    (16418, "_dposint", "b", "A", 16419, -1, 0, ","),
    (16419, "dposint", "d", "N", 0, 4, 16414, ","),
    (16421, "_pair", "b", "A", 16422, -1, 0, ","),
    (16422, "pair", "c", "C", 0, -1, 0, ","),
    (16437, "citext", "b", "S", 0, -1, 0, ","),
    (16442, "_citext", "b", "A", 16437, -1, 0, ","),
    (16669, "_mybox", "b", "A", 16670, -1, 0, ";"),
    (16670, "mybox", "d", "G", 0, 32, 603, ";"),
    (16671, "_floatrange", "b", "A", 16674, -1, 0, ","),
    (16672, "floatmultirange", "m", "R", 0, -1, 0, ","),
    (16674, "floatrange", "r", "R", 0, -1, 0, ","),
    (16681, "_tsd", "b", "A", 16682, -1, 0, ","),
    (16682, "tsd", "d", "D", 0, 8, 1184, ","),
    (16684, "nested_arr", "d", "A", 0, -1, 16417, ","),
]

# Text PostgreSQL 15 printed for a value of each type.
SAMPLES = [
    (16407, "ok", "ok"),
    (16406, "{sad,happy}", ["sad", "happy"]),
    (16414, "5", 5),
    (16413, "{1,NULL}", [1, None]),
    (16417, "{3,4}", [3, 4]),
    (16416, '{"{3,4}"}', [[3, 4]]),            # array of a domain over int[]
    (16419, "7", 7),
    (16418, "{7}", [7]),
    (16422, '(1,"x y")', '(1,"x y")'),
    (16421, r'{"(1,x)","(2,\"a,b\")"}', ["(1,x)", '(2,"a,b")']),
    (16437, "AbC", "AbC"),
    (16442, '{AbC,"d e"}', ["AbC", "d e"]),
    (16670, "(3,4),(1,2)", "(3,4),(1,2)"),
    (16669, "{(3,4),(1,2);(1,1),(0,0)}", ["(3,4),(1,2)", "(1,1),(0,0)"]),
    (16674, "[1.5,2)", "[1.5,2)"),
    (16672, "{[1.5,2)}", "{[1.5,2)}"),         # a multirange is not an array
    (16671, '{"[1.5,2)"}', ["[1.5,2)"]),
    (16682, "2026-11-30 11:33:35.295384+00", "2026-11-30T11:33:35.295384Z"),
    (16681, '{"2026-11-30 11:33:35.295384+00"}', ["2026-11-30T11:33:35.295384Z"]),
    (16684, "{3,4}", [3, 4]),
]


@pytest.mark.parametrize("oid, text, expected", SAMPLES)
def test_pg_type_rows_give_converters_without_a_connection(oid, text, expected):
    types = TypeMap(types=[PgType(*row) for row in CATALOG])
    assert types.convert(oid, text) == expected


class FakeConnection:
    """Just enough of a psycopg2 connection for TypeMap.resolve, over CATALOG."""

    def __init__(self, rows, autocommit=False):
        self.rows = {row[0]: row for row in rows}
        self.queries = []
        self.autocommit = autocommit
        self.closed = 0
        self.status = 0                 # psycopg2 TRANSACTION_STATUS_IDLE
        self.rollbacks = 0

    def get_transaction_status(self):
        return self.status

    def rollback(self):
        self.rollbacks += 1

    def cursor(self):
        return FakeCursor(self)


class FakeCursor:
    def __init__(self, conn):
        self.conn = conn
        self.result = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, sql, params):
        assert "pg_catalog.pg_type" in sql and "ANY(%s::oid[])" in sql
        oids = list(params[0])
        self.conn.queries.append(oids)
        self.result = [self.conn.rows[oid] for oid in oids if oid in self.conn.rows]

    def fetchall(self):
        return self.result


def test_resolve_follows_domains_and_elements_to_unknown_types():
    conn = FakeConnection(CATALOG)
    types = TypeMap()
    # A column of an array of a domain over a domain: three types to learn, in three rounds.
    assert types.resolve(conn, [16418]) == []
    assert conn.queries == [[16418], [16419], [16414]]
    assert types.convert(16418, "{7,NULL}") == [7, None]
    assert types.convert(16419, "7") == 7
    assert types.known(16414)


def test_resolve_asks_once_and_only_for_unknown_oids():
    conn = FakeConnection(CATALOG)
    types = TypeMap()
    types.resolve(conn, [INT4, 16407, 16406, 16407])
    assert conn.queries == [[16406, 16407]]
    types.resolve(conn, [16407, 16406, TEXT])
    assert conn.queries == [[16406, 16407]]


def test_resolve_caches_oids_missing_from_pg_type_as_text():
    conn = FakeConnection(CATALOG)
    types = TypeMap()
    assert types.resolve(conn, [987_654, 16407]) == [987_654]
    assert types.convert(987_654, "x") == "x"
    types.resolve(conn, [987_654])
    assert len(conn.queries) == 1


def test_resolve_all_samples_in_one_call():
    conn = FakeConnection(CATALOG)
    types = TypeMap()
    types.resolve(conn, [oid for oid, _, _ in SAMPLES])
    for oid, text, expected in SAMPLES:
        assert types.convert(oid, text) == expected


def test_resolve_leaves_an_idle_connection_idle():
    conn = FakeConnection(CATALOG)
    TypeMap().resolve(conn, [16407])
    assert conn.rollbacks == 1


def test_resolve_does_not_end_the_callers_transaction():
    conn = FakeConnection(CATALOG)
    conn.status = 2                     # TRANSACTION_STATUS_INTRANS
    TypeMap().resolve(conn, [16407])
    assert conn.rollbacks == 0
    conn = FakeConnection(CATALOG, autocommit=True)
    TypeMap().resolve(conn, [16407])
    assert conn.rollbacks == 0


# -- a whole row through the event encoder -------------------------------------------------

def test_a_row_encodes_to_the_documented_json():
    row = [("id", INT4, "2"), ("price", NUMERIC, "1.50"), ("ratio", FLOAT8, "NaN"),
           ("ok", BOOL, True), ("blob", BYTEA, "0a0d"),
           ("at", TIMESTAMPTZ, "2026-11-30 11:33:35.295384+00"),
           ("doc", JSONB, '{"n": 12345678901234567890123}'), ("tags", A_TEXT, '{a,"b c"}'),
           ("gone", TEXT, None)]
    item = {name: TYPES.convert(oid, value) for name, oid, value in row}
    assert encode_value(item) == (
        b'{"id":2,"price":"1.50","ratio":"NaN","ok":true,"blob":"Cg0=",'
        b'"at":"2026-11-30T11:33:35.295384Z","doc":{"n":12345678901234567890123},'
        b'"tags":["a","b c"],"gone":null}')
