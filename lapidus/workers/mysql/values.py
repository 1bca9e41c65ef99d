"""Column values from python-mysql-replication mapped to their JSON form (EVENTS.md, "Values").

Runs in the mysql worker process.  A :class:`TablePlan` is built once per table map (the binlog
repeats the table map in every transaction, and carries the column names and types of that
moment, so an ALTER TABLE in the middle of the stream changes the plan, never shifts values).
Only the columns whose library value is not already the JSON value get a converter; rows of
tables made of integers and strings pass through untouched, which is the fast path.

Temporal columns arrive already as exact text (see :mod:`.temporal` and :mod:`.reader`);
BIT arrives as an int.  The full mapping table is in docs/types-mysql.md.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import math
import struct
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from pymysqlreplication.constants import FIELD_TYPE

from .geometry import geometry_text
from .temporal import timedelta_text

Converter = Callable[[Any], Any]

# none_sources values of python-mysql-replication (pymysqlreplication.constants.NONE_SOURCE)
NONE_NULL = "null"
NONE_EMPTY_SET = "empty set"
NONE_NOT_LOGGED = "cols bitmap"                   # column absent from a partial row image
NONE_JSON_PARTIAL = "same with before values"     # MySQL partial JSON update


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def float_value(value: float) -> Any:
    """DOUBLE: the number itself; NaN and infinities (never stored by MySQL) as strings."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def float32_value(value: float) -> Any:
    """FLOAT (4 bytes): the shortest decimal that reads back as the same 4-byte float.

    The library widens the float32 to a double, so FLOAT 1.1 would print as
    1.100000023841858; the server prints 1.1.  Both denote the same float32 value.
    """
    if not math.isfinite(value):
        return float_value(value)
    for digits in range(6, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", candidate))[0] == value:
            return candidate
    return value


def decimal_text(value: decimal.Decimal) -> str:
    """DECIMAL as its exact stored digits; ``format(..., "f")`` never uses an exponent
    (``str(Decimal("1E-30"))`` would be ``1E-30``, ``str(Decimal("0E-30"))`` ``0E-30``)."""
    return format(value, "f")


def year_value(value: int) -> int:
    """YEAR: the library adds 1900 to the stored byte, so the zero year 0000 becomes 1900,
    a year YEAR cannot hold (1901..2155).  Give it back as 0."""
    return 0 if value == 1900 else value


def set_converter(members: Sequence[str]) -> Converter:
    """SET: array of strings in the column's definition order (the library gives a Python set)."""
    order = tuple(members or ())

    def convert(value: Any) -> List[str]:
        return [m for m in order if m in value]
    return convert


def binary_converter(length: int) -> Converter:
    """BINARY(n): the binlog drops trailing zero bytes; the column value has them."""
    def convert(value: Any) -> str:
        if isinstance(value, str):          # a charset Python cannot decode stays bytes
            value = value.encode("utf-8")
        if len(value) < length:
            value = value + b"\x00" * (length - len(value))
        return b64(value)
    return convert


def bytes_or_text(value: Any) -> Any:
    """VARBINARY/BLOB (bytes) as base64; text columns are already str."""
    if isinstance(value, (bytes, bytearray)):
        return b64(bytes(value))
    return value


def geometry_value(value: Any) -> Any:
    if not isinstance(value, (bytes, bytearray)):
        return value
    text = geometry_text(bytes(value))
    return text if text is not None else b64(bytes(value))


def json_text_value(value: Any) -> Any:
    """A MariaDB JSON column (LONGTEXT with CHECK json_valid) as a nested value.

    Numbers keep their exact digits: non-integers (and integers beyond 64 bits) become
    Decimal, which the event encoder writes as a bare JSON number with the same digits.
    A text that does not parse (the column was changed after the row was written) stays a
    string.
    """
    if not isinstance(value, str):
        return bytes_or_text(value)
    try:
        return json.loads(value, parse_float=decimal.Decimal, parse_int=_json_int)
    except ValueError:
        return value


_INT_MIN, _UINT_MAX = -(1 << 63), (1 << 64) - 1


def _json_int(text: str) -> Any:
    """JSON integers beyond the 64-bit range the encoder writes natively stay exact as Decimal."""
    value = int(text)
    return value if _INT_MIN <= value <= _UINT_MAX else decimal.Decimal(text)


def json_binary_value(value: Any) -> Any:
    """A MySQL binary JSON value from the library: bytes keys and strings must not leak."""
    if isinstance(value, dict):
        return {(k.decode("utf-8") if isinstance(k, (bytes, bytearray)) else k):
                json_binary_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_binary_value(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    if isinstance(value, float):
        return float_value(value)
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, (_dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return timedelta_text(value, 6 if value.microseconds else 0)
    return value          # int, bool, None, str, Decimal (exact through the encoder)


def legacy_temporal(value: Any) -> Any:
    """Pre-5.6 temporal formats (old DATETIME, TIMESTAMP, TIME columns) the library decodes."""
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return timedelta_text(value)
    return value


def legacy_timestamp(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        if value == _dt.datetime(1970, 1, 1):
            return "0000-00-00T00:00:00Z"
        return value.isoformat() + "Z"
    return value


# Column types whose library value already is the JSON value.
_AS_IS = frozenset({
    FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.INT24, FIELD_TYPE.LONG, FIELD_TYPE.LONGLONG,
    FIELD_TYPE.ENUM, FIELD_TYPE.BIT,
    FIELD_TYPE.DATE, FIELD_TYPE.DATETIME2, FIELD_TYPE.TIME2, FIELD_TYPE.TIMESTAMP2,
})


def converter_for(column: Any, is_json_text: bool = False) -> Optional[Converter]:
    """The converter for one library ``Column`` (None when the value passes as it is)."""
    kind = column.type
    if kind in _AS_IS:
        return None
    binary = getattr(column, "character_set_name", None) == "binary"
    if kind in (FIELD_TYPE.VARCHAR, FIELD_TYPE.VAR_STRING):
        return bytes_or_text if binary else None
    if kind == FIELD_TYPE.STRING:
        if binary:
            return binary_converter(getattr(column, "max_length", 0) or 0)
        return None
    if kind == FIELD_TYPE.BLOB:
        if is_json_text:
            return json_text_value
        return bytes_or_text if binary or not getattr(column, "character_set_name", None) else None
    if kind == FIELD_TYPE.NEWDECIMAL:
        return decimal_text
    if kind == FIELD_TYPE.DOUBLE:
        return float_value
    if kind == FIELD_TYPE.FLOAT:
        return float32_value
    if kind == FIELD_TYPE.YEAR:
        return year_value
    if kind == FIELD_TYPE.SET:
        return set_converter(getattr(column, "set_values", None) or ())
    if kind == FIELD_TYPE.JSON:
        return json_binary_value
    if kind == FIELD_TYPE.GEOMETRY:
        return geometry_value
    if kind == FIELD_TYPE.TIMESTAMP:
        return legacy_timestamp
    if kind in (FIELD_TYPE.DATETIME, FIELD_TYPE.TIME, FIELD_TYPE.NEWDATE):
        return legacy_temporal
    return bytes_or_text      # anything unforeseen: never let bytes reach the encoder


class TablePlan:
    """How to turn one table's library rows into event rows.

    ``pk`` lists the primary-key column names in key order (empty: no key);
    ``converters`` pairs a column name with its converter, only for columns that need one.
    """

    __slots__ = ("schema", "table", "pk", "converters", "set_columns")

    def __init__(self, schema: str, table: str, pk: Tuple[str, ...],
                 converters: Tuple[Tuple[str, Converter], ...], set_columns: FrozenSet[str]):
        self.schema = schema
        self.table = table
        self.pk = pk
        self.converters = converters
        self.set_columns = set_columns


def build_plan(schema: str, table: str, columns: Sequence[Any], pk_indexes: Sequence[int],
               json_columns: FrozenSet[str] = frozenset()) -> TablePlan:
    """A :class:`TablePlan` from a table map's columns and its key column indexes."""
    converters = []
    set_columns = set()
    for column in columns:
        fn = converter_for(column, column.name in json_columns)
        if fn is not None:
            converters.append((column.name, fn))
        if column.type == FIELD_TYPE.SET:
            set_columns.add(column.name)
    pk = tuple(columns[i].name for i in pk_indexes if 0 <= i < len(columns))
    return TablePlan(schema, table, pk, tuple(converters), frozenset(set_columns))


def convert_row(plan: TablePlan, values: Dict[str, Any],
                none_sources: Dict[str, str]) -> Tuple[Dict[str, Any], Optional[List[str]]]:
    """Map one library row image in place; returns it and the columns the image did not carry.

    ``none_sources`` tells a real NULL from a column left out of a partial row image
    (``binlog_row_image=MINIMAL/NOBLOB``): left-out columns are removed from the row and
    returned, so "not sent" is never confused with ``null``.  An empty SET is ``[]``.
    """
    for name, fn in plan.converters:
        value = values.get(name)
        if value is not None:
            values[name] = fn(value)
    missing = None
    if none_sources:
        for name, source in none_sources.items():
            if source == NONE_NULL:
                continue
            if source == NONE_EMPTY_SET:
                values[name] = []
            elif source in (NONE_NOT_LOGGED, NONE_JSON_PARTIAL):
                values.pop(name, None)
                if missing is None:
                    missing = []
                missing.append(name)
    return values, missing
