"""wal2json format-version 2 decoder.

Runs in the PostgreSQL worker process.  One JSON object per line: ``B`` and ``C`` frame a
transaction (``B`` already carries the commit LSN), ``I``/``U``/``D``/``T``/``M`` are changes.

Numbers: wal2json writes numeric, integer and float columns as bare JSON numbers, so the
line is parsed with msgspec and a ``float_hook`` that keeps the literal text: no value ever
passes through a float unless the column is a float.  Known limit of wal2json 2.5: NaN and
infinities of float and numeric columns arrive as JSON ``null`` (indistinguishable from NULL);
the pgoutput decoder does not have that limit.

Unchanged TOASTed columns are simply absent from an update's ``columns``; the catalog tells
which columns the table has, and the missing ones go to the event's ``unchanged`` list.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import msgspec

from .decoding import Begin, Change, Commit, parse_lsn
from .types import to_int, to_text

NUMERIC_OID = 1700
INT_OIDS = frozenset({20, 21, 23, 26})


class Column(msgspec.Struct):
    name: str
    typeoid: int = 0
    value: Any = None


class Message(msgspec.Struct):
    """One wal2json v2 line; msgspec fills only the fields the line has."""

    action: str
    xid: Optional[int] = None
    lsn: Optional[str] = None
    timestamp: Optional[str] = None
    schema: Optional[str] = None
    table: Optional[str] = None
    columns: Optional[List[Column]] = None
    identity: Optional[List[Column]] = None
    pk: Optional[List[Column]] = None
    prefix: Optional[str] = None
    content: Optional[str] = None
    transactional: Optional[bool] = None


def utc_timestamp(text: Optional[str]) -> Optional[str]:
    """wal2json's commit timestamp (``2026-11-30 11:33:35.295384+00``) as RFC 3339 UTC."""
    if not text:
        return None
    if text.endswith("+00"):
        return text[:-3].replace(" ", "T", 1) + "Z"
    from .types import timestamptz_to_utc  # other offsets are rare: the session runs in UTC
    return timestamptz_to_utc(text)


class Wal2JsonDecoder:
    """Frames are lines; values are mapped through the worker's :class:`TypeMap`."""

    plugin = "wal2json"

    def __init__(self, catalog, table_filter, messages: bool = True, warn=None):
        self.catalog = catalog      # converter(oid), columns_of(schema, table)
        self.table_filter = table_filter
        self.messages = messages
        self.warn = warn or (lambda *args, **kwargs: None)
        self._warned_invalid_utf8 = False
        self._json = msgspec.json.Decoder(Message, float_hook=str)
        # oid -> converter, or None where wal2json's value already is the JSON value
        self._converters: Dict[int, Optional[Callable]] = {}

    def plugin_options(self) -> List[str]:
        opts = ["format-version=2", "include-xids=1", "include-timestamp=1", "include-lsn=1",
                "include-pk=1", "include-type-oids=1", "include-typmod=0"]
        if not self.messages:
            opts.append("filter-msg-prefixes=*")
        return opts

    def split(self, data: bytes) -> Tuple[Sequence[bytes], int]:
        end = data.rfind(b"\n")
        if end < 0:
            return (), 0
        return data[:end].split(b"\n"), end + 1

    def decode_run(self, data: bytes, pos: int, limit: int,
                   origin: Tuple[int, int]) -> Tuple[List[Tuple[Any, int]], int]:
        """Up to ``limit`` complete lines of ``data`` from ``pos``, decoded: see
        :meth:`lapidus.workers.postgresql.decoding.Decoder.decode_run`."""
        out: List[Tuple[Any, int]] = []
        while len(out) < limit:
            end = data.find(b"\n", pos)
            if end < 0:
                break
            out.append((self.decode(data[pos:end]), end + 1 - pos))
            pos = end + 1
        return out, pos

    def decode(self, frame: bytes):
        try:
            msg = self._json.decode(frame)
        except msgspec.DecodeError:
            msg = self._json.decode(self._repair(frame))
        action = msg.action
        if action in ("I", "U", "D"):
            if not self.table_filter.allows(msg.schema, msg.table):
                return None
            return self._row(action, msg)
        if action == "B":
            xid = msg.xid
            return Begin(parse_lsn(msg.lsn), None if xid is None else str(xid),
                         utc_timestamp(msg.timestamp))
        if action == "C":
            return Commit(parse_lsn(msg.lsn))
        if action == "T":
            if not self.table_filter.allows(msg.schema, msg.table):
                return None
            return Change("truncate", msg.schema, msg.table)
        if action == "M":
            if not self.messages:
                return None
            return Change("message", prefix=msg.prefix, content=msg.content,
                          transactional=msg.transactional, lsn=parse_lsn(msg.lsn))
        return None

    def _repair(self, frame: bytes) -> bytes:
        """wal2json copies a logical message's bytes verbatim (``'\\xff00'`` arrives as a raw
        0xFF, cut at the NUL), which is not UTF-8.  Such bytes become U+FFFD in the message's
        content: a documented limit of wal2json; pgoutput keeps them (as ``\\x`` hex)."""
        text = frame.decode("utf-8", "replace")
        if not self._warned_invalid_utf8:
            self._warned_invalid_utf8 = True
            self.warn("wal2json sent bytes that are not UTF-8 (a binary logical message?); "
                      "they are replaced by U+FFFD. The pgoutput decoder keeps them exactly.")
        return text.encode("utf-8")

    # -- rows ---------------------------------------------------------------------------

    def _converter(self, oid: int) -> Optional[Callable]:
        conv = self.catalog.converter(oid)
        if oid in INT_OIDS and conv is to_int or conv is to_text:
            conv = None     # msgspec already gave the int / the text: nothing to do per value
        elif oid == NUMERIC_OID:
            # An integral numeric arrives as a JSON integer; its text is exact.
            base = conv
            conv = lambda v, base=base: base(str(v) if type(v) is int else v)  # noqa: E731
        self._converters[oid] = conv
        return conv

    def _values(self, columns: List[Column]) -> dict:
        out = {}
        converters = self._converters
        for col in columns:
            value = col.value
            if value is not None:
                oid = col.typeoid
                conv = converters[oid] if oid in converters else self._converter(oid)
                if conv is not None:
                    value = conv(value)
            out[col.name] = value
        return out

    def _row(self, action: str, msg: Message) -> Change:
        schema, table = msg.schema, msg.table
        key_names = [k.name for k in msg.pk] if msg.pk else ()
        item = before = None
        unchanged = None
        if action != "D":
            item = self._values(msg.columns)
        if action != "I":
            identity = msg.identity
            before = self._values(identity) if identity else None
        if action == "U":
            unchanged = self._unchanged(schema, table, item) or None
        source = item if item is not None else (before or {})
        pk = {name: source.get(name) for name in key_names} if key_names else None
        kind = {"I": "insert", "U": "update", "D": "delete"}[action]
        return Change(kind, schema, table, pk, item, before, unchanged)

    def _unchanged(self, schema: str, table: str, item: dict) -> List[str]:
        """Columns the table has but the update did not carry: unchanged TOAST values."""
        names = self.catalog.columns_of(schema, table)
        if len(names) == len(item):
            return []
        return [n for n in names if n not in item]
