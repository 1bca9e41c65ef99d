"""Exact text for MySQL/MariaDB temporal values, decoded from their binlog bytes.

Pure functions (no I/O); runs in the mysql worker process, called by the row decoder in
:mod:`.reader` for every DATE, DATETIME(n), TIME(n) and TIMESTAMP(n) value.

Why not python-mysql-replication's own decoding (measured on MariaDB 10.11, library 1.0.17):

* TIME(n) with a negative value and a fraction comes out wrong: ``-01:00:00.000001`` arrives as
  ``-00:59:59.999999`` and ``-12:34:56.1`` as ``-12:34:56.9`` (it negates the integer part
  and adds the fraction separately; the server stores one signed packed number).
* zero and partly-zero dates (``0000-00-00``, ``2026-00-15``, accepted by MariaDB's default
  sql_mode) arrive as ``None``, indistinguishable from NULL.
* a zero TIMESTAMP arrives as 1970-01-01 00:00:00.

Text forms (documented in docs/types-mysql.md): DATE ``2026-11-30``; DATETIME(6)
``2026-11-30T11:33:35.295384`` (always as many fraction digits as the column declares, like the
server prints them); TIMESTAMP(6) the same in UTC with ``Z``; TIME(6) ``-838:59:59.000000``.
Zero and partly-zero dates keep their digits (``0000-00-00``, ``2026-00-15T10:00:00.5``).
"""

from __future__ import annotations

import datetime as _dt

from ..utctime import utc_seconds_text

EPOCH = _dt.datetime(1970, 1, 1)

# Offsets the server adds so that the big-endian bytes sort like the values (sql/my_time.c).
_TIMEF_OFS = 0x800000000000
_TIMEF_INT_OFS = 0x800000
_DATETIMEF_INT_OFS = 0x8000000000


def fraction_bytes(fsp: int) -> int:
    """How many bytes the fractional part of a TIME/DATETIME/TIMESTAMP(fsp) takes."""
    return (fsp + 1) // 2


def _fraction_text(microseconds: int, fsp: int) -> str:
    if not fsp:
        return ""
    return "." + f"{microseconds:06d}"[:fsp]


def date_text(packed: int) -> str:
    """DATE from its 3-byte little-endian integer: ``day | month << 5 | year << 9``."""
    return f"{packed >> 9:04d}-{(packed >> 5) & 15:02d}-{packed & 31:02d}"


def _signed_be(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _fraction_from(frac: bytes, fsp: int) -> int:
    """The fraction stored after DATETIME2/TIMESTAMP2's integer part, in microseconds."""
    if fsp in (1, 2):
        return _signed_be(frac) * 10000
    if fsp in (3, 4):
        return _signed_be(frac) * 100
    if fsp in (5, 6):
        return _signed_be(frac)
    return 0


def datetime2_text(data: bytes, fsp: int) -> str:
    """DATETIME(fsp) in the 5.6+ binlog format (5 bytes plus the fraction bytes).

    The integer part is ``ymd << 17 | hms`` with ``ymd = (year * 13 + month) << 5 | day``
    and ``hms = hour << 12 | minute << 6 | second``.  No validation: a zero or partly-zero
    date keeps its zeros.
    """
    intpart = int.from_bytes(data[:5], "big") - _DATETIMEF_INT_OFS
    micro = _fraction_from(data[5:], fsp)
    if intpart < 0:  # never written by a server for DATETIME; keep the magnitude readable
        intpart = -intpart
    ymd = intpart >> 17
    hms = intpart & ((1 << 17) - 1)
    year_month = ymd >> 5
    return (f"{year_month // 13:04d}-{year_month % 13:02d}-{ymd & 31:02d}"
            f"T{hms >> 12:02d}:{(hms >> 6) & 63:02d}:{hms & 63:02d}"
            + _fraction_text(micro, fsp))


def time2_text(data: bytes, fsp: int) -> str:
    """TIME(fsp) in the 5.6+ binlog format: one signed packed number, as the server reads it.

    Mirrors ``my_time_packed_from_binary`` + ``TIME_from_longlong_time_packed``: the packed
    value is ``(intpart << 24) + microseconds``; a negative value with a fraction borrows one
    second from the integer part.  Hours may exceed 24 (up to 838).
    """
    if fsp in (5, 6):
        packed = int.from_bytes(data[:6], "big") - _TIMEF_OFS
    else:
        intpart = int.from_bytes(data[:3], "big") - _TIMEF_INT_OFS
        frac = 0
        if fsp in (1, 2):
            frac = data[3]
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x100
            frac *= 10000
        elif fsp in (3, 4):
            frac = int.from_bytes(data[3:5], "big")
            if intpart < 0 and frac:
                intpart += 1
                frac -= 0x10000
            frac *= 100
        packed = (intpart << 24) + frac
    sign = ""
    if packed < 0:
        sign = "-"
        packed = -packed
    hms = packed >> 24
    micro = packed & 0xFFFFFF
    return (f"{sign}{(hms >> 12) % 1024:02d}:{(hms >> 6) % 64:02d}:{hms % 64:02d}"
            + _fraction_text(micro, fsp))


def timestamp2_text(data: bytes, fsp: int) -> str:
    """TIMESTAMP(fsp): 4-byte big-endian seconds since the epoch plus the fraction, as UTC.

    Seconds 0 is the zero TIMESTAMP (the smallest real value is 1970-01-01 00:00:01 UTC).
    """
    seconds = int.from_bytes(data[:4], "big")
    micro = _fraction_from(data[4:], fsp)
    if seconds == 0 and micro == 0:
        return "0000-00-00T00:00:00" + _fraction_text(0, fsp) + "Z"
    return utc_seconds_text(seconds) + _fraction_text(micro, fsp) + "Z"



def timedelta_text(value: _dt.timedelta, fsp: int = 0) -> str:
    """A TIME held as a timedelta (old-format TIME columns, JSON opaque times) as server text."""
    total = value.days * 86400_000000 + value.seconds * 1000000 + value.microseconds
    sign = "-" if total < 0 else ""
    total = abs(total)
    seconds, micro = divmod(total, 1000000)
    hours, rest = divmod(seconds, 3600)
    return f"{sign}{hours:02d}:{rest // 60:02d}:{rest % 60:02d}" + _fraction_text(micro, fsp)
