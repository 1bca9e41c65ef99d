"""MySQL/MariaDB GEOMETRY values as (E)WKT text.

Pure functions; runs in the mysql worker process.  The binlog carries a geometry in the
server's internal form: a 4-byte little-endian SRID followed by standard WKB.  Lapidus emits
WKT in the layout MariaDB's ``ST_AsText`` prints (``POLYGON((0 0,10 0,10 10,0 0))``,
``MULTIPOINT(1 1,2 2)``), prefixed with ``SRID=n;`` when the SRID is not 0
(``SRID=4326;POINT(1 2)``, the EWKT convention PostGIS uses).  It is lossless: coordinates
are printed with Python's shortest round-trip ``repr`` (``ST_AsText`` may round the last digit).

A value that is not valid WKB (which the server should never write) is returned as
``None`` by :func:`geometry_text`; the caller falls back to base64 of the raw bytes.
"""

from __future__ import annotations

import math
import struct
from typing import List, Optional, Tuple

_NAMES = {1: "POINT", 2: "LINESTRING", 3: "POLYGON", 4: "MULTIPOINT", 5: "MULTILINESTRING",
          6: "MULTIPOLYGON", 7: "GEOMETRYCOLLECTION"}


class _WkbError(ValueError):
    pass


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0):
        self.data = data
        self.pos = pos

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _WkbError("truncated WKB")
        out = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return out

    def point(self, order: str) -> Tuple[float, float]:
        x, y = self.take(order + "dd")
        return x, y


def _coords(points: List[Tuple[float, float]]) -> str:
    return ",".join(f"{_number(x)} {_number(y)}" for x, y in points)


def _geometry(reader: _Reader) -> Tuple[str, str]:
    """One WKB geometry as (type name, body without the type name)."""
    (byte_order,) = reader.take("B")
    if byte_order not in (0, 1):
        raise _WkbError(f"bad byte order {byte_order}")
    order = "<" if byte_order == 1 else ">"
    (kind,) = reader.take(order + "I")
    name = _NAMES.get(kind)
    if name is None:
        raise _WkbError(f"unknown WKB type {kind}")
    if kind == 1:
        x, y = reader.point(order)
        if math.isnan(x) and math.isnan(y):
            return name, " EMPTY"
        return name, f"({_number(x)} {_number(y)})"
    (count,) = reader.take(order + "I")
    if kind == 2:
        pts = [reader.point(order) for _ in range(count)]
        return name, f"({_coords(pts)})" if pts else " EMPTY"
    if kind == 3:
        rings = []
        for _ in range(count):
            (n,) = reader.take(order + "I")
            rings.append("(" + _coords([reader.point(order) for _ in range(n)]) + ")")
        return name, f"({','.join(rings)})" if rings else " EMPTY"
    parts = [_geometry(reader) for _ in range(count)]
    if not parts:
        return name, " EMPTY"
    if kind == 7:
        return name, "(" + ",".join(n + body for n, body in parts) + ")"
    if kind == 4:     # MULTIPOINT(1 1,2 2), as MariaDB's ST_AsText prints it
        return name, "(" + ",".join(body[1:-1] if body.startswith("(") else "EMPTY"
                                    for _, body in parts) + ")"
    return name, "(" + ",".join(body for _, body in parts) + ")"


def geometry_text(value: bytes) -> Optional[str]:
    """``SRID=n;WKT`` (or plain WKT when the SRID is 0) for an internal-form geometry."""
    if len(value) < 9:
        return None
    srid = int.from_bytes(value[:4], "little")
    try:
        reader = _Reader(value, 4)
        name, body = _geometry(reader)
        if reader.pos != len(value):
            return None
    except (_WkbError, struct.error):
        return None
    text = name + body
    return f"SRID={srid};{text}" if srid else text
