"""The binlog event reader: python-mysql-replication's parser, Lapidus's own read loop.

Runs in the mysql worker process, after fork.

:class:`BinlogReader` keeps the library's connection set-up (checksum negotiation, heartbeat
period, replica registration, MariaDB/MySQL GTID dump) and its event parser, and replaces
``fetchone`` with a loop that

* never reconnects: the library's reconnect replays from the original start position and
  duplicates; a lost stream raises instead, and the worker restarts from its checkpoint;
* treats the end of the stream as an error instead of silently reconnecting on the next call;
* applies the backend's table scope on the table map, before any row is decoded (rows of a
  table whose map is not kept are skipped by the library without reading a column);
* decodes temporal and BIT columns exactly (:class:`_ExactRows`);
* parses each distinct table map once: the binlog repeats a table's map before every
  transaction's rows, and the library's parsing of it (with the optional metadata) cost about
  half of the reading of a one-row transaction; identical bytes give the same map, so the
  parsed event is kept and handed out again (:class:`TableMapCache`);
* gives the raw row data of a rows event to Lapidus's own decoder (:func:`row_data`,
  :mod:`.rowimage`).

It reaches into the library's private attributes (``_BinLogStreamReader__...``); they are
checked at construction so that another library version fails loudly, not subtly.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from pymysql.protocol import MysqlPacket
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import BINLOG
from pymysqlreplication.event import (
    FormatDescriptionEvent, HeartbeatLogEvent, MariadbGtidEvent, GtidEvent, QueryEvent,
    RotateEvent, XidEvent,
)
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (
    DeleteRowsEvent, PartialUpdateRowsEvent, RowsEvent, TableMapEvent, UpdateRowsEvent,
    WriteRowsEvent,
)

from . import temporal
from .connection import WatchedConnection
from .scope import Scope
from .settings import MysqlSettings


class StreamEnded(Exception):
    """The server ended the binlog stream (EOF packet)."""


# Binlog event header inside a replication packet: OK byte, timestamp (4), type (1),
# server id (4), event size (4), next position (4), flags (2); the body follows.
_TYPE_OFFSET = 5
_NEXT_POSITION = slice(14, 18)
_BODY_OFFSET = 20
_CHECKSUM_BYTES = 4


def _timestamp(data: bytes) -> int:
    return int.from_bytes(data[1:5], "little")


def _mariadb_gtid(data: bytes) -> MariadbGtidEvent:
    """A MariaDB GTID event (its body: sequence number (8), domain id (4), flags (1)) with
    the attributes the library's parser gives it."""
    event = MariadbGtidEvent.__new__(MariadbGtidEvent)
    event.timestamp = _timestamp(data)
    event.server_id = int.from_bytes(data[6:10], "little")
    event.gtid_seq_no = int.from_bytes(data[_BODY_OFFSET:_BODY_OFFSET + 8], "little")
    event.domain_id = int.from_bytes(data[_BODY_OFFSET + 8:_BODY_OFFSET + 12], "little")
    event.flags = data[_BODY_OFFSET + 12]
    event.gtid = f"{event.domain_id}-{event.server_id}-{event.gtid_seq_no}"
    return event


def _xid(data: bytes) -> XidEvent:
    """A transaction's COMMIT (its body: the XA transaction id (8))."""
    event = XidEvent.__new__(XidEvent)
    event.timestamp = _timestamp(data)
    event.xid = int.from_bytes(data[_BODY_OFFSET:_BODY_OFFSET + 8], "little")
    return event


#: event type -> parser of events whose fields are read straight from the packet's bytes
_HEADER_ONLY_EVENTS = {BINLOG.MARIADB_GTID_EVENT: _mariadb_gtid, BINLOG.XID_EVENT: _xid}


class TableMapCache:
    """Parsed table map events by their body bytes (table id, names, column types and
    metadata): the same bytes always parse to the same map.  Bounded; cleared when full."""

    LIMIT = 4096

    def __init__(self):
        self._maps: Dict[bytes, Tuple[TableMapEvent, bool]] = {}

    def get(self, body: bytes) -> Optional[Tuple[TableMapEvent, bool]]:
        """``(event, in scope)`` for a map seen before, else None."""
        return self._maps.get(body)

    def put(self, body: bytes, event: TableMapEvent, in_scope: bool) -> None:
        if len(self._maps) >= self.LIMIT:
            self._maps.clear()
        self._maps[body] = (event, in_scope)


def row_data(event: RowsEvent) -> Optional[bytes]:
    """The undecoded row images of a rows event whose header the library has read, or None
    when they cannot be taken whole (the library's decoding is then the way)."""
    raw = getattr(event, "raw_rows", None)
    if raw is not None:
        return raw
    wrapper = getattr(event, "packet", None)
    if wrapper is None:
        return None
    # Bytes the library pushed back (it does for DECIMAL signs) would be missed: then, or if
    # a library version has no such buffer, leave the decoding to the library.
    if not event.complete or getattr(wrapper, "_BinLogPacketWrapper__data_buffer", b"?"):
        return None
    packet = wrapper.packet
    start = packet._position
    return packet._data[start:start + event.event_size - wrapper.read_bytes]


class _ExactRows:
    """Row-event mixin: exact text for temporal columns, integers for BIT.

    Overrides private readers of ``RowsEvent`` (name-mangled ``_RowsEvent__...``); the
    rest of the library's column decoding is untouched.
    """

    def _RowsEvent__read_date(self):
        return temporal.date_text(self.packet.read_uint24())

    def _RowsEvent__read_datetime2(self, column):
        return temporal.datetime2_text(
            self.packet.read(5 + temporal.fraction_bytes(column.fsp)), column.fsp)

    def _RowsEvent__read_time2(self, column):
        return temporal.time2_text(
            self.packet.read(3 + temporal.fraction_bytes(column.fsp)), column.fsp)

    def _RowsEvent__add_fsp_to_time(self, time, column):
        # Only TIMESTAMP2 still reaches this (DATETIME2 is read above): ``time`` is the
        # library's utcfromtimestamp() of the 4 seconds bytes it has just read.
        seconds = int((time - temporal.EPOCH).total_seconds())
        frac = self.packet.read(temporal.fraction_bytes(column.fsp))
        return temporal.timestamp2_text(seconds.to_bytes(4, "big") + frac, column.fsp)

    def _RowsEvent__read_bit(self, column):
        return int.from_bytes(self.packet.read(column.bytes), "big")


class ExactWriteRows(_ExactRows, WriteRowsEvent):
    pass


class ExactUpdateRows(_ExactRows, UpdateRowsEvent):
    pass


class ExactDeleteRows(_ExactRows, DeleteRowsEvent):
    pass


class ExactPartialUpdateRows(_ExactRows, PartialUpdateRowsEvent):
    pass


class _LeanRows:
    """A rows event whose header Lapidus read from the packet's bytes (:func:`lean_rows`),
    its row images left undecoded for Lapidus's own decoder (``raw_rows``).  Where that
    decoder does not serve the table, :attr:`rows` parses the packet with the library, as
    every rows event was before."""

    raw_rows: bytes

    @property
    def rows(self):
        return self._parse_with_library().rows


class LeanWriteRows(_LeanRows, ExactWriteRows):
    pass


class LeanUpdateRows(_LeanRows, ExactUpdateRows):
    pass


class LeanDeleteRows(_LeanRows, ExactDeleteRows):
    pass


#: rows event type -> (lean class, its post-header length, whether an extra-data block follows)
_LEAN_ROWS = {
    BINLOG.WRITE_ROWS_EVENT_V1: (LeanWriteRows, 8, False),
    BINLOG.UPDATE_ROWS_EVENT_V1: (LeanUpdateRows, 8, False),
    BINLOG.DELETE_ROWS_EVENT_V1: (LeanDeleteRows, 8, False),
    BINLOG.WRITE_ROWS_EVENT_V2: (LeanWriteRows, 10, True),
    BINLOG.UPDATE_ROWS_EVENT_V2: (LeanUpdateRows, 10, True),
    BINLOG.DELETE_ROWS_EVENT_V2: (LeanDeleteRows, 10, True),
}


def lean_rows(data: bytes, table, checksum: bool, post_header_lengths) -> Optional[RowsEvent]:
    """The rows event in ``data`` (a replication packet) of ``table`` (the library's Table
    of its table map), read as the library reads its header: table id, flags, the extra data
    of a version 2 event, the column count and the present-columns bitmap(s).  None when its
    post-header is not the one known here (the library then reads it)."""
    kind = data[_TYPE_OFFSET]
    cls, known, extra = _LEAN_ROWS[kind]
    if post_header_lengths and len(post_header_lengths) >= kind \
            and post_header_lengths[kind - 1] != known:
        return None
    event = cls.__new__(cls)
    event.event_type = kind
    event.timestamp = _timestamp(data)
    event.table_id = int.from_bytes(data[_BODY_OFFSET:_BODY_OFFSET + 6], "little")
    pos = _BODY_OFFSET + 6
    event.flags = int.from_bytes(data[pos:pos + 2], "little")
    pos += 2
    if extra:
        pos += int.from_bytes(data[pos:pos + 2], "little")    # the length counts itself
    count = data[pos]
    if count < 251:
        pos += 1
    elif count == 252:
        count, pos = int.from_bytes(data[pos + 1:pos + 3], "little"), pos + 3
    elif count == 253:
        count, pos = int.from_bytes(data[pos + 1:pos + 4], "little"), pos + 4
    else:
        return None
    event.number_of_columns = count
    width = (count + 7) // 8
    event.columns_present_bitmap = data[pos:pos + width]
    pos += width
    if cls is LeanUpdateRows:
        event.columns_present_bitmap2 = data[pos:pos + width]
        pos += width
    event.raw_rows = data[pos:len(data) - _CHECKSUM_BYTES if checksum else len(data)]
    event.schema, event.table, event.columns = table.schema, table.table, table.columns
    event.complete = True
    return event


_ROW_CLASSES = {
    BINLOG.WRITE_ROWS_EVENT_V1: ExactWriteRows, BINLOG.WRITE_ROWS_EVENT_V2: ExactWriteRows,
    BINLOG.UPDATE_ROWS_EVENT_V1: ExactUpdateRows, BINLOG.UPDATE_ROWS_EVENT_V2: ExactUpdateRows,
    BINLOG.DELETE_ROWS_EVENT_V1: ExactDeleteRows, BINLOG.DELETE_ROWS_EVENT_V2: ExactDeleteRows,
    BINLOG.PARTIAL_UPDATE_ROWS_EVENT: ExactPartialUpdateRows,
}


class _PacketWrapper(BinLogPacketWrapper):
    """The library's packet parser with the exact row classes in its event map."""

    _BinLogPacketWrapper__event_map = {
        **BinLogPacketWrapper._BinLogPacketWrapper__event_map, **_ROW_CLASSES}


# What the read loop hands out; everything else is consumed inside.
EVENTS = frozenset({
    MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent, RotateEvent, TableMapEvent,
    HeartbeatLogEvent, FormatDescriptionEvent,
    ExactWriteRows, ExactUpdateRows, ExactDeleteRows, ExactPartialUpdateRows,
})

# The library internals this module relies on, checked once per reader: if a new library
# version renamed one, the exact decoders would silently stop applying.
_LIBRARY_PRIVATE = (
    (BinLogStreamReader, ("_BinLogStreamReader__connect_to_stream",
                          "_BinLogStreamReader__connect_to_ctl")),
    (BinLogPacketWrapper, ("_BinLogPacketWrapper__event_map",)),
    (RowsEvent, ("_RowsEvent__read_date", "_RowsEvent__read_datetime2",
                 "_RowsEvent__read_time2", "_RowsEvent__add_fsp_to_time",
                 "_RowsEvent__read_bit")),
)
_READER_PRIVATE = ("_BinLogStreamReader__connected_stream", "_BinLogStreamReader__connected_ctl",
                   "_BinLogStreamReader__use_checksum", "_BinLogStreamReader__optional_meta_data",
                   "_BinLogStreamReader__post_header_lengths",
                   "_BinLogStreamReader__only_schemas")


class BinlogReader(BinLogStreamReader):
    """One binlog stream from a given start, read with :meth:`fetchone`.

    ``gtid`` (MariaDB position or MySQL executed set) starts the stream after those
    transactions; without it, ``log_file``/``log_pos`` (MySQL without GTIDs).
    """

    def __init__(self, settings: MysqlSettings, *, mariadb: bool, gtid: Optional[str],
                 log_file: Optional[str], log_pos: Optional[int], scope: Scope):
        self.scope = scope
        self._settings = settings
        super().__init__(
            connection_settings=settings.connection_kwargs(
                read_timeout=settings.dead_after, dead_after=settings.dead_after),
            server_id=settings.server_id,
            blocking=True,
            resume_stream=True,
            log_file=log_file,
            log_pos=log_pos,
            # MariaDB: an empty position means "from the first binlog"; that is only used on
            # a server that had never written a GTID, so nothing is replayed.
            auto_position=gtid,
            only_schemas=list(scope.static_schemas) if scope.static_schemas else None,
            only_events=list(EVENTS),
            is_mariadb=mariadb,
            report_slave=settings.report_host,
            slave_heartbeat=settings.heartbeat_seconds,
            pymysql_wrapper=WatchedConnection,
            enable_logging=False,
        )
        missing = [name for owner, names in _LIBRARY_PRIVATE for name in names
                   if not hasattr(owner, name)]
        missing += [name for name in _READER_PRIVATE if not hasattr(self, name)]
        if missing:
            raise RuntimeError(
                "this python-mysql-replication version is not supported by lapidus (missing "
                f"{', '.join(missing)}); install mysql-replication==1.0.17")
        self._allowed = EVENTS
        self._table_maps = TableMapCache()

    @property
    def stream(self) -> Optional[WatchedConnection]:
        if getattr(self, "_BinLogStreamReader__connected_stream", False):
            return self._stream_connection
        return None

    def set_deadline(self, deadline: float, wake_fd: Optional[int] = None) -> None:
        """Reads at a packet boundary give up (raising ``Idle``) at this monotonic time, or
        as soon as ``wake_fd`` (the worker's wake-up pipe) is readable."""
        self._deadline = deadline
        self._wake_fd = wake_fd
        stream = self.stream
        if stream is not None:
            stream.deadline = deadline
            stream.wake_fd = wake_fd

    def connect(self) -> None:
        """Open the control and stream connections and send the dump request."""
        if not self._BinLogStreamReader__connected_ctl:
            self._BinLogStreamReader__connect_to_ctl()
        if not self._BinLogStreamReader__connected_stream:
            self._BinLogStreamReader__connect_to_stream()
            self._stream_connection.deadline = getattr(self, "_deadline", 0.0)
            self._stream_connection.wake_fd = getattr(self, "_wake_fd", None)

    def _wrap(self, data: bytes) -> "_PacketWrapper":
        """The library's parse of one replication packet."""
        return _PacketWrapper(
            MysqlPacket(data, self._stream_connection.encoding), self.table_map,
            self._ctl_connection, self.mysql_version,
            self._BinLogStreamReader__use_checksum, self._allowed,
            None, None, self._BinLogStreamReader__only_schemas, None,
            False,                                        # freeze_schema: ALTER must work
            False,                                        # ignore_decode_errors
            False,                                        # verify_checksum
            self._BinLogStreamReader__optional_meta_data,
            False,                                        # enable_logging
            False,                                        # use_column_name_cache
            self._BinLogStreamReader__post_header_lengths,
        )

    def _lean_rows(self, data: bytes):
        """A rows event read without the library (:func:`lean_rows`); None for a table out
        of scope (no map kept: the library skips those too); False where the library must
        read it."""
        table = self.table_map.get(int.from_bytes(data[_BODY_OFFSET:_BODY_OFFSET + 6],
                                                  "little"))
        if table is None:
            return None
        only = self._BinLogStreamReader__only_schemas
        if only is not None and table.schema not in only:
            return None
        event = lean_rows(data, table, self._BinLogStreamReader__use_checksum,
                          self._BinLogStreamReader__post_header_lengths)
        if event is None:
            return False
        event._parse_with_library = lambda: self._wrap(data).event
        return event

    def fetchone(self) -> Any:
        """The next event of interest.  Raises ``Idle`` at the deadline, ``LinkDead``,
        ``StreamEnded`` or pymysql errors; never reconnects."""
        if not (self._BinLogStreamReader__connected_stream
                and self._BinLogStreamReader__connected_ctl):
            self.connect()
        stream = self._stream_connection
        while True:
            data = stream.read_payload()
            if data[0] != 0 or len(data) < 7:           # pymysql's is_ok_packet()
                if data[0] == 0xFE and len(data) < 9:      # ... is_eof_packet()
                    self.close()
                    raise StreamEnded("the server ended the binlog stream")
                continue                                    # not an event
            kind = data[_TYPE_OFFSET]
            if kind in _HEADER_ONLY_EVENTS:
                # every transaction has one of each: read from the bytes, not through the
                # library's packet wrapper, which costs as much as the transaction's row event
                self.log_pos = int.from_bytes(data[_NEXT_POSITION], "little") or self.log_pos
                return _HEADER_ONLY_EVENTS[kind](data)
            if kind == BINLOG.TABLE_MAP_EVENT:
                end = len(data) - _CHECKSUM_BYTES if self._BinLogStreamReader__use_checksum \
                    else len(data)
                body = data[_BODY_OFFSET:end]
                known = self._table_maps.get(body)
                if known is not None:
                    self.log_pos = int.from_bytes(data[_NEXT_POSITION], "little") or self.log_pos
                    event, in_scope = known
                    if not in_scope:
                        self.table_map.pop(event.table_id, None)
                        continue
                    self.table_map[event.table_id] = event.get_table()
                    return event
            elif kind in _LEAN_ROWS:
                event = self._lean_rows(data)
                if event is not False:
                    self.log_pos = int.from_bytes(data[_NEXT_POSITION], "little") or self.log_pos
                    if event is None:
                        continue            # not in scope: its rows are never decoded
                    return event
                body = None
            else:
                body = None
            wrapped = self._wrap(data)
            kind = wrapped.event_type
            event = wrapped.event
            if kind == BINLOG.ROTATE_EVENT:
                self.log_pos = event.position
                self.log_file = event.next_binlog
                # Table ids are reused after a server restart, which starts a new file behind a
                # STOP event and a *fake* Rotate (timestamp 0): forget the map on every Rotate.
                # Each transaction repeats its own Table_map events, so nothing is lost; keeping
                # the old map would decode another table's rows as ours.
                self.table_map = {}
            elif wrapped.log_pos:
                self.log_pos = wrapped.log_pos
            if kind == BINLOG.FORMAT_DESCRIPTION_EVENT and event is not None:
                self.mysql_version = event.mysql_version
                self._BinLogStreamReader__post_header_lengths = event.post_header_len
            if kind == BINLOG.TABLE_MAP_EVENT and event is not None:
                if self.scope.allows(event.schema, event.table):
                    self.table_map[event.table_id] = event.get_table()
                    self._table_maps.put(body, event, True)
                else:
                    # Dropping the map makes the library skip this table's rows undecoded.
                    self.table_map.pop(event.table_id, None)
                    self._table_maps.put(body, event, False)
                    continue
            if event is None:
                continue
            return event
