"""MQTT topics for events: ``<prefix>/schema/table/key`` with reversible levels.

Runs in the dispatcher process (once per record); pure and stdlib only, so consumers can
import :func:`decode_level` / :func:`decode_key` to turn a topic back into key values.

Level rules (docs/sinks.md "mqtt"), the same scheme as the NATS subject tokens with MQTT's own
special characters:

* A schema name, table name or key value becomes exactly one topic level.  ``/`` (the level
  separator), ``+`` and ``#`` (the wildcards, which a published topic may not contain), ``%``
  (the escape itself) and control characters (NUL is forbidden in topics) are percent-encoded
  as the upper-case hex of their UTF-8 bytes: ``a/b+c`` -> ``a%2Fb%2Bc``.  Everything else,
  spaces and non-ASCII letters included, stays as it is.
* A composite key is one level per key column, in key order.  ``_`` alone stands for "no key"
  (a table without a primary key, a truncate), so a value that *is* ``_`` is written ``%5F``;
  an empty value is the lone ``%``.
* Records without a table: ``<prefix>/_message/<message prefix>`` for PostgreSQL logical
  messages, ``<prefix>/_<type>/<schema or _>`` for the rest.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Sequence, Tuple

import orjson

from ...events import Record

NO_KEY = "_"
EMPTY = "%"
_UNSAFE = re.compile(r"[/+#%\x00-\x1f\x7f]")
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def _escape(match: "re.Match[str]") -> str:
    return "".join(f"%{b:02X}" for b in match.group(0).encode("utf-8"))


def encode_level(value: str) -> str:
    if not value:
        return EMPTY
    if value == NO_KEY:
        return "%5F"
    return _UNSAFE.sub(_escape, value)


def decode_level(level: str) -> str:
    """The value a level stands for (ValueError for ``_``, which means "no key")."""
    if level == EMPTY:
        return ""
    if level == NO_KEY:
        raise ValueError('"_" stands for "no key", not for a value (see decode_key)')
    data = _ESCAPE.sub(lambda m: "\x00" + m.group(1), level)
    out = bytearray()
    parts = data.split("\x00")
    out += parts[0].encode("utf-8")
    for part in parts[1:]:
        out.append(int(part[:2], 16))
        out += part[2:].encode("utf-8")
    return out.decode("utf-8")


def encode_key(key: Optional[Sequence[str]]) -> str:
    if key is None:
        return NO_KEY
    return "/".join([encode_level(v) for v in key])


def decode_key(levels: Sequence[str]) -> Optional[Tuple[str, ...]]:
    if list(levels) == [NO_KEY]:
        return None
    return tuple(decode_level(level) for level in levels)


def check_prefix(prefix: str) -> Optional[str]:
    """Why ``prefix`` cannot start every topic, or None."""
    if not prefix:
        return 'is empty; give one or more levels ("lapidus", "cdc/shop")'
    if "+" in prefix or "#" in prefix:
        return 'contains a wildcard ("+" or "#"), which a published topic may not contain'
    if prefix.startswith("$"):
        return 'starts with "$", which brokers reserve for their own topics ($SYS)'
    if prefix.startswith("/") or prefix.endswith("/") or "//" in prefix:
        return 'has an empty level (a leading or trailing "/", or "//")'
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in prefix):
        return "contains a control character"
    return None


class TopicBuilder:
    """Records -> topics; caches the ``<prefix>/schema/table/`` part per table."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._heads: Dict[tuple, str] = {}

    def topic(self, record: Record) -> str:
        table = record.table
        if table is None:
            return self._tableless(record)
        head = self._heads.get((record.schema, table))
        if head is None:
            head = self._heads[(record.schema, table)] = (
                f"{self.prefix}/{encode_level(record.schema or '')}/{encode_level(table)}/")
        key = record.key
        if key is not None and len(key) == 1 and key[0].isdigit():
            return head + key[0]          # the usual integer key (the hot path)
        return head + encode_key(key)

    def _tableless(self, record: Record) -> str:
        if record.type == "message":
            prefix = orjson.loads(record.data).get("prefix")
            return f"{self.prefix}/_message/{encode_level(prefix or '')}"
        schema = encode_level(record.schema) if record.schema is not None else NO_KEY
        return f"{self.prefix}/_{encode_level(record.type)}/{schema}"
