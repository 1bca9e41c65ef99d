"""Lapidus's own decoder for the row images of a rows event: bytes in, JSON-ready rows out.

Runs in the mysql worker process.  python-mysql-replication decodes a row one column at a time
through a chain of ``if column.type == ...`` tests and a method call per byte range read, which
costs about 10 us per row of four columns; for a table map this module compiles, once, one small
reader function per column and then decodes a row image with one call per column over the raw
bytes (about 2 us for the same row).  Only the decoding is replaced: the connection, the event
framing, the table map parsing and every other event stay with the library.

A reader returns the value already in its JSON form (docs/types-mysql.md), the same value the
library's decoding followed by :func:`.values.convert_row` gives;
``tests/integration/test_mysql_rowimage.py`` compares the two over rows of every supported type
read from a real server.  A table with a column type this module does not decode (MySQL
binary JSON, pre-5.6 temporal formats) gets no decoder (:func:`compile_table` returns None)
and goes the library's way, as do MySQL's partial JSON updates (see ``ChangeStream._images``).

Row image layout (MySQL ``Rows_log_event``): for each row, a null bitmap with one bit per
column present in the event's columns-present bitmap, then the non-NULL values of the present
columns in column order.  An update event holds pairs of images (before, after), each with
its own present bitmap.
"""

from __future__ import annotations

import codecs
import struct
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import RowsEvent

from . import temporal
from .values import converter_for

# reader(data, offset) -> (value, offset after the value)
Reader = Callable[[bytes, int], Tuple[Any, int]]
# one decoded row image: (values by column name, names of columns the image left out or None)
Image = Tuple[Dict[str, Any], Optional[List[str]]]

_DECIMAL_GROUP_BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)   # bytes for 0..9 leftover digits


class Unsupported(Exception):
    """A column type this decoder leaves to the library."""


def _fixed(fmt: str) -> Reader:
    unpack_from = struct.Struct(fmt).unpack_from
    size = struct.calcsize(fmt)

    def read(data: bytes, pos: int) -> Tuple[Any, int]:
        return unpack_from(data, pos)[0], pos + size
    return read


def _int24(signed: bool) -> Reader:
    def read(data: bytes, pos: int) -> Tuple[int, int]:
        return int.from_bytes(data[pos:pos + 3], "little", signed=signed), pos + 3
    return read


def _length_prefixed(size: int) -> Callable[[bytes, int], Tuple[bytes, int]]:
    """Bytes after a little-endian length of ``size`` bytes (VARCHAR, BLOB, GEOMETRY)."""
    if size == 1:
        def read(data: bytes, pos: int) -> Tuple[bytes, int]:
            end = pos + 1 + data[pos]
            return data[pos + 1:end], end
        return read

    def read_n(data: bytes, pos: int) -> Tuple[bytes, int]:
        start = pos + size
        end = start + int.from_bytes(data[pos:start], "little")
        return data[start:end], end
    return read_n


def _text(column: Any, size: int) -> Reader:
    """A string column: decoded with the column's charset like the library does (strictly;
    a charset Python does not know stays bytes)."""
    raw = _length_prefixed(size)
    name = column.character_set_name
    encoding = RowsEvent.charset_to_encoding(name) if name is not None else "utf-8"
    try:
        codecs.lookup(encoding)
    except LookupError:
        return raw

    def read(data: bytes, pos: int) -> Tuple[str, int]:
        value, end = raw(data, pos)
        return value.decode(encoding), end
    return read


def _decimal(precision: int, scale: int) -> Reader:
    """DECIMAL(p, s) as its exact text (``format(Decimal, "f")`` of the stored digits).

    Binary form: groups of 9 digits in 4 big-endian bytes, the leftover leading integer and
    trailing fraction digits in 1-4 bytes; the sign bit is the top bit of the first byte,
    inverted, and a negative number has every byte inverted.
    """
    int_groups, int_left = divmod(precision - scale, 9)
    frac_groups, frac_left = divmod(scale, 9)
    int_left_bytes = _DECIMAL_GROUP_BYTES[int_left]
    frac_left_bytes = _DECIMAL_GROUP_BYTES[frac_left]
    size = int_left_bytes + 4 * (int_groups + frac_groups) + frac_left_bytes
    all_ones = (1 << (8 * size)) - 1
    sign_bit = 1 << (8 * size - 1)

    def read(data: bytes, pos: int) -> Tuple[str, int]:
        number = int.from_bytes(data[pos:pos + size], "big")
        negative = not number & sign_bit
        number ^= sign_bit
        if negative:
            number ^= all_ones
        raw = number.to_bytes(size, "big")
        offset = int_left_bytes
        whole = int.from_bytes(raw[:offset], "big")
        for _ in range(int_groups):
            whole = whole * 1_000_000_000 + int.from_bytes(raw[offset:offset + 4], "big")
            offset += 4
        text = ("-" if negative else "") + str(whole)
        if scale:
            digits = []
            for _ in range(frac_groups):
                digits.append(f"{int.from_bytes(raw[offset:offset + 4], 'big'):09d}")
                offset += 4
            if frac_left:
                digits.append(f"{int.from_bytes(raw[offset:], 'big'):0{frac_left}d}")
            text += "." + "".join(digits)
        return text, pos + size
    return read


def _temporal(size: int, to_text: Callable[[bytes, int], str], fsp: int) -> Reader:
    def read(data: bytes, pos: int) -> Tuple[str, int]:
        end = pos + size
        return to_text(data[pos:end], fsp), end
    return read


def _date(data: bytes, pos: int) -> Tuple[str, int]:
    return temporal.date_text(int.from_bytes(data[pos:pos + 3], "little")), pos + 3


def _enum(values: Sequence[str], size: int) -> Reader:
    def read(data: bytes, pos: int) -> Tuple[Any, int]:
        end = pos + size
        return values[int.from_bytes(data[pos:end], "little")], end
    return read


def _set(members: Sequence[str], size: int) -> Reader:
    """SET: the members in definition order (an empty set is ``[]``)."""
    bits = tuple((1 << i, m) for i, m in enumerate(members))

    def read(data: bytes, pos: int) -> Tuple[List[str], int]:
        end = pos + size
        mask = int.from_bytes(data[pos:end], "little")
        return [m for bit, m in bits if mask & bit], end
    return read


def _bit(size: int) -> Reader:
    def read(data: bytes, pos: int) -> Tuple[int, int]:
        end = pos + size
        return int.from_bytes(data[pos:end], "big"), end
    return read


def _raw_reader(column: Any) -> Reader:
    """The reader of one column's value as the library (with Lapidus's exact temporal and BIT
    decoding, reader.py) returns it, before the converter of values.py."""
    kind = column.type
    unsigned = bool(column.unsigned)
    if kind == FIELD_TYPE.TINY:
        return _fixed("<B" if unsigned else "<b")
    if kind == FIELD_TYPE.SHORT:
        return _fixed("<H" if unsigned else "<h")
    if kind == FIELD_TYPE.INT24:
        return _int24(not unsigned)
    if kind == FIELD_TYPE.LONG:
        return _fixed("<I" if unsigned else "<i")
    if kind == FIELD_TYPE.LONGLONG:
        return _fixed("<Q" if unsigned else "<q")
    if kind == FIELD_TYPE.FLOAT:
        return _fixed("<f")
    if kind == FIELD_TYPE.DOUBLE:
        return _fixed("<d")
    if kind in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING, FIELD_TYPE.VAR_STRING):
        return _text(column, 2 if column.max_length > 255 else 1)
    if kind == FIELD_TYPE.BLOB:
        return _text(column, column.length_size)
    if kind == FIELD_TYPE.GEOMETRY:
        return _length_prefixed(column.length_size)
    if kind == FIELD_TYPE.DATE:
        return _date
    if kind == FIELD_TYPE.DATETIME2:
        return _temporal(5 + temporal.fraction_bytes(column.fsp), temporal.datetime2_text,
                         column.fsp)
    if kind == FIELD_TYPE.TIME2:
        return _temporal(3 + temporal.fraction_bytes(column.fsp), temporal.time2_text,
                         column.fsp)
    if kind == FIELD_TYPE.TIMESTAMP2:
        return _temporal(4 + temporal.fraction_bytes(column.fsp), temporal.timestamp2_text,
                         column.fsp)
    if kind == FIELD_TYPE.BIT:
        return _bit(column.bytes)
    raise Unsupported(kind)


def column_reader(column: Any, is_json_text: bool = False) -> Reader:
    """The reader of one column's JSON value.  Raises :class:`Unsupported` for a column
    type left to the library."""
    kind = column.type
    if kind == FIELD_TYPE.NEWDECIMAL:
        return _decimal(column.precision, column.decimals)
    if kind == FIELD_TYPE.ENUM:
        if not column.enum_values:
            raise Unsupported(kind)
        return _enum(column.enum_values, column.size)
    if kind == FIELD_TYPE.SET:
        if not column.set_values:
            raise Unsupported(kind)
        return _set(column.set_values, column.size)
    if kind == FIELD_TYPE.YEAR:
        read_byte = _fixed("<B")

        def read_year(data: bytes, pos: int) -> Tuple[int, int]:
            value, end = read_byte(data, pos)     # years since 1900; 0 is the year 0000
            return (value + 1900 if value else 0), end
        return read_year
    raw = _raw_reader(column)
    convert = converter_for(column, is_json_text)
    if convert is None:
        return raw

    def read_converted(data: bytes, pos: int) -> Tuple[Any, int]:
        value, end = raw(data, pos)
        return convert(value), end
    return read_converted


class TableDecoder:
    """Row images of one table map (its columns as the library parsed them)."""

    __slots__ = ("names", "readers", "_layouts")

    def __init__(self, names: Tuple[str, ...], readers: Tuple[Reader, ...]):
        self.names = names
        self.readers = readers
        # present bitmap -> (null bitmap bytes, (name, reader) of present columns, left out)
        self._layouts: Dict[bytes, tuple] = {}

    def _layout(self, present: bytes) -> tuple:
        layout = self._layouts.get(present)
        if layout is None:
            bits = int.from_bytes(present, "little")
            columns, left_out = [], []
            for i, (name, reader) in enumerate(zip(self.names, self.readers)):
                if bits >> i & 1:
                    columns.append((name, reader))
                else:
                    left_out.append(name)
            layout = ((len(columns) + 7) // 8, tuple(columns),
                      tuple(left_out) if left_out else None)
            self._layouts[present] = layout
        return layout

    def image(self, data: bytes, pos: int, present: bytes) -> Tuple[Image, int]:
        """One row image at ``pos``; returns it and the offset after it."""
        null_bytes, columns, left_out = self._layout(present)
        end = pos + null_bytes
        nulls = int.from_bytes(data[pos:end], "little")
        pos = end
        values: Dict[str, Any] = {}
        if not nulls:
            for name, read in columns:
                values[name], pos = read(data, pos)
        else:
            bit = 1
            for name, read in columns:
                if nulls & bit:
                    values[name] = None
                else:
                    values[name], pos = read(data, pos)
                bit <<= 1
        return (values, list(left_out) if left_out else None), pos

    def images(self, data: bytes, present: bytes) -> List[Image]:
        """Every row image of a write or delete event's row data."""
        out = []
        pos, end = 0, len(data)
        image = self.image
        while pos < end:
            row, pos = image(data, pos, present)
            out.append(row)
        _check_end(pos, end)
        return out

    def image_pairs(self, data: bytes, before: bytes, after: bytes) -> List[Tuple[Image, Image]]:
        """Every (before, after) pair of an update event's row data."""
        out = []
        pos, end = 0, len(data)
        image = self.image
        while pos < end:
            old, pos = image(data, pos, before)
            new, pos = image(data, pos, after)
            out.append((old, new))
        _check_end(pos, end)
        return out


def _check_end(pos: int, end: int) -> None:
    """Slicing past the end of the data gives short values, not an error: a row image that
    does not end where the event's data ends means the table map does not describe it."""
    if pos != end:
        raise ValueError(f"a rows event's row images take {pos} bytes but the event holds "
                         f"{end}: its table map does not describe them")


def compile_table(columns: Sequence[Any], json_columns=frozenset()) -> Optional[TableDecoder]:
    """A decoder for a table map's columns, or None when a column type is left to the library
    (or a column lacks the metadata its reader needs, which the library's parsing of a real
    table map always sets)."""
    try:
        readers = tuple(column_reader(c, c.name in json_columns) for c in columns)
    except (Unsupported, AttributeError):
        return None
    return TableDecoder(tuple(c.name for c in columns), readers)
