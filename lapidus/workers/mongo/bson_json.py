"""BSON values (as pymongo decodes them) to the JSON values of the event contract.

Runs in the mongo worker process, after fork, once per value of every change: it is on the hot
path, so it is one recursive function with a dict dispatch on ``type(value)``; the values that
are already JSON (str, int, bool, None) are copied without a call.

The mapping (docs/mongodb.md has the table, EVENTS.md the rules):

==========================  ======================================================================
BSON                        JSON
==========================  ======================================================================
document, array             object, array (recursively mapped)
string, boolean, null       the same
int32, int64 (``Int64``)    number (exact: orjson writes 64-bit integers without a float)
double                      number; NaN and the infinities as ``"NaN"``, ``"Infinity"``,
                            ``"-Infinity"`` (JSON has no literal for them)
decimal128                  string with the exact stored digits (``"1.50"``, ``"NaN"``, ``"1E+10"``)
ObjectId                    its 24-digit lower-case hex string
date                        RFC 3339 UTC with milliseconds, ``"2026-11-30T11:33:35.295Z"``;
                            a date outside years 1-9999 as ``{"$date": {"$numberLong": "<ms>"}}``
binary subtype 4 (UUID)     the canonical UUID string ``"0f8fad5b-d9cb-469f-a165-70867728950e"``
other binary                base64 of the payload (the subtype is not kept); subtype 3 (legacy
                            UUID, byte order differs between drivers) is binary like any other
timestamp                   ``{"$timestamp": {"t": <seconds>, "i": <increment>}}``
regular expression          ``{"$regularExpression": {"pattern": "...", "options": "imsx"}}``
JavaScript code             ``{"$code": "..."}`` (with scope: ``"$scope": {...}`` mapped)
DBRef                       ``{"$ref": "...", "$id": <mapped>, "$db": "..."}`` (extra fields kept)
MinKey, MaxKey              ``{"$minKey": 1}``, ``{"$maxKey": 1}``
==========================  ======================================================================

The ``$``-objects are relaxed Extended JSON v2, so consumers can recover the BSON type with any
Extended JSON parser.  The client must decode dates with ``DatetimeConversion.DATETIME_AUTO``
(see :mod:`.settings`), otherwise a date outside Python's range raises inside pymongo before
this module sees it.
"""

from __future__ import annotations

import base64
import datetime as _dt
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any, Callable, Dict

from bson.binary import UUID_SUBTYPE, Binary
from bson.code import Code
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

__all__ = ["to_json", "document_to_json", "format_datetime"]

# Types whose Python value already is the JSON value.  ``bool`` is listed on its own: dispatch is
# on the exact type, so ``True`` is never mistaken for the int 1.
_PASSTHROUGH = frozenset({str, int, bool, type(None)})

_MIN_KEY = {"$minKey": 1}
_MAX_KEY = {"$maxKey": 1}

# Regex flag letters in the order relaxed Extended JSON writes them (alphabetical).
_REGEX_FLAGS = (("i", re.IGNORECASE), ("l", re.LOCALE), ("m", re.MULTILINE),
                ("s", re.DOTALL), ("u", re.UNICODE), ("x", re.VERBOSE))


def to_json(value: Any) -> Any:
    """Map one decoded BSON value to its JSON form (a new object; the input is not changed)."""
    kind = type(value)
    if kind in _PASSTHROUGH:
        return value
    return _CONVERTERS.get(kind, _convert_other)(value)


def document_to_json(doc: Mapping[str, Any]) -> Dict[str, Any]:
    """Map a BSON document; keys keep their order (MongoDB documents are ordered)."""
    out = {}
    for key, value in doc.items():
        kind = type(value)
        out[key] = value if kind in _PASSTHROUGH else _CONVERTERS.get(kind, _convert_other)(value)
    return out


def _array(values) -> list:
    return [v if type(v) in _PASSTHROUGH else _CONVERTERS.get(type(v), _convert_other)(v)
            for v in values]


def _double(value: float) -> Any:
    if math.isfinite(value):
        return value
    if value != value:
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def format_datetime(value: _dt.datetime) -> str:
    """RFC 3339 in UTC with milliseconds and ``Z``: ``2026-11-30T11:33:35.295Z``.

    pymongo hands out naive datetimes that are UTC (``tz_aware=False``); an aware one is
    converted to UTC first.  BSON dates have millisecond precision, so nothing is rounded away.
    """
    if value.tzinfo is not None:
        value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return value.isoformat(timespec="milliseconds") + "Z"


def _datetime_ms(value: DatetimeMS) -> dict:
    # Only dates Python cannot represent arrive as DatetimeMS (DATETIME_AUTO), so there is no
    # RFC 3339 form to give; relaxed Extended JSON uses the millisecond count then too.
    return {"$date": {"$numberLong": str(int(value))}}


def _binary(value: Binary) -> str:
    if value.subtype == UUID_SUBTYPE:
        return str(value.as_uuid())
    return base64.b64encode(value).decode("ascii")


def _bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _timestamp(value: Timestamp) -> dict:
    return {"$timestamp": {"t": value.time, "i": value.inc}}


def _regex(value: Regex) -> dict:
    flags = value.flags
    if isinstance(flags, int):
        options = "".join(letter for letter, bit in _REGEX_FLAGS if flags & bit)
    else:
        options = "".join(sorted(flags))
    pattern = value.pattern
    if isinstance(pattern, bytes):
        pattern = pattern.decode("utf-8")
    return {"$regularExpression": {"pattern": pattern, "options": options}}


def _code(value: Code) -> dict:
    out: Dict[str, Any] = {"$code": str(value)}
    if value.scope is not None:
        out["$scope"] = document_to_json(value.scope)
    return out


def _dbref(value: DBRef) -> dict:
    return document_to_json(value.as_doc())


def _convert_other(value: Any) -> Any:
    """Subclasses and rare types the dispatch table does not list (the slow path)."""
    if isinstance(value, Mapping):
        return document_to_json(value)
    if isinstance(value, (list, tuple)):
        return _array(value)
    # Order matters: Code is a str, Binary is bytes, Int64 and bool are ints.
    if isinstance(value, Code):
        return _code(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _double(float(value))
    if isinstance(value, Binary):
        return _binary(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes(bytes(value))
    if isinstance(value, _dt.datetime):
        return format_datetime(value)
    raise TypeError(
        f"cannot map a BSON value of Python type {type(value).__module__}."
        f"{type(value).__qualname__} to JSON (not a type pymongo decodes BSON into)")


_CONVERTERS: Dict[type, Callable[[Any], Any]] = {
    dict: document_to_json,
    SON: document_to_json,
    list: _array,
    tuple: _array,
    float: _double,
    Int64: int,
    Decimal128: str,
    ObjectId: str,
    _dt.datetime: format_datetime,
    DatetimeMS: _datetime_ms,
    Binary: _binary,
    bytes: _bytes,
    uuid.UUID: str,
    Timestamp: _timestamp,
    Regex: _regex,
    Code: _code,
    DBRef: _dbref,
    MinKey: lambda _value: dict(_MIN_KEY),
    MaxKey: lambda _value: dict(_MAX_KEY),
}
