"""Values of a snapshot chunk's SELECT mapped to exactly what an ``insert`` event carries.

Runs in the mysql worker process, for every row a snapshot chunk reads.  The binlog path
(:mod:`.rowimage`, :mod:`.values`, docs/types-mysql.md) decodes row images; a SELECT returns
the text protocol instead, so each column gets a converter from its information_schema type
that lands on the same JSON form:

* the snapshot connection keeps the server's text for DECIMAL, temporal, FLOAT/DOUBLE, YEAR
  and SET columns (:data:`CONVERSIONS`: pymysql's own decoders for every other type, which
  already give the event value: ints, text, bytes);
* DECIMAL text is the exact stored digits with the declared scale, as the binlog path prints;
* DATETIME/TIMESTAMP text gets its ``T`` (TIMESTAMP in UTC: the session runs with
  ``time_zone = '+00:00'``, plus ``Z``), zero dates keep their digits;
* FLOAT is selected as ``CAST(col AS DOUBLE)`` (the server's FLOAT text has 6 digits, not
  always enough to read back) and narrowed to 4 bytes like the binlog path;
* BIT, binary strings, geometry and MariaDB JSON text take :mod:`.values`' own converters.

Only columns that need a converter get one; rows of ints and strings pass untouched.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pymysql.converters
from pymysql.constants import FIELD_TYPE

from . import values

Converter = Callable[[Any], Any]


def _text(value: Any) -> Any:
    return value


#: pymysql decoders for the snapshot connection: the server's text for these types
CONVERSIONS = dict(pymysql.converters.conversions)
for _kind in (FIELD_TYPE.DECIMAL, FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.DATE, FIELD_TYPE.NEWDATE,
              FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP, FIELD_TYPE.TIME, FIELD_TYPE.YEAR,
              FIELD_TYPE.SET, FIELD_TYPE.FLOAT, FIELD_TYPE.DOUBLE, FIELD_TYPE.JSON):
    CONVERSIONS[_kind] = _text

_INTEGERS = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint"})
_TEXTS = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum"})
_BLOBS = frozenset({"varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
_GEOMETRY = frozenset({"geometry", "point", "linestring", "polygon", "multipoint",
                       "multilinestring", "multipolygon", "geometrycollection"})


def _datetime(value: str) -> str:
    return value.replace(" ", "T", 1)


def _timestamp(value: str) -> str:
    return value.replace(" ", "T", 1) + "Z"


def _float32(value: str) -> Any:
    widened = struct.unpack("<f", struct.pack("<f", float(value)))[0]
    return values.float32_value(widened)


def _double(value: str) -> Any:
    return values.float_value(float(value))


def _year(value: Any) -> int:
    return int(value)


def _bit(value: bytes) -> int:
    return int.from_bytes(value, "big")


def _set_converter(members: Sequence[str]) -> Converter:
    order = tuple(members)

    def convert(value: str) -> List[str]:
        chosen = set(value.split(",")) if value else set()
        return [m for m in order if m in chosen]
    return convert


def _set_members(column_type: str) -> List[str]:
    """``set('a','b''c')`` -> ``['a', "b'c"]``."""
    inner = column_type[column_type.index("(") + 1:column_type.rindex(")")]
    members, current, quoted, i = [], [], False, 0
    while i < len(inner):
        ch = inner[i]
        if quoted:
            if ch == "'" and inner[i + 1:i + 2] == "'":
                current.append("'")
                i += 1
            elif ch == "'":
                quoted = False
                members.append("".join(current))
                current = []
            else:
                current.append(ch)
        elif ch == "'":
            quoted = True
        i += 1
    return members


class Column:
    """One column of ``information_schema.COLUMNS``: name, DATA_TYPE, COLUMN_TYPE."""

    __slots__ = ("name", "data_type", "column_type", "binary", "json")

    def __init__(self, name: str, data_type: str, column_type: str, binary: bool = False,
                 json: bool = False):
        self.name = name
        self.data_type = data_type.lower()
        self.column_type = column_type.lower()
        self.binary = binary
        self.json = json


# Types whose JSON_ARRAY form (with the casts of :func:`json_expression`) carries the same
# value as the text protocol: ints as JSON numbers, everything else as the server's text.
_JSON_SAFE = _INTEGERS | _TEXTS | frozenset({"decimal", "numeric", "date", "datetime",
                                             "timestamp", "time", "year", "set"})


def json_safe(column: Column) -> bool:
    """Whether ``column`` can be read through the aggregated JSON form of a chunk (see
    :mod:`.snapshot`): not floats (the server's JSON digits are not the text protocol's),
    not binary strings, BIT or geometry (bytes have no JSON form)."""
    return column.data_type in _JSON_SAFE and not (column.binary and
                                                   column.data_type in _TEXTS)


def json_expression(column: Column, quoted: str) -> str:
    """``column`` inside the chunk's ``JSON_ARRAY(...)``: the server's text for all but
    integers (a MariaDB JSON column would be embedded as JSON, its numbers then parsed as
    floats: CAST keeps it a string, mapped as on the binlog path)."""
    if column.data_type in _INTEGERS or column.data_type in ("enum", "set") or (
            column.data_type in _TEXTS and not column.json):
        return quoted
    return f"CAST({quoted} AS CHAR)"


def select_expression(column: Column, quoted: str) -> str:
    """What the chunk's SELECT list reads for ``column`` (``quoted`` is its name in SQL)."""
    if column.data_type == "float":
        return f"CAST({quoted} AS DOUBLE)"
    return quoted


def converter(column: Column) -> Optional[Converter]:
    """The converter from the snapshot connection's value to the event value, None when
    pymysql's value already is it."""
    kind = column.data_type
    if kind in _INTEGERS or kind in ("decimal", "numeric", "date", "time", "enum"):
        return None          # ints from pymysql; DECIMAL/DATE/TIME text is the event text
    if kind in _TEXTS:
        return values.json_text_value if column.json else None
    if kind == "datetime":
        return _datetime
    if kind == "timestamp":
        return _timestamp
    if kind == "float":
        return _float32
    if kind in ("double", "real"):
        return _double
    if kind == "year":
        return _year
    if kind == "bit":
        return _bit
    if kind == "set":
        return _set_converter(_set_members(column.column_type))
    if kind == "binary":
        return values.b64   # SELECT returns all n bytes (the binlog path pads them back)
    if kind in _BLOBS:
        return values.bytes_or_text
    if kind in _GEOMETRY:
        return values.geometry_value
    if kind == "json":      # MySQL's JSON type: text from the server
        return values.json_text_value
    return values.bytes_or_text     # anything unforeseen: never let bytes reach the encoder


class RowMapper:
    """Turns the tuples of one table's chunk SELECT into ``(pk, item)`` pairs (:meth:`rows`)
    or columns of event values (:meth:`columns`)."""

    def __init__(self, columns: Sequence[Column], key_names: Sequence[str]):
        self.names = [c.name for c in columns]
        self.key_names = list(key_names)
        self.key_index = [self.names.index(name) for name in self.key_names]
        self.converters: Tuple[Tuple[int, Converter], ...] = tuple(
            (i, fn) for i, fn in ((i, converter(c)) for i, c in enumerate(columns))
            if fn is not None)
        # a key of one integer column: its values are ints, their text the key itself
        self.int_key = len(self.key_index) == 1 and \
            columns[self.key_index[0]].data_type in _INTEGERS

    def columns(self, raw: Sequence[Sequence[Any]]) -> List[List[Any]]:
        """The chunk's columns of event values: what :meth:`rows` puts in its dicts."""
        columns = [list(column) for column in zip(*raw)]
        for i, fn in self.converters:
            columns[i] = [None if value is None else fn(value) for value in columns[i]]
        return columns

    def rows(self, raw: Sequence[Sequence[Any]]) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
        names, converters = self.names, self.converters
        out = []
        append = out.append
        if len(self.key_index) == 1:        # the common case, without a loop per key
            key_name, key_at = self.key_names[0], self.key_index[0]
            for values_ in raw:
                if converters:
                    values_ = list(values_)
                    for i, fn in converters:
                        value = values_[i]
                        if value is not None:
                            values_[i] = fn(value)
                append(({key_name: values_[key_at]}, dict(zip(names, values_))))
            return out
        pairs = list(zip(self.key_names, self.key_index))
        for values_ in raw:
            if converters:
                values_ = list(values_)
                for i, fn in converters:
                    value = values_[i]
                    if value is not None:
                        values_[i] = fn(value)
            append(({name: values_[i] for name, i in pairs}, dict(zip(names, values_))))
        return out
