"""pgoutput (protocol version 1) decoder: PostgreSQL's built-in logical replication output.

Runs in the PostgreSQL worker process.  ``pg_recvlogical --start -o proto_version=1 -o
publication_names=PUB [-o messages=true]`` writes each binary message followed by one ``\\n``.
The newline is no delimiter (values may contain newlines): every message is parsed by its own
lengths, and the byte after it must be that newline.  Message types of protocol version 1
(PostgreSQL docs, "Logical Replication Message Formats"):

``B`` begin (final = commit LSN, commit time, xid) · ``C`` commit · ``O`` origin · ``R`` relation
(columns, key flags, type OIDs) · ``Y`` type · ``I``/``U``/``D`` row changes · ``T`` truncate of
one or more relations · ``M`` logical message (``messages=true``, PostgreSQL 14+).

Values arrive in PostgreSQL's text output form (``t``), as ``n`` (NULL) or ``u`` (unchanged
TOAST value, not sent): the same text the wal2json path maps, so the same
:class:`~lapidus.workers.postgresql.types.TypeMap` converters apply, without wal2json's loss of
NaN and infinities.  Version 2 (streaming of in-progress transactions) is not requested: the
spool and the commit-LSN ids assume whole, committed transactions (``docs/postgresql.md``).

A relation's description (``R``) is sent once per session before its first change and again
after DDL; changes refer to it by OID.  The worker may resume reading the spool after the ``R``
it needs (kill -9, restart), so ``R`` frames are also kept in a durable
:class:`~lapidus.workers.postgresql.pgoutput_relations.RelationLog` with their spool position.
"""

from __future__ import annotations

import binascii
import struct
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..utctime import utc_seconds_text
from ..snapshot import WATERMARK_PREFIX
from .ddl import DDL_PREFIX, ddl_change, relation_diff
from .decoding import Begin, Change, Commit, RelationChanged, Watermark
from .types import (to_bool, to_float, to_int, to_numeric, to_text, to_timestamp,
                    to_timestamptz)

Position = Tuple[int, int]          # (spool segment, offset of the frame)
BytesConverter = Callable[[bytes], Any]

_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_BEGIN = struct.Struct(">QqI").unpack_from      # final LSN, commit time, xid
_NEWLINE = 0x0A

# Replica identity settings as pgoutput sends them (pg_class.relreplident).
IDENTITY_DEFAULT, IDENTITY_NOTHING, IDENTITY_FULL, IDENTITY_INDEX = "d", "n", "f", "i"

_PG_EPOCH_SECONDS = 946_684_800       # PostgreSQL's epoch, 2000-01-01 UTC, in Unix seconds


class ProtocolError(ValueError):
    """The spool holds bytes pgoutput protocol version 1 does not produce."""


# -- framing --------------------------------------------------------------------------------

def _cstring_end(data: bytes, pos: int) -> int:
    """Index after the NUL ending the string at ``pos``; -1 when not all there yet."""
    end = data.find(b"\0", pos)
    return -1 if end < 0 else end + 1


def _tuple_end(data: bytes, pos: int) -> int:
    """Index after the TupleData at ``pos``; -1 when incomplete."""
    size = len(data)
    if pos + 2 > size:
        return -1
    (ncols,) = _U16(data, pos)
    pos += 2
    for _ in range(ncols):
        if pos >= size:
            return -1
        kind = data[pos]
        pos += 1
        if kind == 116 or kind == 98:            # 't' text, 'b' binary: Int32 length + bytes
            if pos + 4 > size:
                return -1
            pos += 4 + _U32(data, pos)[0]
        elif kind != 110 and kind != 117:        # 'n' NULL, 'u' unchanged TOAST: no data
            raise ProtocolError(f"unknown column kind {kind!r} in tuple data")
    return pos if pos <= size else -1


def _tuple_end_or_size(data: bytes, pos: int) -> int:
    """:func:`_tuple_end` for a row that is skipped: past ``data`` when incomplete."""
    end = _tuple_end(data, pos)
    return len(data) if end < 0 else end


def message_end(data: bytes, pos: int) -> int:
    """Index after the message starting at ``pos`` (before its newline); -1 when incomplete.

    Raises :class:`ProtocolError` on a message type protocol version 1 does not have.
    """
    size = len(data)
    kind = data[pos]
    if kind == 73:                                  # I: relid, 'N', tuple
        return -1 if pos + 6 > size else _tuple_end(data, pos + 6)
    if kind == 85 or kind == 68:                    # U, D: relid, ['K'|'O' tuple], ['N' tuple]
        p = pos + 5
        if p >= size:
            return -1
        if data[p] in (75, 79):                     # 'K', 'O'
            p = _tuple_end(data, p + 1)
            if p < 0:
                return -1
            if kind == 68:
                return p
            if p >= size:
                return -1
        if data[p] != 78:                           # 'N'
            raise ProtocolError(f"expected 'N' in {chr(kind)} message, got {data[p]!r}")
        return _tuple_end(data, p + 1)
    if kind == 66:                                  # B: fixed size
        end = pos + 21
    elif kind == 67:                                # C: flags, commit LSN, end LSN, time
        end = pos + 26
    elif kind == 82:                                # R
        p = _cstring_end(data, pos + 5)
        p = p if p < 0 else _cstring_end(data, p)
        if p < 0 or p + 3 > size:
            return -1
        (ncols,) = _U16(data, p + 1)
        p += 3
        for _ in range(ncols):
            p = _cstring_end(data, p + 1)           # flags, name
            if p < 0:
                return -1
            p += 8                                  # type OID, typmod
        end = p
    elif kind == 89:                                # Y: OID, namespace, name
        p = _cstring_end(data, pos + 5)
        end = p if p < 0 else _cstring_end(data, p)
    elif kind == 84:                                # T: count, options, OIDs
        if pos + 5 > size:
            return -1
        end = pos + 6 + 4 * _U32(data, pos + 1)[0]
    elif kind == 77:                                # M: flags, LSN, prefix, length, content
        p = _cstring_end(data, pos + 10)
        if p < 0 or p + 4 > size:
            return -1
        end = p + 4 + _U32(data, p)[0]
    elif kind == 79:                                # O: origin LSN, name
        end = _cstring_end(data, pos + 9)
    else:
        raise ProtocolError(
            f"unknown pgoutput message type {kind!r} ({chr(kind)!r}); only protocol "
            f"version 1 is requested")
    return end if end <= size else -1


def split_messages(data: bytes) -> Tuple[List[bytes], int]:
    """Complete messages in ``data`` (without their newline) and the bytes they used."""
    frames: List[bytes] = []
    pos, size = 0, len(data)
    while pos < size:
        end = message_end(data, pos)
        if end < 0 or end >= size:          # the message, or its newline, is still to come
            break
        if data[end] != _NEWLINE:
            raise ProtocolError(
                f"pgoutput message {chr(data[pos])!r} of {end - pos} bytes is not followed "
                f"by the newline pg_recvlogical writes; the spool is damaged")
        frames.append(data[pos:end])
        pos = end + 1
    return frames, pos


# -- values ---------------------------------------------------------------------------------

_BOOLS = {b"t": True, b"f": False}


def _decode_bool(raw: bytes) -> bool:
    try:
        return _BOOLS[raw]
    except KeyError:
        return to_bool(raw.decode())


def _timestamp(raw: bytes) -> str:
    # to_timestamp's ISO fast path, inlined: one call per value instead of two.
    value = raw.decode()
    if value[4:5] == "-" and value[-1:] != "C":
        return value.replace(" ", "T")
    return value


def _timestamptz(raw: bytes) -> str:
    value = raw.decode()
    if value[-3:] == "+00" and value[4:5] == "-":
        return value[:-3].replace(" ", "T") + "Z"
    return to_timestamptz(value)


def bytes_converter(convert: Callable[[Any], Any]) -> BytesConverter:
    """A text-form converter made to take the raw UTF-8 bytes of a ``t`` column.

    The frequent ones skip building a ``str`` first (``int()`` and ``float()`` read bytes) or
    a second call (numeric is its text; timestamps' ISO fast paths are inlined).
    """
    if convert is to_int:
        return int
    if convert is to_text or convert is to_numeric:
        return bytes.decode
    if convert is to_float:
        return to_float
    if convert is to_bool:
        return _decode_bool
    if convert is to_timestamptz:
        return _timestamptz
    if convert is to_timestamp:
        return _timestamp
    return lambda raw: convert(raw.decode())


def commit_time(microseconds: int) -> str:
    """pgoutput's commit time (microseconds since 2000-01-01 UTC) as RFC 3339 UTC.

    Written like PostgreSQL prints a timestamptz (and so like the wal2json path): fractional
    digits without trailing zeros, none for a whole second.
    """
    seconds, fraction = divmod(microseconds, 1_000_000)
    text = utc_seconds_text(seconds + _PG_EPOCH_SECONDS)
    if fraction:
        text += "." + f"{fraction:06d}".rstrip("0")
    return text + "Z"


def message_content(raw: bytes) -> str:
    """A logical message's content: its text when it is UTF-8, else bytea hex (``\\xff00``).

    ``pg_logical_emit_message`` also takes bytea, and the event's ``content`` is a string:
    the hex form keeps every byte and is how PostgreSQL itself prints such a value.
    """
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "\\x" + binascii.hexlify(raw).decode("ascii")


# -- relations ------------------------------------------------------------------------------

@dataclass(slots=True)
class Relation:
    """One ``R`` message, with what decoding its changes needs."""

    relid: int
    schema: str
    table: str
    identity: str                       # d default, n nothing, f full, i index
    names: Tuple[str, ...]
    key: Tuple[bool, ...]               # flag 1: part of the replica identity
    type_oids: Tuple[int, ...]
    allowed: bool = True                # passes include/exclude
    converters: Optional[List[BytesConverter]] = None     # resolved on the first change
    pk: Optional[Tuple[str, ...]] = None                  # primary key, resolved likewise
    key_names: Tuple[str, ...] = ()


def parse_relation(frame: bytes) -> Relation:
    """An ``R`` frame to a :class:`Relation` (not yet resolved against the catalog)."""
    (relid,) = _U32(frame, 1)
    p = frame.index(b"\0", 5)
    schema = frame[5:p].decode() or "pg_catalog"     # pgoutput sends "" for pg_catalog
    q = frame.index(b"\0", p + 1)
    table = frame[p + 1:q].decode()
    identity = chr(frame[q + 1])
    (ncols,) = _U16(frame, q + 2)
    p = q + 4
    names, key, oids = [], [], []
    for _ in range(ncols):
        flags = frame[p]
        end = frame.index(b"\0", p + 1)
        names.append(frame[p + 1:end].decode())
        key.append(bool(flags & 1))
        oids.append(_U32(frame, end + 1)[0])
        p = end + 9
    return Relation(relid, schema, table, identity, tuple(names), tuple(key), tuple(oids))


class PgOutputDecoder:
    """Framing and decoding of pgoutput protocol version 1.  See the module docstring.

    ``catalog`` gives ``converter(oid)``; ``relations`` (a
    :class:`~lapidus.workers.postgresql.pgoutput_relations.CatalogRelations`) gives a table's
    primary key and, as a last resort, a relation's description when no ``R`` frame is known;
    ``log`` (a :class:`~lapidus.workers.postgresql.pgoutput_relations.RelationLog`) keeps ``R``
    frames across restarts with the spool position :meth:`decode_run` gives them (a frame
    decoded alone by :meth:`decode` is logged at (0, 0)).  Without ``log`` the cache lives only
    in memory (tests, benchmarks).
    """

    plugin = "pgoutput"

    def __init__(self, catalog, table_filter, publication: str, *, messages: bool = True,
                 server_version: int = 150000, relations=None, log=None,
                 warn: Optional[Callable[..., None]] = None):
        self.catalog = catalog
        self.table_filter = table_filter
        self.publication = publication
        # pgoutput has the messages option from PostgreSQL 14 on (with protocol version 1).
        # Asked for even with messages = false: a backfill may start at any time, and its
        # watermarks are messages; the user's are then dropped here.
        self.messages = server_version >= 140000
        self.user_messages = messages
        self.relations = relations
        self.log = log
        self.warn = warn
        self._relations: Dict[int, Relation] = {}
        self._frames: Dict[int, bytes] = {}       # relid -> the R frame cached
        self.types: Dict[int, Tuple[str, str]] = {}   # Y: type OID -> (schema, name)
        # tables whose DDL the capture announced: their next relation message is no news
        self._ddl_announced: set = set()
        if log is not None:
            for frame in log.frames():
                self._cache_relation(frame)

    def plugin_options(self) -> List[str]:
        opts = ["proto_version=1", f"publication_names={quote_name(self.publication)}"]
        if self.messages:
            opts.append("messages=true")
        return opts

    def split(self, data: bytes) -> Tuple[Sequence[bytes], int]:
        return split_messages(data)

    def decode_run(self, data: bytes, pos: int, limit: int,
                   origin: Position) -> Tuple[List[Tuple[Any, int]], int]:
        """Frame and decode up to ``limit`` complete messages of ``data`` from ``pos``.

        Returns ``[(message, bytes used with the newline)]`` and the position after the last
        one.  ``origin`` is the spool position of ``data[0]`` (the relation log records where
        each ``R`` frame starts).  Row changes, nearly every message, are decoded straight
        from ``data`` in one pass: their lengths are only known by walking the columns, and
        walking them once instead of twice (frame, then decode) saves about a tenth of the
        worker's CPU per event.  Other messages are framed first and decoded from their slice.
        """
        out: List[Tuple[Any, int]] = []
        append = out.append
        size = len(data)
        message: Any          # a Begin, Change, Commit, list of Changes or None
        while pos < size and len(out) < limit:
            kind = data[pos]
            if kind == 73 or kind == 85 or kind == 68:          # I, U, D
                try:
                    message, end = self._decode_row(data, pos, kind)
                except Exception:
                    # A message cut by the end of the read fails somewhere in its columns
                    # (or in a converter given half a value): only a complete one is an error.
                    end = message_end(data, pos)
                    if end < 0 or end >= size:
                        break
                    raise
                if end >= size:                 # the message, or its newline, is to come
                    break
            else:
                end = message_end(data, pos)
                if end < 0 or end >= size:
                    break
                if kind == 82:                                  # R: position for the log
                    message = self._remember_relation(data[pos:end],
                                                      (origin[0], origin[1] + pos))
                else:
                    message = self.decode(data[pos:end])
            if data[end] != _NEWLINE:
                raise ProtocolError(
                    f"pgoutput message {chr(kind)!r} of {end - pos} bytes is not followed "
                    f"by the newline pg_recvlogical writes; the spool is damaged")
            append((message, end + 1 - pos))
            pos = end + 1
        return out, pos

    def _decode_row(self, data: bytes, pos: int, kind: int) -> Tuple[Optional[Change], int]:
        """The I, U or D message at ``pos`` and the position after it.  May raise (or return
        an end past ``data``) when the message is not all there: see :meth:`decode_run`."""
        rel = self._relation(_U32(data, pos + 1)[0])
        if kind == 73:                                          # I: 'N' tuple
            if not rel.allowed:
                return None, _tuple_end_or_size(data, pos + 6)
            item, _, end = self._tuple(data, pos + 6, rel)
            return Change("insert", rel.schema, rel.table, self._pk(rel, item), item, None), end
        if kind == 68:                                          # D: 'K' or 'O' tuple
            if not rel.allowed:
                return None, _tuple_end_or_size(data, pos + 6)
            before, _, end = self._tuple(data, pos + 6, rel, key_only=data[pos + 5] == 75)
            return Change("delete", rel.schema, rel.table, self._pk(rel, before), None,
                          before), end
        return self._update(data, pos, rel)

    # -- decoding -------------------------------------------------------------------------

    def decode(self, frame: bytes):
        kind = frame[0]
        if kind == 73 or kind == 85 or kind == 68:              # I, U, D
            return self._decode_row(frame, 0, kind)[0]
        if kind == 66:                                          # B
            final_lsn, ts, xid = _BEGIN(frame, 1)
            return Begin(final_lsn, str(xid), commit_time(ts))
        if kind == 67:                                          # C
            return Commit(_U64(frame, 2)[0])
        if kind == 82:                                          # R
            return self._remember_relation(frame, (0, 0))
        if kind == 84:                                          # T
            return self._truncate(frame)
        if kind == 77:                                          # M
            return self._message(frame)
        if kind == 89:                                          # Y
            (oid,) = _U32(frame, 1)
            p = frame.index(b"\0", 5)
            self.types[oid] = (frame[5:p].decode(), frame[p + 1:-1].decode())
            return None
        if kind == 79:                                          # O: origin, nothing to emit
            return None
        raise ProtocolError(f"unknown pgoutput message type {chr(kind)!r}")

    def _update(self, data: bytes, start: int, rel: Relation) -> Tuple[Optional[Change], int]:
        """The U message at ``start``: relid, ['K'|'O' tuple], 'N' tuple."""
        pos = start + 5
        if not rel.allowed:
            if data[pos] != 78:
                pos = _tuple_end_or_size(data, pos + 1)
            return None, _tuple_end_or_size(data, pos + 1)
        before = None
        if data[pos] != 78:                 # 'K' (key changed) or 'O' (REPLICA IDENTITY FULL)
            before, _, pos = self._tuple(data, pos + 1, rel, key_only=data[pos] == 75)
        if data[pos] != 78:
            raise ProtocolError(f"expected 'N' in U message, got {data[pos]!r}")
        item, unchanged, end = self._tuple(data, pos + 1, rel)
        if before is None and rel.key_names:
            # The key did not change, so no old tuple: like the wal2json path, take the
            # replica identity columns from the new row.
            before = {name: item.get(name) for name in rel.key_names}
        return Change("update", rel.schema, rel.table, self._pk(rel, item), item, before,
                      unchanged), end

    def _tuple(self, frame: bytes, pos: int, rel: Relation, key_only: bool = False):
        """TupleData at ``pos`` -> (values, unchanged column names or None, end position).

        ``key_only``: a ``K`` tuple, whose columns outside the replica identity are all ``n``
        placeholders: only the identity columns are kept.  This is the hot loop of the
        decoder (once per column value), hence the local names.
        """
        (ncols,) = _U16(frame, pos)
        names = rel.names
        if ncols != len(names):
            raise ProtocolError(
                f"{rel.schema}.{rel.table}: a change has {ncols} columns, its relation "
                f"message {len(names)}")
        converters = rel.converters or self._resolve(rel)
        pos += 2
        values: Dict[str, Any] = {}
        unchanged: Optional[List[str]] = None
        u32 = _U32
        for name, convert in zip(names, converters):
            kind = frame[pos]
            if kind == 116:                                     # t: text
                start = pos + 5
                pos = start + u32(frame, pos + 1)[0]
                values[name] = convert(frame[start:pos])
            elif kind == 110:                                   # n: NULL
                values[name] = None
                pos += 1
            elif kind == 117:                                   # u: unchanged TOAST value
                if unchanged is None:
                    unchanged = []
                unchanged.append(name)
                pos += 1
            else:
                # 'b' only comes with the binary option, which Lapidus never sets.
                raise ProtocolError(f"{rel.schema}.{rel.table}: column kind {kind!r}")
        if key_only:
            values = {name: values[name] for name in rel.key_names if name in values}
        return values, unchanged, pos

    def _pk(self, rel: Relation, row: Optional[dict]) -> Optional[dict]:
        pk = rel.pk
        if not pk:
            return None
        row = row or {}
        if len(pk) == 1:
            name = pk[0]
            return {name: row.get(name)}
        return {name: row.get(name) for name in pk}

    def _truncate(self, frame: bytes):
        """One ``truncate`` change per relation that passes the filter (a list, or None)."""
        (count,) = _U32(frame, 1)
        changes = []
        for i in range(count):
            rel = self._relation(_U32(frame, 6 + 4 * i)[0])
            if rel.allowed:
                changes.append(Change("truncate", rel.schema, rel.table))
        if not changes:
            return None
        return changes[0] if len(changes) == 1 else changes

    def _message(self, frame: bytes) -> Union[Change, Watermark, None]:
        if not self.messages:
            return None
        transactional = bool(frame[1] & 1)
        (lsn,) = _U64(frame, 2)
        p = frame.index(b"\0", 10)
        prefix = frame[10:p].decode()
        (size,) = _U32(frame, p + 1)
        content = message_content(frame[p + 5:p + 5 + size])
        if prefix == WATERMARK_PREFIX:
            return Watermark(content or "")
        if prefix == DDL_PREFIX:
            return self._ddl(content, transactional, lsn)
        if not self.user_messages:
            return None
        return Change("message", prefix=prefix, content=content, transactional=transactional,
                      lsn=lsn)

    # -- the relation cache ---------------------------------------------------------------

    def _ddl(self, content: Optional[str], transactional: bool, lsn: int) -> Optional[Change]:
        """A DDL capture message (:mod:`.ddl`) as a ``schema`` change of its table (None for
        a table left out by include/exclude)."""
        parsed = ddl_change(content)
        if parsed is None:
            return None
        schema, table, item = parsed
        if table is not None:
            if not self.table_filter.allows(schema or "", table):
                return None
            self._ddl_announced.add((schema or "", table))
        return Change("schema", schema, table, None, item, transactional=transactional,
                      lsn=lsn)

    def _remember_relation(self, frame: bytes, position: Position) -> Optional[RelationChanged]:
        """Cache a relation message; the schema change it shows, if it describes a known
        table differently (and the DDL capture did not announce it already)."""
        (relid,) = _U32(frame, 1)
        if self._frames.get(relid) == frame:
            return None     # resent unchanged (every new session resends it)
        if self.log is not None:
            # Durable before any change that needs it can be delivered and checkpointed.
            self.log.append(position, frame)
        old = self._relations.get(relid)
        self._cache_relation(frame)
        new = self._relations[relid]
        if old is None or not new.allowed:
            return None
        if (new.schema, new.table) in self._ddl_announced:
            self._ddl_announced.discard((new.schema, new.table))
            return None
        item = relation_diff(f"{old.schema}.{old.table}", self._columns(old),
                             f"{new.schema}.{new.table}", self._columns(new))
        if item is None:
            return None
        return RelationChanged(relid, new.schema, new.table, item)

    def _columns(self, rel: Relation) -> List[Tuple[str, str]]:
        type_name = getattr(self.catalog, "type_name", None)
        return [(name, type_name(oid) if type_name is not None else str(oid))
                for name, oid in zip(rel.names, rel.type_oids)]

    def _cache_relation(self, frame: bytes) -> None:
        rel = parse_relation(frame)
        rel.allowed = self.table_filter.allows(rel.schema, rel.table)
        self._relations[rel.relid] = rel
        self._frames[rel.relid] = frame

    def _relation(self, relid: int) -> Relation:
        rel = self._relations.get(relid)
        if rel is not None:
            return rel
        # No R message for it in this session, the spool read so far, or the relation log:
        # only possible when the log was lost.  The current catalog is the best description
        # left; the column count is still checked against every change.
        if self.relations is None:
            raise ProtocolError(f"change for relation OID {relid} before its relation message")
        rel = self.relations.describe(relid)
        if rel is None:
            raise ProtocolError(
                f"change for relation OID {relid} before its relation message, and the "
                f"relation no longer exists in the catalog")
        if self.warn:
            self.warn("relation described from the current catalog (no relation message "
                      "known)", relid=relid, table=f"{rel.schema}.{rel.table}")
        rel.allowed = self.table_filter.allows(rel.schema, rel.table)
        self._relations[relid] = rel
        return rel

    def _resolve(self, rel: Relation) -> List[BytesConverter]:
        """Converters and keys for a relation, on its first change after its R message."""
        rel.converters = [bytes_converter(self.catalog.converter(oid)) for oid in rel.type_oids]
        rel.key_names = tuple(n for n, k in zip(rel.names, rel.key) if k)
        if rel.identity == IDENTITY_DEFAULT:
            # The key flags of a default identity are exactly the primary key, as of the
            # change (historic catalog); none when the table has no primary key.
            rel.pk = rel.key_names or None
        else:
            # FULL flags every column, USING INDEX flags that index: the event's pk is the
            # primary key (as on the wal2json path), looked up in the current catalog.
            rel.pk = self.relations.primary_key(rel.relid) if self.relations else None
        return rel.converters


def quote_name(name: str) -> str:
    """A publication name as ``publication_names`` reads it (an SQL identifier list)."""
    if name and all(c.islower() or c.isdigit() or c == "_" for c in name) \
            and not name[0].isdigit():
        return name
    return '"' + name.replace('"', '""') + '"'
