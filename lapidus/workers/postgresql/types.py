"""PostgreSQL column values, from their text output form to the JSON values of the event contract.

Runs in the PostgreSQL worker process, once per column value, for both decoders:

* wal2json (format-version 2, ``include-type-oids``): numbers arrive as the literal digits
  (``str``, or ``int`` for integral literals), booleans as Python ``bool``, bytea as hex
  *without* the ``\\x`` prefix, everything else as ``str`` in PostgreSQL's text form;
* pgoutput: every value in text form (``t``/``f``, ``\\x0a0d``).

NULL is ``None`` and never reaches a converter.  The replication session runs with
``TimeZone=UTC, DateStyle=ISO, IntervalStyle=postgres, extra_float_digits=3, bytea_output=hex``;
date/time converters recognise the ISO form and pass anything else through unchanged, and
timestamptz converts any ISO offset to UTC.  The mapping table is ``docs/types-postgresql.md``.

A converter raises :class:`ValueError` only on text PostgreSQL does not produce with those
settings (``int("x")``); a type it does not know is never an error but its text.
"""

from __future__ import annotations

import binascii
import datetime as _dt
import decimal
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from .arrays import parse_array

Converter = Callable[[Any], Any]


# -- scalar converters ---------------------------------------------------------------------
# Each is a plain function of one argument: the decoders call them once per column value.

def to_text(value: Any) -> Any:
    """Types without a natural JSON form (interval, money, inet, ranges, enums ...): the text."""
    return value


# int2, int4, int8, oid: exact over the whole 64-bit range (Python ints are unbounded).  The
# builtin itself, not a wrapper: this is the most frequent column type, and a Python-level
# call would add a third to its cost.
to_int: Callable[[Union[str, int]], int] = int


def to_numeric(value: Union[str, int]) -> str:
    """numeric: the exact stored digits as a string, ``NaN`` and infinities included.

    Never through float.  wal2json sends integral numerics as JSON integers, which the
    decoder may already have turned into a (still exact) Python int.
    """
    if value.__class__ is str:
        return value
    if value.__class__ is int:
        return str(value)
    raise ValueError(f"numeric value {value!r} is not exact text")


def to_float(value: Union[str, bytes, int]) -> Union[float, str]:
    """float4, float8: a JSON number; ``NaN``, ``Infinity``, ``-Infinity`` as those strings."""
    number = float(value)
    if number - number == 0.0:      # false only for NaN and the infinities
        return number
    if number != number:
        return "NaN"
    return "Infinity" if number > 0 else "-Infinity"


_BOOLS: Dict[Any, bool] = {"t": True, "f": False, True: True, False: False,
                           "true": True, "false": False}


def to_bool(value: Union[str, bool]) -> bool:
    """bool: ``t``/``f`` (pgoutput, arrays) or a Python bool (wal2json)."""
    try:
        return _BOOLS[value]
    except KeyError:
        raise ValueError(f"boolean value {value!r} is not t or f") from None


def to_bytea(value: str) -> str:
    """bytea: base64.  Accepts ``\\x0a0d`` (pgoutput, arrays) and bare ``0a0d`` (wal2json)."""
    digits = value[2:] if value[:2] == "\\x" else value
    return binascii.b2a_base64(bytes.fromhex(digits), newline=False).decode("ascii")


def to_timestamp(value: str) -> str:
    """timestamp: ``2026-11-30 11:33:35.295384`` -> ``2026-11-30T11:33:35.295384``.

    ``infinity``, ``-infinity``, BC dates and years past 9999 keep PostgreSQL's text: RFC 3339
    has no form for them.  So does anything that is not ISO output (another DateStyle).
    """
    # ISO output of a four-digit AD year has exactly one space, between date and time.
    if value[4:5] == "-" and value[-1:] != "C":
        return value.replace(" ", "T")
    return value


# An ISO timestamptz.  PostgreSQL prints the offset as ``+HH``, ``+HH:MM`` or, for historical
# local mean times, ``+HH:MM:SS``; fractional seconds have 1-6 digits, trailing zeros dropped;
# years may have more than four digits and a trailing `` BC``.
_TIMESTAMPTZ = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(\.\d+)?"
    r"([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?( BC)?")


def to_timestamptz(value: str) -> str:
    """timestamptz: RFC 3339 in UTC with ``Z``, fractional digits kept exactly as given.

    ``2026-11-30 11:33:35.295384+00`` -> ``2026-11-30T11:33:35.295384Z`` by string operations
    alone (the replication session runs in UTC, so this is the path taken); other offsets are
    converted with :func:`timestamptz_to_utc`, about 15 times slower.
    ``infinity``, ``-infinity`` and instants outside years 1-9999 in UTC keep PostgreSQL's text.
    """
    # Only ISO output ends in "+00" (other DateStyles write "UTC"); with a four-digit year
    # (BC ends in " BC") its one space separates date and time.
    if value[-3:] == "+00" and value[4:5] == "-":
        return value[:-3].replace(" ", "T") + "Z"
    return timestamptz_to_utc(value)


def timestamptz_to_utc(value: str) -> str:
    """Any ISO timestamptz text as RFC 3339 UTC; text it cannot convert comes back unchanged.

    Works for local times that are BC or past 9999 while their UTC instant is not (``10000-01-01
    05:29:59+05:30`` is ``9999-12-31T23:59:59Z``).
    """
    match = _TIMESTAMPTZ.fullmatch(value)
    if match is None:
        return value            # infinity, another DateStyle
    y, mo, d, h, mi, s, fraction, sign, oh, om, os_, bc = match.groups()
    year = 1 - int(y) if bc else int(y)         # astronomical year: 1 BC is year 0
    # datetime only knows years 1-9999.  The Gregorian calendar repeats exactly every 400
    # years, so compute in a year of the same 400-year cycle (2001-2400) and shift back.
    shift = year - ((year - 1) % 400 + 2001)
    offset = _dt.timedelta(hours=int(oh), minutes=int(om or 0), seconds=int(os_ or 0))
    try:
        local = _dt.datetime(year - shift, int(mo), int(d), int(h), int(mi), int(s))
    except ValueError:
        return value            # not a date PostgreSQL writes; keep the evidence
    utc = local - offset if sign == "+" else local + offset
    utc_year = utc.year + shift
    if not 1 <= utc_year <= 9999:
        return value            # RFC 3339 has no form for it
    # Offsets are whole seconds, so the fractional digits are the same in UTC.
    return (f"{utc_year:04d}-{utc.month:02d}-{utc.day:02d}T{utc.hour:02d}:{utc.minute:02d}:"
            f"{utc.second:02d}{fraction or ''}Z")


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def _json_int(literal: str) -> Union[int, decimal.Decimal]:
    """An integer inside json/jsonb: int when orjson can encode it, else an exact Decimal.

    Up to 18 digits always fits in int64; longer literals go through Decimal first, which also
    avoids Python's 4300-digit limit on ``int(str)`` (jsonb numbers may be much longer).
    """
    if len(literal) < 19:
        return int(literal)
    number = decimal.Decimal(literal)
    if _INT64_MIN <= number <= _INT64_MAX:
        return int(number)
    return number


# Decimal(str) is exact whatever the context precision; lapidus.events writes a Decimal as a
# bare JSON number.  strict=False: json (not jsonb) keeps the text as entered.
_JSON = json.JSONDecoder(parse_float=decimal.Decimal, parse_int=_json_int, strict=False)


def to_json(value: str) -> Any:
    """json, jsonb: nested Python values; numbers exact (int, or Decimal with the digits)."""
    return _JSON.decode(value)


def to_int_vector(value: str) -> List[int]:
    """int2vector, oidvector: space-separated (``1 2 3``), not brace-delimited arrays."""
    return [int(part) for part in value.split()]


def array_converter(element: Converter, delimiter: str = ",") -> Converter:
    """A converter for arrays of ``element``: nested lists, NULL elements ``None``."""
    if element is to_text:
        # Elements are already the text parse_array returns: no second pass.
        return lambda value: parse_array(value, delimiter)

    def convert(value: str) -> list:
        return _map_elements(parse_array(value, delimiter), element)

    return convert


def _map_elements(items: list, element: Converter) -> list:
    # parse_array keeps arrays rectangular: either every item is a sub-array or none is.
    if items and items[0].__class__ is list:
        return [_map_elements(sub, element) for sub in items]
    return [None if item is None else element(item) for item in items]


# -- built-in types ------------------------------------------------------------------------
# Built-in OIDs are fixed in PostgreSQL's catalog (pg_type.dat) and never change.

BUILTIN_SCALARS: Dict[int, Converter] = {
    16: to_bool,            # bool
    17: to_bytea,           # bytea
    18: to_text,            # "char"
    19: to_text,            # name
    20: to_int,             # int8
    21: to_int,             # int2
    22: to_int_vector,      # int2vector
    23: to_int,             # int4
    25: to_text,            # text
    26: to_int,             # oid
    30: to_int_vector,      # oidvector
    114: to_json,           # json
    142: to_text,           # xml
    700: to_float,          # float4
    701: to_float,          # float8
    1042: to_text,          # bpchar
    1043: to_text,          # varchar
    1082: to_text,          # date
    1083: to_text,          # time
    1114: to_timestamp,     # timestamp
    1184: to_timestamptz,   # timestamptz
    1266: to_text,          # timetz
    1700: to_numeric,       # numeric
    2950: to_text,          # uuid
    3802: to_json,          # jsonb
}

# Built-in array type -> element type, from pg_type (typcategory 'A') of PostgreSQL 15:
# every base, range and multirange type a table column can have.  Elements not in
# BUILTIN_SCALARS (interval, inet, ranges ...) stay text.
BUILTIN_ARRAYS: Dict[int, int] = {
    1000: 16, 1001: 17, 1002: 18, 1003: 19, 1016: 20, 1005: 21, 1006: 22, 1007: 23,
    1008: 24, 1009: 25, 1028: 26, 1010: 27, 1011: 28, 1012: 29, 1013: 30, 199: 114,
    143: 142, 1017: 600, 1018: 601, 1019: 602, 1020: 603, 1027: 604, 629: 628, 651: 650,
    1021: 700, 1022: 701, 719: 718, 775: 774, 791: 790, 1040: 829, 1041: 869, 1034: 1033,
    1014: 1042, 1015: 1043, 1182: 1082, 1183: 1083, 1115: 1114, 1185: 1184, 1187: 1186,
    1270: 1266, 1561: 1560, 1563: 1562, 1231: 1700, 2201: 1790, 2207: 2202, 2208: 2203,
    2209: 2204, 2210: 2205, 2211: 2206, 2951: 2950, 2949: 2970, 3221: 3220, 3643: 3614,
    3645: 3615, 3644: 3642, 3735: 3734, 3770: 3769, 3807: 3802, 3905: 3904, 3907: 3906,
    3909: 3908, 3911: 3910, 3913: 3912, 3927: 3926, 4073: 4072, 4090: 4089, 4097: 4096,
    4192: 4191, 6150: 4451, 6151: 4532, 6152: 4533, 6153: 4534, 6155: 4535, 6157: 4536,
    5039: 5038, 271: 5069,
}

# typdelim of the element type, where it is not ','.
BUILTIN_DELIMITERS: Dict[int, str] = {603: ";"}    # box: its text contains commas


def _builtin_converters() -> Dict[int, Converter]:
    converters = dict(BUILTIN_SCALARS)
    for array_oid, elem_oid in BUILTIN_ARRAYS.items():
        converters[array_oid] = array_converter(BUILTIN_SCALARS.get(elem_oid, to_text),
                                                BUILTIN_DELIMITERS.get(elem_oid, ","))
    return converters


_BUILTIN_CONVERTERS = _builtin_converters()


# -- user-defined types --------------------------------------------------------------------

@dataclass(frozen=True)
class PgType:
    """The pg_type columns that decide a type's converter (one row of :data:`TYPE_QUERY`)."""

    oid: int
    name: str
    typtype: str        # b base, c composite, d domain, e enum, p pseudo, r range, m multirange
    category: str       # typcategory: 'A' array, 'E' enum ...
    elem: int           # typelem: element type of an array, else 0
    length: int         # typlen: -1 for arrays; point and name have typelem but a fixed size
    basetype: int       # typbasetype: the type a domain is over, else 0
    delimiter: str      # typdelim: the separator when this type is an array element


TYPE_QUERY = (
    "SELECT oid::int8, typname::text, typtype::text, typcategory::text, typelem::int8,"
    " typlen::int4, typbasetype::int8, typdelim::text"
    " FROM pg_catalog.pg_type WHERE oid = ANY(%s::oid[])"
)


class TypeMap:
    """Type OID -> converter, for one database.  Lives in the PostgreSQL worker process.

    :meth:`converter` is the hot path (one dict lookup, never fails: an unknown OID maps to
    its text).  :meth:`resolve` looks unknown OIDs up in pg_type and caches their converters:
    enum -> text, domain -> its base type's converter, array -> array of the element's
    converter, composite/range/anything else -> text.  Entries never expire: a type's OID and
    kind never change while it exists.  (Known gap: after OID wrap-around a dropped type's OID
    could be given to a new type, which would then keep the old, cached converter.)

    ``converters`` pre-fills OID -> converter entries and ``types`` pg_type rows, so tests and
    callers that already know the catalog need no connection.
    """

    def __init__(self, converters: Optional[Mapping[int, Converter]] = None,
                 types: Iterable[PgType] = ()):
        self._converters: Dict[int, Converter] = dict(_BUILTIN_CONVERTERS)
        self._delimiters: Dict[int, str] = dict(BUILTIN_DELIMITERS)
        if converters:
            self._converters.update(converters)
        self.add_types(types)

    def converter(self, oid: int) -> Converter:
        """The converter for ``oid``; :func:`to_text` when the OID is not known (yet)."""
        return self._converters.get(oid, to_text)

    def convert(self, oid: int, value: Any) -> Any:
        """Convenience for one value (``None`` stays ``None``); decoders cache converters."""
        return None if value is None else self._converters.get(oid, to_text)(value)

    def known(self, oid: int) -> bool:
        return oid in self._converters

    def unknown(self, oids: Iterable[int]) -> List[int]:
        """The OIDs among ``oids`` that :meth:`resolve` would look up, without duplicates."""
        return sorted({oid for oid in oids if oid not in self._converters})

    def add_types(self, rows: Iterable[PgType]) -> None:
        """Build and cache converters for pg_type rows (and what they refer to among them)."""
        pending = {row.oid: row for row in rows if row.oid not in self._converters}
        for row in pending.values():
            self._delimiters[row.oid] = row.delimiter
        for oid in list(pending):
            self._build(oid, pending, ())

    def resolve(self, conn, oids: Iterable[int]) -> List[int]:
        """Look up unknown ``oids`` (and the types they are built on) in pg_type and cache them.

        ``conn`` is a psycopg2 connection to the database the OIDs come from (not the
        replication connection).  Returns the OIDs pg_type did not have (a type dropped since
        the change was written): they are cached as text, so they are asked for once.  If the
        connection was idle, it is left idle: no transaction holds a snapshot afterwards.
        The connection must see current catalogs: not inside an old REPEATABLE READ transaction,
        or types created since would be taken for missing.
        """
        pending = set(self.unknown(oids))
        if not pending:
            return []
        was_idle = conn.get_transaction_status() == 0     # psycopg2 TRANSACTION_STATUS_IDLE
        rows: Dict[int, PgType] = {}
        missing: List[int] = []
        try:
            with conn.cursor() as cur:
                # Each round fetches what the previous rows are built on (domain bases, array
                # elements) that is neither cached nor fetched: a few rounds at most.
                while pending:
                    cur.execute(TYPE_QUERY, (sorted(pending),))
                    found = {row[0]: PgType(*row) for row in cur.fetchall()}
                    rows.update(found)
                    missing.extend(sorted(pending - found.keys()))
                    pending = {ref for row in found.values() for ref in (row.basetype, row.elem)
                               if ref and ref not in self._converters and ref not in rows
                               and ref not in missing}
        finally:
            if was_idle and not conn.autocommit and not conn.closed:
                conn.rollback()
        self.add_types(rows.values())
        for oid in missing:
            self._converters.setdefault(oid, to_text)
        return missing

    def _build(self, oid: int, rows: Mapping[int, PgType], seen: tuple) -> Converter:
        converter = self._converters.get(oid)
        if converter is not None:
            return converter
        row = rows.get(oid)
        if row is None or oid in seen:
            # Not in the catalog rows at hand (or a cycle the catalog cannot really have).
            return to_text
        seen = seen + (oid,)
        if row.typtype == "d" and row.basetype:
            converter = self._build(row.basetype, rows, seen)
        elif row.category == "A" and row.elem and row.length == -1:
            element = self._build(row.elem, rows, seen)
            converter = array_converter(element, self._delimiters.get(row.elem, ","))
        else:
            # enum, composite, range, multirange, base types of extensions (citext, hstore):
            # their text output is the JSON form.
            converter = to_text
        self._converters[oid] = converter
        return converter
