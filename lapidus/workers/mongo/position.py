"""Resume tokens as event positions and as checkpoints.

Runs in the mongo worker process.  A change stream's position is its resume token, an opaque
document ``{"_data": "8263..."}`` (the hex string of a KeyString: cluster time, transaction index,
collection and document key).  Two forms leave this module:

* the **position** of an event, a compact string: the token's ``_data`` hex; a token of another
  shape (none since MongoDB 4.2) as its canonical Extended JSON text;
* the **checkpoint**, a JSON value the worker saves once the events up to it are delivered::

      {"position": "8263...", "resume_token": {"_data": "8263..."}, "start_after": false}

  ``position`` is only there for people and ``lapidusctl status`` (it is ignored on load);
  ``resume_token`` is the token in canonical Extended JSON (for every server Lapidus supports,
  simply ``{"_data": "<hex>"}``), so it round-trips exactly.  ``start_after`` is true when the
  stream must be reopened with ``startAfter`` instead of ``resumeAfter``: after an
  ``invalidate`` event, whose token ``resumeAfter`` refuses (the driver follows the same rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import orjson
from bson import json_util

_CANONICAL = json_util.CANONICAL_JSON_OPTIONS


@dataclass(frozen=True)
class ResumePoint:
    """Where to (re)open a change stream."""

    token: Mapping[str, Any]
    start_after: bool = False

    @property
    def position(self) -> str:
        return token_position(self.token)

    def to_checkpoint(self) -> dict:
        return {"position": self.position, "resume_token": token_to_json(self.token),
                "start_after": self.start_after}


def token_position(token: Mapping[str, Any]) -> str:
    """The compact string form of a resume token (its ``_data`` hex string)."""
    data = token.get("_data")
    if isinstance(data, str):
        return data
    return json_util.dumps(token, json_options=_CANONICAL, separators=(",", ":"))


def token_to_json(token: Mapping[str, Any]) -> dict:
    """The token as plain JSON data (canonical Extended JSON: lossless for any BSON in it)."""
    data = token.get("_data")
    if isinstance(data, str) and len(token) == 1:
        return {"_data": data}      # the only shape MongoDB >= 4.2 produces: skip the round trip
    return orjson.loads(json_util.dumps(token, json_options=_CANONICAL))


def token_from_json(value: Mapping[str, Any]) -> dict:
    """Inverse of :func:`token_to_json`."""
    return json_util.loads(orjson.dumps(value), json_options=_CANONICAL)


def parse_checkpoint(checkpoint: Any) -> ResumePoint:
    """The resume point saved in ``checkpoint``; raises ``ValueError`` naming what is wrong.

    A bare token (``{"_data": ...}``) is accepted too, so an operator can write a checkpoint by
    hand from a token printed by mongosh.
    """
    if isinstance(checkpoint, Mapping) and "resume_token" in checkpoint:
        token = checkpoint["resume_token"]
        start_after = checkpoint.get("start_after", False)
        if not isinstance(start_after, bool):
            raise ValueError(f"start_after must be true or false, not {start_after!r}")
    elif isinstance(checkpoint, Mapping) and "_data" in checkpoint:
        token, start_after = checkpoint, False
    else:
        raise ValueError('expected {"resume_token": {"_data": "<hex>"}, "start_after": false}, '
                         f"found {checkpoint!r}")
    if not isinstance(token, Mapping) or "_data" not in token:
        raise ValueError(f'resume_token must be a document with "_data", not {token!r}')
    return ResumePoint(token_from_json(token), start_after)
