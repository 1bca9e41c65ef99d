"""Library binlog events in, Lapidus events and exact checkpoints out.

Runs in the mysql worker process.  No I/O of its own: :class:`ChangeStream` is fed the
events :class:`.reader.BinlogReader` returns, builds :class:`~lapidus.events.Event` objects
into a pending queue and knows, for the events taken from that queue so far, the checkpoint
that resumes right after them (format in :mod:`.position`).

Transactions: MariaDB starts each with a GTID event (no BEGIN) and flags DDL "standalone"
(no COMMIT follows); MySQL sends GTID, then BEGIN ... XID for DML, GTID + statement for DDL;
without GTIDs a transaction starts at BEGIN (or at its DDL statement) and is named
``file:pos`` of that start.  A transaction ends at XID, at a COMMIT/ROLLBACK statement, or
after the statement of a standalone transaction.

Each change gets the index of its place among the streamed changes of its transaction;
``id = backend:txid:index``, the same on every replay.
"""

from __future__ import annotations

import collections
from typing import Callable, Deque, Dict, FrozenSet, List, Optional, Tuple

from pymysqlreplication.constants import BINLOG, FIELD_TYPE
from pymysqlreplication.event import (
    GtidEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent, TableMapEvent, UpdateRowsEvent, WriteRowsEvent,
)

from ...events import Event
from ..base import BackendError
from ..utctime import utc_seconds_text
from . import ddl
from .position import MARIADB, Checkpoint, new_state
from .reader import row_data
from .rowimage import TableDecoder, compile_table
from .scope import Scope
from .values import TablePlan, build_plan, convert_row

_MARIADB_STANDALONE = 0x01       # MariaDB GTID event flag: no COMMIT/XID follows

JsonColumns = Callable[[str, str], FrozenSet[str]]


def commit_time(seconds: int) -> str:
    """Binlog header time (whole seconds, UTC) as RFC 3339 with Z (consecutive transactions
    mostly share their second: the text is cached)."""
    return utc_seconds_text(seconds) + "Z"


def might_hold_json(columns) -> bool:
    """MariaDB stores JSON as LONGTEXT (4-byte length, text charset): only such tables need
    the information_schema lookup of their json_valid() checks."""
    return any(c.type == FIELD_TYPE.BLOB and getattr(c, "length_size", 0) == 4
               and getattr(c, "character_set_name", None) not in (None, "binary")
               for c in columns)


class ChangeStream:
    """Turns one binlog stream into events, counting rows inside each transaction."""

    def __init__(self, backend: str, flavor: str, scope: Scope, *, gtid: Optional[str],
                 file: Optional[str], pos: Optional[int], resume: Optional[Checkpoint] = None,
                 json_columns: Optional[JsonColumns] = None, describe: str = ""):
        self.backend = backend
        self.flavor = flavor
        self.scope = scope
        self._fingerprint = scope.fingerprint()
        self._describe = describe or f'backend "{backend}"'
        self._state = new_state(flavor, gtid)
        self._file = file
        self._pos = pos
        self._json_columns = json_columns
        # table id -> (plan, decoder or None) of the table map in force
        self._plans: Dict[int, Tuple[TablePlan, Optional[TableDecoder]]] = {}
        # The reader hands out the same object for a repeated table map: built once per map.
        self._built: Dict[int, Tuple[object, TablePlan, Optional[TableDecoder]]] = {}
        self.pending: Deque[Event] = collections.deque()
        # The partly delivered transaction to continue, if its index is meaningful here.
        self._resume_tx: Optional[str] = None
        self._resume_index = -1
        if resume is not None and resume.tx is not None:
            if resume.scope == self._fingerprint:
                self._resume_tx = resume.tx
                self._resume_index = resume.index
        # current transaction
        self._tx: Optional[str] = None
        self._txid: Optional[str] = None
        self._ts: Optional[str] = None
        self._explicit = False            # opened by BEGIN (or a MariaDB non-standalone GTID)
        self._next_index = 0
        self._skip_upto = -1
        self._id_prefix = ""
        # index of the last change of the current transaction handed out by take()
        self._taken = -1
        self._pending_index: Deque[int] = collections.deque()
        self._end_after_take: Optional[tuple] = None

    # ------------------------------------------------------------------ feeding

    def feed(self, event, log_file: Optional[str], log_pos: Optional[int]) -> None:
        """Process one event from the reader; ``log_file``/``log_pos`` are the reader's
        coordinates right after it.  Call only when :attr:`pending` is empty, so that the
        checkpoint of what was taken never runs ahead of it."""
        cls = type(event)
        if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
            self._rows(event)
        elif cls is TableMapEvent:
            self._table_map(event)
        elif cls is XidEvent:
            self._end(log_file, log_pos)
        elif cls is MariadbGtidEvent:
            self._begin(event.gtid, event.gtid, event.timestamp,
                        explicit=not (event.flags & _MARIADB_STANDALONE))
        elif cls is GtidEvent:
            self._begin(event.gtid, event.gtid, event.timestamp, explicit=False)
        elif cls is QueryEvent:
            self._query(event, log_file, log_pos)
        elif cls is RotateEvent:
            if self._tx is None:
                self._file = event.next_binlog
                self._pos = event.position

    def _begin(self, tx: str, txid: Optional[str], seconds: int, explicit: bool) -> None:
        self._tx = tx
        self._txid = txid
        self._ts = commit_time(seconds)
        self._explicit = explicit
        self._next_index = 0
        self._id_prefix = f"{self.backend}:{tx}:"
        self._taken = -1
        self._skip_upto = -1
        if tx == self._resume_tx:
            # Delivered before the restart: drop, and count as taken for the checkpoint.
            self._skip_upto = self._taken = self._resume_index
            self._resume_tx = None

    def _end(self, log_file: Optional[str], log_pos: Optional[int]) -> None:
        if self.pending:
            # A transaction's last change is built but not handed out yet: the position may
            # pass the transaction only once it has been (see take()).
            self._end_after_take = (log_file, log_pos)
            return
        if self._tx is not None and self._state is not None and self._txid is not None:
            self._state.advance(self._txid)
        self._tx = self._txid = None
        self._taken = -1
        self._explicit = False
        if log_file:
            self._file = log_file
        if log_pos:
            self._pos = log_pos

    @staticmethod
    def _start_position(event, log_pos: Optional[int]) -> Optional[int]:
        """Where ``event`` starts in its binlog file (the header gives where the next starts)."""
        packet = getattr(event, "packet", None)
        size = getattr(packet, "event_size", None)
        end = getattr(packet, "log_pos", None) or log_pos
        return end - size if end and size else end

    def _query(self, event, log_file: Optional[str], log_pos: Optional[int]) -> None:
        schema = event.schema.decode("utf-8", "replace") if isinstance(event.schema, bytes) \
            else event.schema
        statement = ddl.classify(event.query, schema)
        if statement.kind == ddl.CONTROL:
            if self._tx is None:      # no GTIDs: BEGIN opens the transaction, named file:pos
                self._begin(f"{log_file}:{self._start_position(event, log_pos)}", None,
                            event.timestamp, explicit=True)
            self._explicit = True
            return
        if statement.kind == ddl.COMMIT:
            self._end(log_file, log_pos)
            return
        if self._tx is None:
            self._begin(f"{log_file}:{self._start_position(event, log_pos)}", None,
                        event.timestamp, explicit=False)
        if statement.kind != ddl.SKIP:
            self._statement(statement, event.query)
        if self._json_columns is not None:
            # A DDL may have made a column JSON or plain text: look again on next use.
            self._json_cache_reset()
        if not self._explicit:
            self._end(log_file, log_pos)

    def _json_cache_reset(self) -> None:
        self._built.clear()
        reset = getattr(self._json_columns, "reset", None)
        if reset is not None:
            reset()

    def _statement(self, statement: ddl.Statement, sql: str) -> None:
        if statement.table is not None and statement.schema is not None:
            wanted = self.scope.allows(statement.schema, statement.table)
        else:
            wanted = self.scope.allows_schema(statement.schema)
        if not wanted:
            return
        index = self._next_index
        self._next_index += 1
        if index <= self._skip_upto:
            return
        kind = "truncate" if statement.kind == ddl.TRUNCATE else "schema"
        item = None if kind == "truncate" else {"sql": sql}
        self._push(Event(id=self._id_prefix + str(index), type=kind, backend=self.backend,
                         schema=statement.schema, table=statement.table, pk=None, item=item,
                         before=None, position=self._tx, txid=self._txid, ts=self._ts), index)

    def _table_map(self, event) -> None:
        built = self._built.get(id(event))
        if built is not None and built[0] is event:
            self._plans[event.table_id] = built[1:]
            return
        columns = event.columns
        for column in columns:
            if column.name is None:
                raise BackendError(
                    f"{self._describe}: the binlog carries no column names for "
                    f"{event.schema}.{event.table}; set binlog_row_metadata=FULL (it was "
                    f"changed while streaming)", fatal=True)
        meta = event.optional_metadata
        pk_indexes = list(meta.simple_primary_key_list or ()) or \
            list((meta.primary_keys_with_prefix or {}).keys())
        json_cols: FrozenSet[str] = frozenset()
        if self._json_columns is not None and might_hold_json(columns):
            json_cols = self._json_columns(event.schema, event.table)
        plan = build_plan(event.schema, event.table, columns, pk_indexes, json_cols)
        decoder = compile_table(columns, json_cols)
        if len(self._built) >= 4096:
            self._built.clear()
        self._built[id(event)] = (event, plan, decoder)
        self._plans[event.table_id] = (plan, decoder)

    def _plan_for(self, event) -> Tuple[TablePlan, Optional[TableDecoder]]:
        known = self._plans.get(event.table_id)
        if known is None or known[0].table != event.table or known[0].schema != event.schema:
            plan = build_plan(event.schema, event.table, event.columns, [
                i for i, c in enumerate(event.columns) if getattr(c, "is_primary", False)])
            known = self._plans[event.table_id] = (plan, None)
        return known

    @staticmethod
    def _images(event, plan: TablePlan, decoder: Optional[TableDecoder], update: bool) -> list:
        """The event's rows as (values, left-out columns) images; (before, after) pairs for
        an update.  Lapidus's decoder where it has one for the table (rowimage.py), else the
        library's rows mapped by values.py: the two give the same values."""
        data = None
        if decoder is not None and event.event_type != BINLOG.PARTIAL_UPDATE_ROWS_EVENT:
            data = row_data(event)
        if data is not None:
            if update:
                return decoder.image_pairs(data, event.columns_present_bitmap,
                                           event.columns_present_bitmap2)
            return decoder.images(data, event.columns_present_bitmap)
        if update:
            return [(convert_row(plan, row["before_values"], row["before_none_sources"]),
                     convert_row(plan, row["after_values"], row["after_none_sources"]))
                    for row in event.rows]
        return [convert_row(plan, row["values"], row["none_sources"]) for row in event.rows]

    def _rows(self, event) -> None:
        if self._tx is None:
            # Row events always follow a GTID or BEGIN; reaching here means the stream
            # started inside a transaction, which resuming by GTID never does.
            raise BackendError(f"{self._describe}: row event outside a transaction at "
                               f"{self._file}:{self._pos}; the stream cannot be trusted here")
        plan, decoder = self._plan_for(event)
        update = isinstance(event, UpdateRowsEvent)
        rows = self._images(event, plan, decoder, update)
        first = self._next_index
        self._next_index += len(rows)
        start = max(0, self._skip_upto + 1 - first)
        if start >= len(rows):
            return
        prefix = self._id_prefix
        backend, schema, table = self.backend, plan.schema, plan.table
        tx, txid, ts = self._tx, self._txid, self._ts
        pk_names = plan.pk
        push = self._push
        if update:
            for offset in range(start, len(rows)):
                (before, _), (item, unchanged) = rows[offset]
                index = first + offset
                push(Event(prefix + str(index), "update", backend, schema, table,
                           {k: item.get(k, before.get(k)) for k in pk_names}
                           if pk_names else None,
                           item, before, tx, txid, ts, unchanged), index)
            return
        insert = isinstance(event, WriteRowsEvent)
        kind = "insert" if insert else "delete"
        for offset in range(start, len(rows)):
            values = rows[offset][0]
            index = first + offset
            pk = {k: values.get(k) for k in pk_names} if pk_names else None
            if insert:
                push(Event(prefix + str(index), kind, backend, schema, table, pk, values, None,
                           tx, txid, ts), index)
            else:
                push(Event(prefix + str(index), kind, backend, schema, table, pk, None, values,
                           tx, txid, ts), index)

    def _push(self, event: Event, index: int) -> None:
        self.pending.append(event)
        self._pending_index.append(index)

    # ------------------------------------------------------------------ taking

    def take(self, limit: int) -> List[Event]:
        """Up to ``limit`` pending events, in order."""
        pending = self.pending
        if not pending:
            return []
        n = min(limit, len(pending))
        out = [pending.popleft() for _ in range(n)]
        for _ in range(n - 1):
            self._pending_index.popleft()
        self._taken = self._pending_index.popleft()
        if not pending and self._end_after_take is not None:
            log_file, log_pos = self._end_after_take
            self._end_after_take = None
            self._end(log_file, log_pos)
        return out

    def checkpoint(self) -> Checkpoint:
        """Resume point right after the last event taken (and everything consumed since)."""
        tx = self._tx if self._taken >= 0 else None
        return Checkpoint(self.flavor, str(self._state) if self._state is not None else None,
                          self._file, self._pos, tx, self._taken if tx else -1,
                          self._fingerprint)

    @property
    def between_transactions(self) -> bool:
        """Every change taken so far belongs to a transaction that ended (XID, COMMIT, a
        standalone statement): the checkpoint's ``tx`` is null.  A transaction begun but
        with none of its changes taken yet does not count as open."""
        return self._tx is None or self._taken < 0

    def gtid_state(self):
        """The GTID state of the complete transactions consumed (None without GTIDs)."""
        return self._state

    @property
    def position(self) -> str:
        """The current position for status: the GTID state, else file:pos."""
        if self._state is not None:
            return str(self._state)
        return f"{self._file}:{self._pos}"

    @property
    def is_mariadb(self) -> bool:
        return self.flavor == MARIADB
