"""MariaDB's side of a snapshot: tables, chunk SELECTs at a binlog position, the hand-off.

Runs in the mysql worker process, driven by :class:`~.source.MysqlSource`:

* :func:`snapshot_tables` lists what an initial snapshot reads (the base tables the
  backend's scope streams) and refuses, FATAL at start, tables without a primary key;
  :func:`backfill_table` resolves and checks one backfill's table and ``where``;
* :meth:`MysqlSnapshot.start_chunk`, called by the source's ``read`` when no chunk is held:
  opens a :class:`~..snapshot.window.ChunkWindow`, then, on a connection of its own,
  ``START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY``, reads MariaDB's
  ``Binlog_snapshot_file`` / ``Binlog_snapshot_position`` (the binlog position exactly
  consistent with that snapshot: every transaction before it is visible, none after), the
  chunk's SELECT (keyset on the primary key, ``max_statement_time``), COMMIT; the rows are
  held with that position P (in the worker loop as their events' JSON lines,
  :mod:`..snapshot.lines`);
* :meth:`MysqlSnapshot.reached` tells the source when its binlog reader has consumed
  everything before P: the source then emits the held rows, before any event at or after P.

Read-only: no watermark table, nothing written to the server (docs/snapshots.md, "MySQL and
MariaDB").  Oracle MySQL has no ``Binlog_snapshot_position`` and is refused; Percona Server
has it.

Why the fold is exact: the chunk is the table's state at P.  A key changed in the stream
between the window's opening and P evicts its row, and the consumer has that key's newest
state before P from the stream itself; a key not changed there still has the state the
SELECT read; every change at or after P follows the ``read`` events.
"""

from __future__ import annotations

import base64
import time
from typing import Any, List, Optional, Sequence, Tuple

import orjson
import pymysql

from ..base import BackendError
from ..snapshot.lines import json_texts
from ..snapshot.progress import SnapshotProgress
from ..snapshot.run import SnapshotRefused, SnapshotRun
from ..snapshot.window import ChunkWindow, ValueKeyedWindow
from ..utctime import utc_seconds_text
from .connection import describe_error
from .position import MariadbGtidState
from .scope import Scope
from .selected import (
    CONVERSIONS, Column, RowMapper, json_expression, json_safe, select_expression,
)

Table = Tuple[str, str]
Position = Tuple[str, int]

ER_STATEMENT_TIMEOUT = 1969     # MariaDB: max_statement_time exceeded
ER_NO_SUCH_TABLE = 1146
ER_PARSE_ERROR = 1064
ER_NO_SUCH_FUNCTION = 1305

_BASE_TABLES = ("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE "
                "TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN ('mysql', "
                "'information_schema', 'performance_schema', 'sys') ORDER BY 1, 2")
_PRIMARY_KEY = ("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
                "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX")
_COLUMNS = ("SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_SET_NAME FROM "
            "information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
            "ORDER BY ORDINAL_POSITION")
_ESTIMATE = ("SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND "
             "TABLE_NAME = %s")

# key types whose SQL comparison orders exactly like ORDER BY (ENUM/SET compare as text but
# sort by index; FLOAT keys compare inexactly): others are refused by name
_KEY_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint",
                        "decimal", "numeric", "char", "varchar", "binary", "varbinary",
                        "date", "datetime", "timestamp", "time", "year", "tinytext", "text",
                        "mediumtext", "longtext", "tinyblob", "blob", "mediumblob",
                        "longblob"})


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def qualified(schema: str, table: str) -> str:
    return f"{quote(schema)}.{quote(table)}"


def _rows(conn, sql: str, args: Any = None) -> List[tuple]:
    cur = conn.cursor()
    try:
        cur.execute(sql, args)
        return list(cur.fetchall())
    finally:
        cur.close()


def primary_key(conn, schema: str, table: str) -> List[str]:
    return [str(r[0]) for r in _rows(conn, _PRIMARY_KEY, (schema, table))]


def streamed_tables(conn, scope: Scope) -> List[Table]:
    return [(str(s), str(t)) for s, t in _rows(conn, _BASE_TABLES) if scope.allows(str(s),
                                                                                   str(t))]


def _unreadable(conn, tables: Sequence[Table], what: str) -> Optional[str]:
    keyless = [f"{s}.{t}" for s, t in tables if not primary_key(conn, s, t)]
    if keyless:
        return (f"{what} cannot read {', '.join(keyless)}: no primary key (snapshots read "
                f"tables in primary-key chunks); give it a primary key, or leave it out with "
                f"exclude_tables = {[*keyless]!r}".replace("'", '"'))
    for schema, table in tables:
        key = primary_key(conn, schema, table)
        types = {str(r[0]): str(r[1]).lower() for r in _rows(conn, _COLUMNS, (schema, table))}
        odd = [f"{name} ({types.get(name)})" for name in key if types.get(name) not in _KEY_TYPES]
        if odd:
            return (f"{what} cannot read {schema}.{table}: its primary key has columns whose "
                    f"SQL comparison does not follow their sort order ({', '.join(odd)}); "
                    f"leave it out with exclude_tables = [\"{schema}.{table}\"]")
    return None


def snapshot_tables(conn, name: str, scope: Scope) -> List[Table]:
    """The tables an initial snapshot reads, sorted; FATAL for a table it cannot read
    (silently leaving a table out would break the consumer's copy without a word)."""
    tables = streamed_tables(conn, scope)
    problem = _unreadable(conn, tables, 'snapshot = "initial"')
    if problem:
        raise BackendError(f'backend "{name}": {problem}', fatal=True)
    return tables


def backfill_table(conn, name: str, scope: Scope, wanted: str, where: Optional[str]) -> Table:
    """The table a backfill of ``wanted`` (``table`` or ``schema.table``, schema = database)
    reads; :class:`SnapshotRefused` for one not streamed, keyless, or a ``where`` the server
    rejects (tried as ``SELECT 1 ... WHERE (where) LIMIT 0`` in a read-only transaction)."""
    schema, _, table = wanted.rpartition(".")
    if not schema and scope.database:
        schema = scope.database
    streamed = streamed_tables(conn, scope)
    matches = [t for t in streamed if t[1] == table and (not schema or t[0] == schema)]
    if len(matches) > 1:
        raise SnapshotRefused(
            f'backend "{name}": backfill of "{wanted}": more than one streamed table has that '
            f"name ({', '.join('.'.join(t) for t in matches)}); give it as database.table")
    if not matches:
        exists = any(t[1] == table and (not schema or t[0] == schema)
                     for t in ((str(s), str(t)) for s, t in _rows(conn, _BASE_TABLES)))
        reason = ("it is left out by database / include_tables / exclude_tables" if exists
                  else "no such table on the server")
        hint = ", ".join(".".join(t) for t in streamed[:10]) or "none"
        raise SnapshotRefused(
            f'backend "{name}": backfill of "{wanted}": not a table this backend streams '
            f"({reason}); streamed tables: {hint}")
    problem = _unreadable(conn, matches, "a backfill")
    if problem:
        raise SnapshotRefused(f'backend "{name}": {problem}')
    if where and where_problem(where):
        raise SnapshotRefused(
            f'backend "{name}": backfill of "{wanted}": the --where condition cannot be used: '
            f"{where_problem(where)} (it is ANDed to the chunk's WHERE in parentheses); "
            f"give one SQL condition")
    if where:
        cur = conn.cursor()
        try:
            cur.execute("START TRANSACTION READ ONLY")
            try:
                cur.execute(f"SELECT 1 FROM {qualified(*matches[0])} WHERE ({where}) LIMIT 0")
            finally:
                cur.execute("ROLLBACK")
        except pymysql.err.MySQLError as exc:
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            if code is None or code >= 2000:
                raise           # the connection, not the condition: the caller classifies
            text = exc.args[1] if len(exc.args) > 1 else str(exc)
            raise SnapshotRefused(
                f'backend "{name}": backfill of "{wanted}": the --where condition is not '
                f"valid SQL for {'.'.join(matches[0])}: {text}; fix the condition (it is "
                f"ANDed to the chunk's WHERE, as in SELECT * FROM t WHERE (...))") from None
        finally:
            cur.close()
    return matches[0]


def where_problem(where: str) -> Optional[str]:
    """Why ``where`` could leave the parentheses it is put in (a ``)`` too many, a comment
    that would cut the chunk's ORDER BY and LIMIT, a second statement), or None.  A lexical
    check outside quotes and backticks; the server checks the rest."""
    depth, i, quote_char = 0, 0, None
    while i < len(where):
        ch = where[i]
        if quote_char:
            if ch == "\\":
                i += 1
            elif ch == quote_char:
                quote_char = None
        elif ch in "'\"`":
            quote_char = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return "it closes a parenthesis it did not open"
        elif ch == "#" or where.startswith("--", i) or where.startswith("/*", i):
            return "it has a comment"
        elif ch == ";":
            return "it has a ';'"
        i += 1
    if quote_char:
        return "a quote is not closed"
    return "a parenthesis is not closed" if depth else None


def binlog_order(file: str, pos: int) -> Tuple[str, int, int]:
    """A sort key for binlog coordinates: ``base.000012`` by base name, then number, then
    offset (rotations move to the next number)."""
    base, _, number = file.rpartition(".")
    return (base, int(number) if number.isdigit() else -1, pos)


class _Shape:
    """A table's columns, key and row mapper, found once per run."""

    def __init__(self, columns: List[Column], key: List[str]):
        self.columns = columns
        self.key = [next(c for c in columns if c.name == name) for name in key]
        self.mapper = RowMapper(columns, key)
        # %% : the chunk's SQL goes through pymysql's %-formatting of its arguments
        self.select_list = ", ".join(select_expression(c, quote(c.name))
                                     for c in columns).replace("%", "%%")
        # Tables of JSON-safe columns are read as one aggregated JSON text per chunk: the
        # server builds it, orjson parses it, instead of pymysql's per-row Python parsing
        # (about 40% of the worker's time per row otherwise)
        self.json_list = ", ".join(json_expression(c, quote(c.name))
                                   for c in columns).replace("%", "%%") \
            if all(json_safe(c) for c in columns) else None


class _TupleKeyWindow(ValueKeyedWindow):
    """A chunk window whose keys are tuples of the key values.  Keys are only matched
    inside this process (a held row against a change's ``pk``/``before``, both mapped to
    the same values), so the JSON text of :func:`~..snapshot.events.pk_text` (what the
    event id needs) is not needed here; it cost a ``json.dumps`` per held row."""

    def _key(self, pk):
        try:
            return tuple([pk[name] for name in self.key_names])
        except (KeyError, TypeError):
            return None


class MysqlSnapshot(SnapshotRun):
    """One snapshot run of one MariaDB backend: the database half (see the module)."""

    def __init__(self, backend: str, options: dict, settings, json_columns,
                 progress: SnapshotProgress, log, encoded: bool = False):
        super().__init__(backend, options, progress, log, encoded)
        self.settings = settings
        self.json_columns = json_columns     # the source's MariaDB JSON column lookup
        self.shapes = {}
        self.position: Optional[Position] = None   # P of the held chunk
        self._gtid_at: Optional[str] = None        # GTID position of P, asked once if idle

    def open_window(self, schema: str, table: str, key_names) -> ChunkWindow:
        """As :meth:`SnapshotRun.open_window`, with tuple keys (:class:`_TupleKeyWindow`)."""
        self.chunks += 1
        mark = f"{self.backend}:{self.progress.n}:{self.nonce}:{self.chunks}"
        self.window = _TupleKeyWindow(mark, schema, table, key_names)
        return self.window

    # -- the database side ----------------------------------------------------------------

    def _connection(self):
        if self.conn is None or not self.conn.open:
            from .connection import connect
            conn = connect(self.settings, conv=CONVERSIONS,
                           read_timeout=self.timeout_seconds + 30.0)
            cur = conn.cursor()
            try:
                # REPEATABLE READ: WITH CONSISTENT SNAPSHOT takes the snapshot at START only
                # at this level; UTC: TIMESTAMP text as the binlog path gives it
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cur.execute("SET time_zone = '+00:00'")
                # room for a chunk's JSON_ARRAYAGG (the server still caps it at
                # max_allowed_packet: such a chunk is read row by row instead)
                cur.execute("SET SESSION group_concat_max_len = 4294967295")
            finally:
                cur.close()
            self.conn = conn
        return self.conn

    def close(self) -> None:
        self.position = None
        super().close()

    def _shape(self, conn, schema: str, table: str) -> _Shape:
        shape = self.shapes.get((schema, table))
        if shape is None:
            key = self.require_key(schema, table, primary_key(conn, schema, table))
            json = self.json_columns(schema, table) if self.json_columns else frozenset()
            columns = [Column(str(n), str(d), str(t), binary=(cs is None), json=str(n) in json)
                       for n, d, t, cs in _rows(conn, _COLUMNS, (schema, table))]
            estimate = _rows(conn, _ESTIMATE, (schema, table))
            self.progress.estimates[(schema, table)] = \
                int(estimate[0][0]) if estimate and estimate[0][0] is not None else None
            shape = self.shapes[(schema, table)] = _Shape(columns, key)
        return shape

    def start_chunk(self, reader_at: Optional[Position] = None) -> None:
        """The next chunk's rows at a binlog position P, held with P (see the module).

        ``reader_at``: the binlog reader's position now.  A snapshot position before it
        (a transaction the reader already got but whose commit was not yet visible) would be
        too late to emit at: the snapshot is taken again, briefly, until it is not.
        """
        schema, table = self.progress.table
        where = f"{schema}.{table}"
        try:
            conn = self._connection()
            if (schema, table) not in self.shapes and not _rows(
                    conn, "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                    "AND TABLE_NAME = %s", (schema, table)):
                self._skip_dropped(schema, table)
                return
            shape = self._shape(conn, schema, table)
            # Opened before the snapshot: changes read from here on all evict (safe: they
            # are in the stream before the rows; see ..snapshot.window).
            window = self.open_window(schema, table, shape.mapper.key_names)
            sql, args = self._chunk_sql(schema, table, shape)
            cur = conn.cursor()
            try:
                for attempt in range(200):
                    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
                    position = self._snapshot_position(cur)
                    if reader_at is None or binlog_order(*position) >= binlog_order(*reader_at):
                        break
                    cur.execute("COMMIT")
                    time.sleep(0.001 * min(attempt + 1, 20))
                else:
                    cur.execute("COMMIT")
                    self.window = None          # tried again at the next read
                    return
                raw = self._select(cur, shape, sql, args)
                cur.execute("COMMIT")
            finally:
                cur.close()
        except pymysql.err.MySQLError as exc:
            self.window = None
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            if code == ER_NO_SUCH_TABLE:
                self.close()            # ends the transaction the error left open
                self._skip_dropped(schema, table)
                return
            if code == ER_STATEMENT_TIMEOUT:
                self.close()
                raise BackendError(
                    f'backend "{self.backend}": a snapshot chunk of {where} '
                    f"({self.chunk_rows} rows) took longer than snapshot_chunk_timeout "
                    f"({self.timeout_seconds:g} s); make snapshot_chunk_rows smaller or "
                    f"snapshot_chunk_timeout larger", fatal=True) from None
            self.close()
            if self.progress.where and code is not None and code < 2000:
                raise BackendError(
                    f'backend "{self.backend}": backfill {self.progress.n} of {where}: the '
                    f"server rejected a chunk's SELECT ({exc.args[1]}); cancel it with "
                    f"lapidusctl backfill --cancel and fix the --where", fatal=True) from None
            raise describe_error(self.settings, exc) from None
        self.position = position
        self._gtid_at = None
        last_key = self._raw_key(shape, raw[-1]) if raw else None
        if self.encoded:
            window.hold_keyed(self._lines(shape, raw, schema, table), last_key)
        else:
            window.hold(shape.mapper.rows(raw), last_key)

    def _lines(self, shape: _Shape, raw, schema: str, table: str) -> list:
        """The rows of an ``encoded`` run under the window's keys (tuples of the key values):
        ``(key, (event id, record key, line))`` (:meth:`SnapshotRun.lines`)."""
        if not raw:
            return []
        mapper = shape.mapper
        columns = mapper.columns(raw)
        keys = [columns[i] for i in mapper.key_index]
        lines = self.lines(schema, table, [json_texts(column) for column in columns],
                           mapper.names, mapper.key_index,
                           None if mapper.int_key else keys)
        return [(key, row) for key, (_, row) in zip(zip(*keys), lines)]

    def _select(self, cur, shape: _Shape, sql: str, args) -> list:
        """The chunk's rows: aggregated to one JSON text where the table allows it."""
        if shape.json_list is not None:
            keys = ", ".join(quote(c.name).replace("%", "%%") for c in shape.key)
            head, _, inner = sql.partition(" FOR ")
            try:
                cur.execute(f"{head} FOR SELECT COUNT(*), JSON_ARRAYAGG(JSON_ARRAY("
                            f"{shape.json_list}) ORDER BY {keys}) FROM ({inner}) AS "
                            f"lapidus_chunk", args)
            except pymysql.err.MySQLError as exc:
                if not exc.args or exc.args[0] not in (ER_PARSE_ERROR, ER_NO_SUCH_FUNCTION):
                    raise
                # a server without JSON_ARRAYAGG(... ORDER BY) (MariaDB before 10.5): row
                # by row, in the same transaction (an error does not end it)
                shape.json_list = None
                cur.execute(sql, args)
                return cur.fetchall()
            count, text = cur.fetchone()
            if text is not None or not count:
                return orjson.loads(text) if text else []
            # NULL for rows: the aggregate outgrew max_allowed_packet; row by row then
        cur.execute(sql, args)
        return cur.fetchall()

    def _snapshot_position(self, cur) -> Position:
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
        status = {str(k).lower(): v for k, v in cur.fetchall()}
        file, pos = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
        if not file or pos is None:
            raise BackendError(
                f'backend "{self.backend}": snapshots need the binlog position of a '
                f"consistent snapshot (status Binlog_snapshot_file / Binlog_snapshot_position), "
                f"which this server does not report; they are built for MariaDB and Percona "
                f'Server, not Oracle MySQL: set snapshot = "never"', fatal=True)
        return str(file), int(pos)

    def _skip_dropped(self, schema: str, table: str) -> None:
        self.shapes.pop((schema, table), None)
        self.position = None
        self.skip_table(schema, table)

    @staticmethod
    def _raw_key(shape: _Shape, last_row: tuple) -> List[Any]:
        """The last row's key as JSON for the checkpoint: bytes as base64."""
        out = []
        for column in shape.key:
            value = last_row[shape.columns.index(column)]
            if isinstance(value, (bytes, bytearray)):
                value = base64.b64encode(bytes(value)).decode("ascii")
            out.append(value)
        return out

    def _key_params(self, shape: _Shape) -> Tuple[List[str], List[Any]]:
        """Placeholders and values for the last key (typed: an int key compared with a
        string would be compared as doubles, and a DECIMAL as well)."""
        placeholders, params = [], []
        for column, value in zip(shape.key, self.progress.last_key):
            kind = column.data_type
            if kind in ("binary", "varbinary") or kind.endswith("blob"):
                value = base64.b64decode(value)
                placeholders.append("%s")
            elif kind in ("decimal", "numeric"):
                placeholders.append(f"CAST(%s AS {column.column_type.replace(' unsigned', '')})"
                                    .replace("numeric", "decimal"))
            elif kind in ("date", "datetime", "timestamp", "time"):
                placeholders.append(f"CAST(%s AS {kind if kind != 'timestamp' else 'datetime'}"
                                    f"{self._precision(column)})")
            else:
                placeholders.append("%s")
            params.append(value)
        return placeholders, params

    @staticmethod
    def _precision(column: Column) -> str:
        text = column.column_type
        return text[text.index("("):text.index(")") + 1] if "(" in text else ""

    def _chunk_sql(self, schema: str, table: str, shape: _Shape):
        keys = [quote(c.name).replace("%", "%%") for c in shape.key]
        conditions, args = [], []
        if self.progress.last_key is not None:
            # keyset, spelled out (a > x OR a = x AND b > y): MariaDB's range optimizer
            # uses the primary key for it, not always for a row-value comparison
            placeholders, params = self._key_params(shape)
            ors = []
            for i in range(len(keys)):
                ands = [f"{keys[j]} = {placeholders[j]}" for j in range(i)]
                ands.append(f"{keys[i]} > {placeholders[i]}")
                ors.append("(" + " AND ".join(ands) + ")")
                args.extend(params[:i + 1])
            conditions.append("(" + " OR ".join(ors) + ")")
        if self.progress.where:
            # a backfill's --where, in parentheses so its OR cannot escape the keyset
            conditions.append(f"({self.progress.where})".replace("%", "%%"))
        sql = f"SELECT {shape.select_list} FROM {qualified(schema, table).replace('%', '%%')}"
        if conditions:
            sql += " WHERE " + " AND ".join(conditions)
        sql += f" ORDER BY {', '.join(keys)} LIMIT {self.chunk_rows}"
        timeout = self.timeout_seconds
        return f"SET STATEMENT max_statement_time={timeout:g} FOR {sql}", tuple(args)

    # -- the stream side ------------------------------------------------------------------

    def reached(self, file: Optional[str], pos: Optional[int]) -> bool:
        """The binlog reader, now at ``file:pos`` (the end of what it consumed), has read
        everything before the held chunk's P."""
        position = self.position
        if self.window is None or position is None or not file or not pos:
            return False
        if file == position[0]:             # the common case, checked after every event
            return pos >= position[1]
        return binlog_order(file, pos) >= binlog_order(*position)

    def reached_when_idle(self, conn, state: Optional[MariadbGtidState]) -> Optional[bool]:
        """For an idle binlog: the reader's coordinates stay behind the real ones after a
        GTID start until an event or heartbeat arrives; the GTID position of P
        (``BINLOG_GTID_POS``, asked once per chunk) against the stream's says whether every
        transaction before P was consumed.  True: emit; False: the stream is already past P
        (the chunk must be read again); None: not yet."""
        if self.window is None or self.position is None or state is None:
            return None
        if self._gtid_at is None:
            rows = _rows(conn, "SELECT BINLOG_GTID_POS(%s, %s)", self.position)
            self._gtid_at = str(rows[0][0] or "") if rows and rows[0][0] is not None else ""
        at = MariadbGtidState(self._gtid_at).domains()
        have = state.domains()
        behind = any((have.get(d, (0, 0))[1] < seq) for d, (_s, seq) in at.items())
        if behind:
            return None
        ahead = any(seq > at.get(d, (0, 0))[1] for d, (_s, seq) in have.items())
        return not ahead

    def retry_chunk(self) -> None:
        """The stream passed P without the rows being emitted: drop them, read again."""
        self.window = None
        self.position = None

    def emit(self, events: List, position: str) -> None:
        """The held chunk's rows as ``read`` events, at the stream's position now."""
        self.position = None
        self.emit_window(events, position, utc_seconds_text(int(time.time())) + "Z")
