"""Events to SQL on the target: upserts, deletes and truncates by primary key.

Runs in the dispatcher process, in the sync sink's worker thread, inside a target transaction
the caller opened (:mod:`lapidus.sinks.sync`).  Values are never converted in Python: the
events' JSON goes to PostgreSQL as one ``jsonb`` parameter per statement, and each column is
taken out of it and cast to the target column's own type there (``numeric`` from its exact
string, ``bytea`` from base64, ``timestamptz`` from RFC 3339, arrays from JSON arrays, json
as json).  That keeps every digit (a JSON number inside a json column never meets a float) and
lets the target's types decide.

Consecutive events of the same kind, table and column set become one statement, as long as no
key repeats inside it (``ON CONFLICT DO UPDATE`` may touch a row once per statement); order
between different keys does not matter, and order per key is kept.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import orjson
from psycopg2 import sql

from ...events import Record
from . import ddl, mysql_ddl, tables
from .options import SyncOptions
from .tables import TableInfo


class Refused(Exception):
    """The target refuses one event for good (a constraint, a type, a missing column)."""

    def __init__(self, index: int, reason: str, fix: str):
        super().__init__(reason)
        self.index, self.reason, self.fix = index, reason, fix


# Each event's item, pk and before are taken out of it once per row, not once per column.
ROWS = sql.SQL("(SELECT v->'item' AS item, v->'pk' AS pk, v->'before' AS before "
               "FROM jsonb_array_elements(%s::jsonb) AS e(v)) AS r")


def _text(path: str, source: str) -> sql.Composable:
    return sql.SQL("(r.{}->>{})").format(sql.Identifier(path), sql.Literal(source))


def value_expr(column: tables.Column, source: str, path: str = "item") -> sql.Composable:
    """SQL taking ``source`` out of the event's ``path`` (item, pk, before: columns of
    :data:`ROWS`) as ``column``'s type."""
    node = sql.SQL("(r.{}->{})").format(sql.Identifier(path), sql.Literal(source))
    if column.kind == "bytea":
        return sql.SQL("decode({}, 'base64')").format(_text(path, source))
    if column.kind in ("json", "jsonb"):
        expr = sql.SQL("NULLIF({}, 'null'::jsonb)").format(node)
        return expr if column.kind == "jsonb" else sql.SQL("({})::json").format(expr)
    if column.kind == "array":
        # JSON array -> PostgreSQL's array text -> the column's type (one dimension); the
        # array's text form, when an event carries one, is cast as it is
        return sql.SQL("(CASE jsonb_typeof({n}) WHEN 'array' THEN "
                       "(ARRAY(SELECT jsonb_array_elements_text({n})))::text "
                       "WHEN 'string' THEN {n} #>> '{{}}' END)::{t}").format(
            n=node, t=sql.SQL(column.type_sql))
    return sql.SQL("{}::{}").format(_text(path, source), sql.SQL(column.type_sql))


class Applier:
    """Applies the events of one backend; keeps the target tables' descriptions."""

    @staticmethod
    def decode(record: Record) -> dict:
        """The event's fields, for the names, keys and column sets (values stay in the JSON)."""
        return orjson.loads(record.data)

    def __init__(self, options: SyncOptions, backend: str, log):
        self.options = options
        self.backend = backend
        self.log = log
        self.infos: Dict[Tuple[str, str], TableInfo] = {}
        self.declared: Dict[Tuple[str, str], list] = {}   # columns named by schema events
        self.mysql = False                                  # set by the sink from positions

    # -- names ------------------------------------------------------------------------------

    def target_name(self, schema: Optional[str], table: str) -> Tuple[str, str]:
        mapping = self.options.table_map(schema, table)
        target_schema = self.options.schema or (self.backend if self.mysql else schema) \
            or "public"
        return target_schema, mapping.table or table

    def column_names(self, schema: Optional[str], table: str) -> Dict[str, str]:
        return self.options.table_map(schema, table).columns

    def forget(self, target: Optional[Tuple[str, str]] = None) -> None:
        if target is None:
            self.infos.clear()
        else:
            self.infos.pop(target, None)

    def info(self, cur, record: Record, event: dict, index: int) -> TableInfo:
        target = self.target_name(record.schema, record.table)
        info = self.infos.get(target)
        if info is None:
            info = self.describe(cur, *target)
            if info is None:
                info = self._create(cur, record, event, target, index)
            self.infos[target] = info
        return info

    def _create(self, cur, record: Record, event: dict, target, index: int) -> TableInfo:
        label = f"{target[0]}.{target[1]}"
        if not self.options.create_tables:
            raise Refused(index, f"sync: target table {label} does not exist (event {record.id})",
                          "create it, or set create_tables = true")
        renames = self.column_names(record.schema, record.table)
        pk = [renames.get(k, k) for k in (event.get("pk") or {})]
        if not pk:
            raise Refused(index, f"sync: cannot create {label}: the source table "
                                 f"{record.schema}.{record.table} has no primary key",
                          "give the source table a primary key, or create the target table "
                          "yourself")
        declared = self.declared.get((record.schema, record.table))
        if declared:
            columns = [(renames.get(c["name"], c["name"]), c["type"]) for c in declared]
        else:
            item = event.get("item") or event.get("pk") or {}
            columns = [(renames.get(k, k), self.inferred_type(v)) for k, v in item.items()]
        self.create_table(cur, target[0], target[1], columns, pk)
        self.log.info("sync: created the target table", table=label,
                      types="from a schema event" if declared else "inferred from values")
        return self.describe(cur, *target)

    # -- what a target of another kind does its own way (mysql_apply.MysqlApplier) ----------

    describe = staticmethod(tables.describe)
    inferred_type = staticmethod(tables.inferred_type)

    def create_table(self, cur, schema: str, table: str, columns, pk) -> None:
        """``columns``: (name, PostgreSQL type) pairs."""
        tables.create(cur, schema, table, columns, pk)

    def truncate(self, cur, info: TableInfo) -> None:
        cur.execute(sql.SQL("TRUNCATE {}").format(info.ident))

    # -- applying ---------------------------------------------------------------------------

    def apply(self, cur, records: Sequence[Record], events: Sequence[dict],
              indexes: Sequence[int]) -> None:
        """Apply ``records`` (decoded as ``events``) in order; ``indexes`` are their places in
        the delivery, for :class:`Refused`."""
        run: List[tuple] = []
        run_shape: Optional[tuple] = None
        run_keys: set = set()
        for record, event, index in zip(records, events, indexes):
            kind = record.type
            if kind in ("insert", "update", "read", "replace", "delete"):
                if record.table is None:
                    continue
                info = self.info(cur, record, event, index)
                if kind == "delete":
                    shape = ("delete", info.label)
                else:
                    unchanged = event.get("unchanged")
                    item = event.get("item") or {}
                    cols = tuple(k for k in item if not unchanged or k not in unchanged)
                    shape = (kind == "read", info.label, cols)
                    if self._moved_key(info, record, event):
                        self._flush(cur, run, run_shape)
                        run, run_shape, run_keys = [], None, set()
                        if self._move(cur, info, record, cols, index):
                            continue
                if shape != run_shape or record.key in run_keys:
                    self._flush(cur, run, run_shape)
                    run, run_shape, run_keys = [], shape, set()
                run.append((record, index, info))
                run_keys.add(record.key)
                continue
            self._flush(cur, run, run_shape)
            run, run_shape, run_keys = [], None, set()
            if kind == "truncate" and record.table is not None:
                self.truncate(cur, self.info(cur, record, event, index))
            elif kind == "schema":
                self._schema(cur, record, event, index)
            elif kind == "gap":
                self.log.warning("sync: the source reports a gap; the target misses the "
                                 "changes in it", id=record.id)
        self._flush(cur, run, run_shape)

    def _moved_key(self, info: TableInfo, record: Record, event: dict) -> bool:
        """An update that changed the primary key: the row under the old key goes first."""
        before = event.get("before")
        if record.type != "update" or not before:
            return False
        item = event.get("item") or {}
        inverse = {t: s for s, t in self.column_names(record.schema, record.table).items()}
        for k in info.pk:
            source = inverse.get(k, k)
            if source in before and source in item and before[source] != item[source]:
                return True
        return False

    def _move(self, cur, info: TableInfo, record: Record, names, index: int) -> bool:
        """An update that changed the key, as an UPDATE of the row under the old key, so
        that columns the event does not carry (TOAST ``unchanged``) move with it; False when
        the target has no row under the old key (then it is an upsert)."""
        cols = self._columns(info, record, names, index)
        inverse = {t: s for s, t in self.column_names(record.schema, record.table).items()}
        cur.execute(sql.SQL("UPDATE {} AS t SET {} FROM {} WHERE {}").format(
            info.ident,
            sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(c.name),
                                                         value_expr(c, source))
                               for source, c in cols),
            ROWS,
            sql.SQL(" AND ").join(sql.SQL("t.{} = {}").format(
                sql.Identifier(k), value_expr(info.columns[k], inverse.get(k, k), "before"))
                for k in info.pk)),
            (self._payload([record]),))
        return cur.rowcount > 0

    def _flush(self, cur, run: list, shape: Optional[tuple]) -> None:
        if not run:
            return
        info = run[0][2]
        if shape[0] == "delete":
            self._delete(cur, info, [(r, i) for r, i, _ in run], "pk", run[0][0])
        else:
            self._upsert(cur, info, run, shape[2], distinct=shape[0] is True)

    def _columns(self, info: TableInfo, record: Record, names: Sequence[str], index: int):
        renames = self.column_names(record.schema, record.table)
        out = []
        for source in names:
            target = renames.get(source, source)
            column = info.columns.get(target)
            if column is None:
                raise Refused(index, f"sync: the target table {info.label} has no column "
                                     f"{target!r} (event {record.id})",
                              f"add the column to {info.label}, or map it with "
                              f"tables.{record.table}.columns")
            out.append((source, column))
        return out

    def _payload(self, records) -> str:
        return "[" + ",".join(r.data.decode("utf-8") for r in records) + "]"

    @staticmethod
    def _keyed(info: TableInfo, first: Record, index: int) -> None:
        if not info.pk:
            raise Refused(index, f"sync: the target table {info.label} has no primary key "
                                 f"(event {first.id})", f"give {info.label} a primary key")

    def _upsert_columns(self, info: TableInfo, run: list, names: Sequence[str]):
        """The (source, column) pairs of an upsert's run, and the target column names; the
        run refused when the target has no key, or the events no value for it."""
        first, index = run[0][0], run[0][1]
        self._keyed(info, first, index)
        cols = self._columns(info, first, names, index)
        targets = [c.name for _, c in cols]
        missing = [k for k in info.pk if k not in targets]
        if missing:
            raise Refused(index, f"sync: the event {first.id} has no value for the key "
                                 f"column(s) {', '.join(missing)} of {info.label}",
                          "make the target's primary key the source's")
        return cols, targets

    def _upsert(self, cur, info: TableInfo, run: list, names: Sequence[str],
                distinct: bool) -> None:
        cols, targets = self._upsert_columns(info, run, names)
        ident = sql.SQL(", ").join(map(sql.Identifier, targets))
        values = sql.SQL(", ").join(value_expr(c, s) for s, c in cols)
        rest = [t for t in targets if t not in info.pk]
        statement = sql.SQL("INSERT INTO {t} AS t ({c}) SELECT {v} FROM {r} "
                            "ON CONFLICT ({k}) ").format(
            t=info.ident, r=ROWS, c=ident, v=values,
            k=sql.SQL(", ").join(map(sql.Identifier, info.pk)))
        if rest:
            statement += sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(t)) for t in rest))
            if distinct:
                # a snapshot row read again after a crash changes nothing: no trigger fires
                # (compared as text: json, xml and point have no equality operator)
                statement += sql.SQL(" WHERE ({}) IS DISTINCT FROM ({})").format(
                    sql.SQL(", ").join(sql.SQL("t.{}::text").format(sql.Identifier(t))
                                       for t in rest),
                    sql.SQL(", ").join(sql.SQL("EXCLUDED.{}::text").format(sql.Identifier(t))
                                       for t in rest))
        else:
            statement += sql.SQL("DO NOTHING")
        cur.execute(statement, (self._payload(r for r, _, _ in run),))

    def _delete(self, cur, info: TableInfo, run: list, path: str, first: Record) -> None:
        self._keyed(info, first, run[0][1])
        renames = self.column_names(first.schema, first.table)
        back = {v: k for k, v in renames.items()}
        cond = sql.SQL(" AND ").join(
            sql.SQL("t.{} = {}").format(sql.Identifier(k),
                                        value_expr(info.columns[k], back.get(k, k), path))
            for k in info.pk)
        cur.execute(sql.SQL("DELETE FROM {} AS t USING {} WHERE {}").format(
            info.ident, ROWS, cond),
                    (self._payload(r for r, _ in run),))

    def _schema(self, cur, record: Record, event: dict, index: int) -> None:
        (mysql_ddl if self.mysql else ddl).apply(self, cur, record, event, index)

