"""PostgreSQL's side of a snapshot: tables, chunk SELECTs and their watermarks, the hand-off.

Runs in the PostgreSQL worker process, driven by :class:`~.source.PostgresSource`:

* :func:`snapshot_tables` lists what the snapshot reads (the publication's tables that pass
  include/exclude) and refuses, FATAL at start, tables without a primary key;
* :meth:`PgSnapshot.start_chunk`, called by the source's ``read`` when no chunk is held:
  opens a :class:`~..snapshot.window.ChunkWindow`, SELECTs the next chunk (keyset on the
  primary key, its own connection, READ COMMITTED, statement timeout), commits the high
  watermark;
* :meth:`PgSnapshot.feed` sits in front of the transaction assembler while reading the
  spool: changes evict keys of the held chunk, the high watermark turns what is left into
  ``read`` events right there in the stream; watermark messages never become events.

The watermark is a *transactional* logical message (``pg_logical_emit_message(true, ...)``):
the commit flushes the WAL, so the walsender sends it at once (a non-transactional message
before PostgreSQL 17 waits for the WAL writer, up to ``wal_writer_delay``), and it takes its
place in commit order, which is the stream's order.

Rows are selected in PostgreSQL's text form (a psycopg2 caster that keeps the server's
text) and mapped by type OID with the decoders' converters (:mod:`.types`), so a ``read`` row
has exactly the values an ``insert`` of it would have: NUMERIC as exact strings, bytea base64.
In the worker loop (``Source.encoded_reads``) each row is held as its event's JSON line
(:func:`..snapshot.lines.chunk_lines`) and the chunk is emitted as one
:class:`~lapidus.events.ReadChunk`; for :func:`lapidus.api.stream` rows are dicts and each
becomes an :class:`~lapidus.events.Event`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import psycopg2
import psycopg2.extensions

from ..base import BackendError
from ..snapshot import WATERMARK_PREFIX
from ..snapshot.progress import SnapshotProgress
from ..snapshot.run import SnapshotRefused, SnapshotRun
from .catalog import connect
from .chunkrows import chunk_columns, chunk_rows
from .decoding import Change, Watermark
from .errors import query_error
from .publications import _quote

Table = Tuple[str, str]

_PUBLISHED = ("SELECT schemaname::text, tablename::text FROM pg_catalog.pg_publication_tables "
              "WHERE pubname = %s ORDER BY 1, 2")

_PRIMARY_KEY = """
SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s::regclass AND i.indisprimary
ORDER BY array_position(i.indkey::int2[], a.attnum)
"""


# PostgreSQL 15+: tables whose publication entry has a row filter or a column list
_FILTERED_IN_PUBLICATION = """
SELECT n.nspname::text, c.relname::text
FROM pg_catalog.pg_publication p
JOIN pg_catalog.pg_publication_rel r ON r.prpubid = p.oid
JOIN pg_catalog.pg_class c ON c.oid = r.prrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE p.pubname = %s AND (r.prqual IS NOT NULL OR r.prattrs IS NOT NULL)
ORDER BY 1, 2
"""


def qualified(schema: str, table: str) -> str:
    return f"{_quote(schema)}.{_quote(table)}"


def primary_key(conn, schema: str, table: str) -> List[Tuple[str, str]]:
    """``[(column, SQL type)]`` of the table's primary key in key order; [] without one."""
    with conn.cursor() as cur:
        cur.execute(_PRIMARY_KEY, (qualified(schema, table),))
        return [(name, sqltype) for name, sqltype in cur.fetchall()]


def snapshot_tables(conn, backend: str, publication: str, table_filter) -> List[Table]:
    """The tables an initial snapshot reads, sorted; refuses tables it cannot read.

    FATAL rather than skipping: a snapshot that silently leaves a table out breaks the
    consumer's copy without a word, and the fix is the operator's (exclude or key it).
    """
    tables = _published(conn, publication, table_filter)
    problem = _unreadable(conn, publication, tables, 'snapshot = "initial"')
    if problem:
        raise BackendError(f'backend "{backend}": {problem}', fatal=True)
    return tables


def backfill_table(conn, backend: str, publication: str, table_filter, name: str,
                   where: Optional[str]) -> Table:
    """The table a backfill of ``name`` (``table`` or ``schema.table``) reads; refuses
    (:class:`SnapshotRefused`) one that is not streamed, keyless, or a ``where`` the server
    rejects."""
    streamed = _published(conn, publication, table_filter)
    schema, _, table = name.rpartition(".")
    matches = [t for t in streamed if t[1] == table and (not schema or t[0] == schema)]
    if len(matches) > 1:
        raise SnapshotRefused(
            f'backend "{backend}": backfill of "{name}": more than one streamed table has that '
            f"name ({', '.join('.'.join(t) for t in matches)}); give it as schema.table")
    if not matches:
        with conn.cursor() as cur:
            cur.execute(_PUBLISHED, (publication,))
            published = [tuple(t) for t in cur.fetchall()]
        known = [t for t in published if t[1] == table and (not schema or t[0] == schema)]
        reason = ("it is left out by include_tables / exclude_tables" if known else
                  f'publication "{publication}" has no such table')
        hint = ", ".join(".".join(t) for t in streamed[:10]) or "none"
        raise SnapshotRefused(
            f'backend "{backend}": backfill of "{name}": not a table this backend streams '
            f"({reason}); streamed tables: {hint}")
    problem = _unreadable(conn, publication, matches, "a backfill")
    if problem:
        raise SnapshotRefused(f'backend "{backend}": {problem}')
    if where:
        try:
            with conn.cursor() as cur:
                cur.execute("BEGIN READ ONLY")
                try:
                    cur.execute(f"SELECT 1 FROM {qualified(*matches[0])} WHERE ({where}) "
                                f"LIMIT 0")
                finally:
                    cur.execute("ROLLBACK")
        except psycopg2.Error as exc:
            message = (exc.pgerror or str(exc)).strip().splitlines()[0]
            raise SnapshotRefused(
                f'backend "{backend}": backfill of "{name}": the --where condition is not '
                f"valid SQL for {'.'.join(matches[0])}: {message}; fix the condition "
                f"(it is ANDed to the chunk's WHERE, as in SELECT * FROM t WHERE (...))"
            ) from None
    return matches[0]


def _published(conn, publication: str, table_filter) -> List[Table]:
    """The publication's tables that pass include/exclude, sorted."""
    with conn.cursor() as cur:
        cur.execute(_PUBLISHED, (publication,))
        return [(s, t) for s, t in cur.fetchall() if table_filter.allows(s, t)]


def _unreadable(conn, publication: str, tables: List[Table], what: str) -> Optional[str]:
    """Why ``what`` cannot read some of ``tables`` (the problem and its fix), or None."""
    if conn.server_version >= 150000:
        with conn.cursor() as cur:
            cur.execute(_FILTERED_IN_PUBLICATION, (publication,))
            filtered = [f"{s}.{t}" for s, t in cur.fetchall() if (s, t) in set(tables)]
        if filtered:
            # SELECT * would hand out rows or columns the stream leaves out
            return (f"{what} cannot read {', '.join(filtered)}: publication "
                    f'"{publication}" streams only some of its rows or columns (a row filter '
                    f"or column list), which snapshots do not apply yet; leave the table out "
                    f"with exclude_tables, or publish it whole")
    keyless = [f"{s}.{t}" for s, t in tables if not primary_key(conn, s, t)]
    if keyless:
        return (f"{what} cannot read {', '.join(keyless)}: no primary key (snapshots read "
                f"tables in primary-key chunks); give it a primary key, or leave it out with "
                f"exclude_tables = {[*keyless]!r}".replace("'", '"'))
    return None


def _exists(conn, schema: str, table: str) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (qualified(schema, table),))
        # True, or "t" once bool is among the types this connection keeps as text
        return cur.fetchone()[0] in (True, "t")


def _raw_text(value, _cursor):
    """psycopg2 caster: the column's text exactly as the server sent it."""
    return value


class _TableShape:
    """One table's columns and key, and its values' converters, found once per process."""

    def __init__(self, names: List[str], oids: List[int], key: List[Tuple[str, str]],
                 converters: list):
        self.names = names
        self.key_names = [name for name, _ in key]
        self.key_types = [sqltype for _, sqltype in key]
        self.key_index = [names.index(name) for name in self.key_names]
        self.converters = converters
        self.oids = oids


class PgSnapshot(SnapshotRun):
    """One snapshot run of one PostgreSQL backend: the database half (see the module)."""

    def __init__(self, backend: str, options: dict, catalog, progress: SnapshotProgress,
                 log, encoded: bool = False):
        super().__init__(backend, options, progress, log, encoded)
        self.catalog = catalog          # the source's metadata connection (type look-ups)
        self.timeout_ms = int(self.timeout_seconds * 1000)
        self.shapes: Dict[Table, _TableShape] = {}

    # -- the database side ----------------------------------------------------------------

    def _connection(self):
        if self.conn is None or self.conn.closed:
            conn = connect(self.options, self.backend, f"lapidus_{self.backend}_snapshot")
            with conn.cursor() as cur:
                # READ COMMITTED: each chunk's SELECT sees what committed before it; the
                # decoders' value settings
                cur.execute("SET default_transaction_isolation = 'read committed'; "
                            "SET extra_float_digits = 3; SET bytea_output = 'hex'; "
                            f"SET statement_timeout = {self.timeout_ms}")
            self.conn = conn
            # the text casters of a table's types live on the connection: find them again
            self.shapes.clear()
        return self.conn

    def _shape(self, conn, schema: str, table: str) -> _TableShape:
        shape = self.shapes.get((schema, table))
        if shape is None:
            key = self.require_key(schema, table, primary_key(conn, schema, table))
            with conn.cursor() as cur:
                cur.execute(f"SELECT * FROM {qualified(schema, table)} LIMIT 0")
                names = [col.name for col in cur.description]
                oids = [col.type_code for col in cur.description]
                # keep the server's text for these types, on this connection only
                caster = psycopg2.extensions.new_type(tuple(set(oids)), "LAPIDUS_TEXT",
                                                      _raw_text)
                # (array columns have their own OIDs, in ``oids``: they stay text too)
                psycopg2.extensions.register_type(caster, conn)
                cur.execute("SELECT reltuples::int8 FROM pg_catalog.pg_class "
                            "WHERE oid = %s::regclass", (qualified(schema, table),))
                # int() because int8 may be one of the types kept as text above
                estimate = int(cur.fetchone()[0])
            self.progress.estimates[(schema, table)] = estimate if estimate >= 0 else None
            shape = _TableShape(names, oids, key, [self.catalog.converter(o) for o in oids])
            self.shapes[(schema, table)] = shape
        return shape

    def start_chunk(self) -> None:
        """The next chunk's SELECT, then its high watermark; the rows are held."""
        schema, table = self.progress.table
        where = f"{schema}.{table}"
        try:
            conn = self._connection()
            if (schema, table) not in self.shapes and not _exists(conn, schema, table):
                self._skip_dropped(schema, table)
                return
            shape = self._shape(conn, schema, table)
            # Opened before the SELECT: changes read from here on all evict (see
            # ..snapshot.window for why no low watermark is needed).
            window = self.open_window(schema, table, shape.key_names)
            mark = window.watermark
            sql, args = self._chunk_sql(schema, table, shape)
            with conn.cursor() as cur:
                if self.progress.where:
                    # the operator's condition runs where it cannot write
                    cur.execute("BEGIN READ ONLY")
                cur.execute(sql, args)
                raw = cur.fetchall()
                if self.progress.where:
                    cur.execute("COMMIT")
                cur.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                            (WATERMARK_PREFIX, f"{mark}:high"))
        except psycopg2.errors.UndefinedTable:
            self.close()            # a read-only transaction may be left aborted
            self._skip_dropped(schema, table)
            return
        except psycopg2.errors.QueryCanceled:
            self.window = None
            raise BackendError(
                f'backend "{self.backend}": a snapshot chunk of {where} '
                f"({self.chunk_rows} rows) took longer than snapshot_chunk_timeout "
                f"({self.timeout_ms / 1000:g} s); make snapshot_chunk_rows smaller or "
                f"snapshot_chunk_timeout larger", fatal=True) from None
        except psycopg2.Error as exc:
            self.window = None
            self.close()
            raise query_error(exc, self.options, self.backend,
                              f"reading a snapshot chunk of {where}") from None
        window.hold_keyed(self._lines(shape, raw, schema, table) if self.encoded
                          else self._rows(shape, raw),
                          [raw[-1][i] for i in shape.key_index] if raw else None)

    def _skip_dropped(self, schema: str, table: str) -> None:
        self.shapes.pop((schema, table), None)
        self.skip_table(schema, table)

    def _chunk_sql(self, schema: str, table: str, shape: _TableShape):
        keys = ", ".join(_quote(name) for name in shape.key_names)
        sql = f"SELECT * FROM {qualified(schema, table)}"
        args: Sequence[Any] = ()
        conditions = []
        last = self.progress.last_key
        if last is not None:
            # keyset: the row-value comparison orders exactly like ORDER BY over the key
            casts = ", ".join(f"%s::{sqltype}" for sqltype in shape.key_types)
            conditions.append(f"({keys}) > ({casts})")
            args = tuple(last)
        if self.progress.where:
            # a backfill's --where, in parentheses so its OR cannot escape the keyset; its
            # % are the operator's (LIKE 'a%'), not placeholders
            conditions.append("(" + self.progress.where.replace("%", "%%") + ")")
        if conditions:
            sql += " WHERE " + " AND ".join(conditions)
        sql += f" ORDER BY {keys} LIMIT {self.chunk_rows}"
        return sql, args

    @staticmethod
    def _rows(shape: _TableShape, raw) -> List[Tuple[str, Tuple[dict, dict]]]:
        return chunk_rows(raw, shape.names, shape.converters, shape.key_index)

    def _lines(self, shape: _TableShape, raw, schema: str, table: str) -> list:
        """The rows of an ``encoded`` run, under their key text: ``(pk text, (event id,
        record key, line))`` (:meth:`SnapshotRun.lines`)."""
        if not raw:
            return []
        columns, keys = chunk_columns(raw, shape.converters, shape.key_index)
        return self.lines(schema, table, columns, shape.names, shape.key_index, keys)

    # -- the stream side ------------------------------------------------------------------

    def feed(self, message, feed, events: List, assembler) -> bool:
        """Look at one decoded message before the assembler does.

        Returns True when the batch must end here (a chunk's rows were just appended: the
        checkpoint after them is the one that carries the new progress).
        """
        kind = message.__class__
        if kind is Watermark:
            return self._watermark(message.content, events, assembler)
        if kind is Change and self.window is not None and message.type != "message":
            self.saw(message.schema, message.table, message.type, message.pk, message.before)
        feed(message, events)
        return False

    def _watermark(self, content: str, events: List, assembler) -> bool:
        window = self.window
        if window is None or window.watermark_kind(content) != "high":
            return False            # one of a chunk given up before
        self.emit_window(events, assembler.tx_position or "", assembler.tx_ts)
        return True
