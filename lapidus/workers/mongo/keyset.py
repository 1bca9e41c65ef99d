"""Keyset pagination over ``_id`` in MongoDB's own sort order, and ``_id`` values as JSON.

Runs in the mongo worker process (the snapshot's chunk queries and its checkpoint).

A collection's ``_id`` values may be of several BSON types at once.  ``sort({_id: 1})`` orders
them by type bracket first (MinKey, null, numbers, strings, documents, binary, ObjectId,
booleans, dates, timestamps, regular expressions, code, MaxKey), then by value; but a query
``{_id: {$gt: last}}`` is *type-bracketed*: it only matches values of ``last``'s bracket.
:func:`after` therefore adds the brackets that sort later by ``$type``, so the next chunk
continues exactly where ``sort`` would, across types (both parts can use the ``_id`` index).

The last key of a chunk is saved in the checkpoint, which is JSON: :func:`key_to_json` keeps it
in canonical Extended JSON (``{"$oid": ...}``, ``{"$numberLong": ...}``), lossless for every
BSON type, and :func:`key_from_json` reads it back.  :func:`key_text` is the same form as one
string: the held chunk's key for a document, unique per BSON value (an ObjectId and the string
of its hex digits are two keys, though the events show both as the same string).
:func:`id_text` is the ``_id``'s part of a ``read`` event's id, unique per BSON value too.
"""

from __future__ import annotations

import datetime as _dt
import re
import uuid
from collections.abc import Mapping
from typing import Any, Dict, List, Optional

import orjson
from bson import json_util
from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from ..snapshot.events import pk_text

_CANONICAL = json_util.CANONICAL_JSON_OPTIONS

#: ``$type`` aliases of each bracket, in MongoDB's comparison order (arrays, undefined and
#: regular expressions cannot be an ``_id``; they are listed so every type has its place)
BRACKETS: List[List[str]] = [
    ["minKey"],
    ["undefined", "null"],
    ["int", "long", "double", "decimal"],
    ["symbol", "string"],
    ["object"],
    ["array"],
    ["binData"],
    ["objectId"],
    ["bool"],
    ["date"],
    ["timestamp"],
    ["regex"],
    ["dbPointer"],
    ["javascript"],
    ["javascriptWithScope"],
    ["maxKey"],
]
_INDEX = {alias: i for i, aliases in enumerate(BRACKETS) for alias in aliases}


def bracket(value: Any) -> int:
    """The position of ``value``'s type bracket in MongoDB's order (a decoded BSON value)."""
    # Order matters: bool is an int, Code is a str, Binary is bytes.
    if value is None:
        return _INDEX["null"]
    if isinstance(value, bool):
        return _INDEX["bool"]
    if isinstance(value, (int, float, Int64, Decimal128)):
        return _INDEX["int"]
    if isinstance(value, Code):
        return _INDEX["javascript" if value.scope is None else "javascriptWithScope"]
    if isinstance(value, str):
        return _INDEX["string"]
    if isinstance(value, (Binary, bytes, uuid.UUID)):
        return _INDEX["binData"]
    if isinstance(value, ObjectId):
        return _INDEX["objectId"]
    if isinstance(value, (_dt.datetime, DatetimeMS)):
        return _INDEX["date"]
    if isinstance(value, Timestamp):
        return _INDEX["timestamp"]
    if isinstance(value, (Regex, re.Pattern)):
        return _INDEX["regex"]
    if isinstance(value, MinKey):
        return _INDEX["minKey"]
    if isinstance(value, MaxKey):
        return _INDEX["maxKey"]
    if isinstance(value, (list, tuple)):
        return _INDEX["array"]
    if isinstance(value, Mapping) or hasattr(value, "as_doc"):   # documents, DBRef
        return _INDEX["object"]
    raise TypeError(f"no BSON type bracket for a {type(value).__name__} _id")


def after(last: Any) -> Dict[str, Any]:
    """The filter for ``_id`` values sorting after ``last`` in ``sort({_id: 1})`` order."""
    later = [alias for aliases in BRACKETS[bracket(last) + 1:] for alias in aliases]
    same = {"_id": {"$gt": last}}
    if not later:
        return same
    return {"$or": [same, {"_id": {"$type": later}}]}


def key_to_json(value: Any) -> Any:
    """``value`` as canonical Extended JSON data (what the checkpoint stores)."""
    return orjson.loads(json_util.dumps({"k": value}, json_options=_CANONICAL))["k"]


def key_from_json(data: Any) -> Any:
    """Inverse of :func:`key_to_json`."""
    return json_util.loads(orjson.dumps({"k": data}), json_options=_CANONICAL)["k"]


def key_text(value: Any) -> str:
    """One string per distinct BSON value (canonical Extended JSON)."""
    return json_util.dumps(value, json_options=_CANONICAL)


def id_text(value: Any) -> str:
    """The tail of a ``read`` event's id for the document whose ``_id`` is ``value``: the
    compact JSON array of the value, as other sources' keys (``[2]``, ``["a"]``) for an int or
    a string, and relaxed Extended JSON for every other type (``[{"$oid":"65a5..."}]``).

    The event's ``pk`` shows an ObjectId, a date or a Decimal128 as a string, so an id made
    from ``pk`` would be the same for an ObjectId and the string of its hex digits: two
    documents, one id, and JetStream's dedup would drop one of them.  Numbers of different
    BSON types with one value (int32 5, int64 5, 5.0) cannot be two ``_id`` values of one
    collection: its unique index compares numbers by value."""
    if value.__class__ is int or value.__class__ is str:
        return pk_text((value,))
    return json_util.dumps([value], json_options=json_util.RELAXED_JSON_OPTIONS,
                           separators=(",", ":"))


def parse_filter(text: Optional[str]) -> Optional[dict]:
    """A backfill's ``where``: an Extended JSON document (``{"status": "open"}``,
    ``{"_id": {"$gt": {"$oid": "..."}}}``); raises ``ValueError`` saying what is wrong."""
    if text is None or not text.strip():
        return None
    try:
        value = json_util.loads(text, json_options=json_util.RELAXED_JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"a JSON document (object) is needed, not {type(value).__name__}")
    return dict(value)
