"""Events to SQL on a MySQL/MariaDB target: upserts (``INSERT ... ON DUPLICATE KEY UPDATE``),
deletes and truncates by primary key.

Runs in the dispatcher process, in the sync sink's worker thread, inside the InnoDB transaction
the sink opened (:mod:`lapidus.sinks.sync`).  The grouping of events into statements, the
names and the key handling are :class:`.apply.Applier`'s; what differs is that MySQL cannot
take values out of a JSON parameter by the column's type the way PostgreSQL does, so each
value is converted here, by the target column's type, from the event's exact form:

* events are parsed with exact numbers (an event with a JSON number that has a fraction is
  parsed again with ``Decimal``s: a JSON column's number never meets a float); a DECIMAL
  column gets the digits, a JSON column the JSON text with the same digits;
* BLOB and BINARY columns the bytes of the base64 string; DATETIME and TIMESTAMP columns the
  RFC 3339 time in UTC (the session's zone) without its offset; SET columns the array joined;
  objects and arrays (PostgreSQL arrays) into other columns their JSON text.

Schema events are not applied (a DDL commits the transaction it runs in, which would break the
exactly-once record): one that leaves the target as it is passes, any other is refused, named,
with the fix (change the target by hand).  Tables are created (``create_tables``) on a
connection of their own for the same reason.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from decimal import Decimal
from typing import Dict, List, Optional, Sequence

import orjson

from ...events import Record
from . import tables
from .apply import Applier, Refused
from .mysql_types import mysql_type
from .tables import Column, TableInfo

_BINARY = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
_TEMPORAL = {"datetime", "timestamp"}
_MYSQL_DDL = re.compile(r"^\s*(?:ALTER|DROP|RENAME)\s+(?:ONLINE\s+|IGNORE\s+|TEMPORARY\s+)*"
                        r"TABLES?\b", re.I)


def ident(*names: str) -> str:
    return ".".join("`" + n.replace("`", "``") + "`" for n in names)


def _exact(value):
    if isinstance(value, Decimal):
        return orjson.Fragment(str(value))      # the number's own digits, as they came
    raise TypeError(f"not JSON: {type(value).__name__}")


def json_text(value) -> str:
    """JSON text of a value parsed with exact numbers (``Decimal`` keeps its digits)."""
    return orjson.dumps(value, default=_exact).decode()


def _has_float(value) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return False


def utc_datetime(text: str) -> str:
    """An RFC 3339 time as a MySQL DATETIME literal in UTC; the text itself when it is not
    one (a zero date, ``infinity``: the server keeps or refuses it)."""
    try:
        moment = dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return text
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return moment.isoformat(" ")


def convert(column: Column, value):
    """``value`` (event form) as the parameter for ``column`` (a MySQL column)."""
    if value is None:
        return None
    kind = column.kind
    if kind == "json":
        return json_text(value)
    if isinstance(value, (dict, list)):
        return ",".join(map(str, value)) if kind == "set" else json_text(value)
    if isinstance(value, str):
        if kind == "binary":
            try:
                return base64.b64decode(value, validate=True)
            except ValueError:
                return value        # refused by the server if it is not the column's
        if kind == "datetime":
            return utc_datetime(value)
    if isinstance(value, bool):
        return int(value)
    return value


def describe(cur, schema: str, table: str) -> Optional[TableInfo]:
    """The target table from ``information_schema``, or None when it does not exist."""
    cur.execute("SELECT COLUMN_NAME, COLUMN_TYPE, DATA_TYPE, EXTRA FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                (schema, table))
    rows = cur.fetchall()
    if not rows:
        return None
    # MariaDB's JSON is LONGTEXT with a json_valid() check: find those columns
    json_columns = set()
    try:
        cur.execute("SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS WHERE "
                    "CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s", (schema, table))
        for (clause,) in cur.fetchall():
            json_columns.update(re.findall(r"json_valid\(`((?:[^`]|``)+)`\)", clause or "", re.I))
    except Exception:       # Oracle MySQL: no TABLE_NAME there, and a real JSON type anyway
        pass
    columns = {}
    for name, column_type, data_type, extra in rows:
        if "GENERATED" in (extra or "").upper():
            continue        # computed by the target itself
        data_type = data_type.lower()
        kind = ("binary" if data_type in _BINARY else
                "json" if data_type == "json" or name in json_columns else
                "datetime" if data_type in _TEMPORAL else "set" if data_type == "set" else
                "plain")
        columns[name] = Column(name, column_type, kind)
    cur.execute("SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
                "AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
                (schema, table))
    return TableInfo(schema, table, columns, [r[0] for r in cur.fetchall()])


class MysqlApplier(Applier):
    """:class:`.apply.Applier` with MySQL's statements and value conversion."""

    describe = staticmethod(describe)
    _events: Dict[int, dict] = {}

    @staticmethod
    def decode(record: Record) -> dict:
        """The event with exact numbers: orjson's (fast) where it has no float, whose digits
        a float may have rounded (a JSON column's number); else ``Decimal``s."""
        try:
            event = orjson.loads(record.data)
        except orjson.JSONDecodeError:      # an integer beyond 64 bits
            return json.loads(record.data, parse_float=Decimal)
        if any(_has_float(event.get(path)) for path in ("item", "before", "pk")):
            return json.loads(record.data, parse_float=Decimal)
        return event

    @staticmethod
    def inferred_type(value) -> str:
        # any 64-bit integer, signed or not, as an integer type MySQL can index
        if isinstance(value, int) and not isinstance(value, bool):
            return "numeric(20,0)"
        return tables.inferred_type(value)

    def create_table(self, cur, schema: str, table: str, columns, pk) -> None:
        """On a connection of its own: a DDL would commit the applying transaction."""
        import pymysql
        from .mysql_target import connect_args
        parts = [f"{ident(name)} {mysql_type(type_sql, key=name in pk)}"
                 for name, type_sql in columns]
        parts.append(f"PRIMARY KEY ({', '.join(ident(k) for k in pk)})")
        conn = pymysql.connect(**dict(connect_args(self.options.dsn,
                                                   self.options.connect_timeout),
                                      autocommit=True))
        try:
            with conn.cursor() as ddl:
                ddl.execute(f"CREATE DATABASE IF NOT EXISTS {ident(schema)}")
                ddl.execute(f"CREATE TABLE IF NOT EXISTS {ident(schema, table)} "
                            f"({', '.join(parts)}) ENGINE=InnoDB")
        finally:
            conn.close()

    def apply(self, cur, records: Sequence[Record], events: Sequence[dict],
              indexes: Sequence[int]) -> None:
        # the statements take their values from the events decoded already, not again
        self._events = {id(r): e for r, e in zip(records, events)}
        try:
            super().apply(cur, records, events, indexes)
        finally:
            self._events = {}

    def truncate(self, cur, info: TableInfo) -> None:
        # TRUNCATE is a DDL in MySQL (it commits): a DELETE stays in the transaction
        cur.execute(f"DELETE FROM {ident(info.schema, info.name)}")

    def _values(self, info: TableInfo, cols, record: Record, path: str = "item") -> list:
        event = self._events.get(id(record)) or self.decode(record)
        image = event.get(path) or {}
        return [convert(c, image.get(source)) for source, c in cols]

    def _key(self, info: TableInfo, record: Record) -> List[tuple]:
        back = {v: k for k, v in self.column_names(record.schema, record.table).items()}
        return [(back.get(k, k), info.columns[k]) for k in info.pk]

    def _upsert(self, cur, info: TableInfo, run: list, names: Sequence[str],
                distinct: bool) -> None:
        cols, targets = self._upsert_columns(info, run, names)
        rest = [t for t in targets if t not in info.pk] or info.pk[:1]
        statement = (f"INSERT INTO {ident(info.schema, info.name)} "
                     f"({', '.join(map(ident, targets))}) VALUES "
                     f"({', '.join(['%s'] * len(targets))}) ON DUPLICATE KEY UPDATE "
                     + ", ".join(f"{ident(t)} = VALUES({ident(t)})" for t in rest))
        cur.executemany(statement, [self._values(info, cols, r) for r, _, _ in run])

    def _delete(self, cur, info: TableInfo, run: list, path: str, first: Record) -> None:
        self._keyed(info, first, run[0][1])
        key = self._key(info, first)
        cur.executemany(f"DELETE FROM {ident(info.schema, info.name)} WHERE "
                        + " AND ".join(f"{ident(c.name)} = %s" for _, c in key),
                        [self._values(info, key, r, path) for r, _ in run])

    def _move(self, cur, info: TableInfo, record: Record, names, index: int) -> bool:
        cols = self._columns(info, record, names, index)
        key = self._key(info, record)
        cur.execute(f"UPDATE {ident(info.schema, info.name)} SET "
                    + ", ".join(f"{ident(c.name)} = %s" for _, c in cols) + " WHERE "
                    + " AND ".join(f"{ident(c.name)} = %s" for _, c in key),
                    self._values(info, cols, record) + self._values(info, key, record, "before"))
        return cur.rowcount > 0     # rows found (CLIENT.FOUND_ROWS), changed or not

    def _schema(self, cur, record: Record, event: dict, index: int) -> None:
        if record.table is None:
            return
        item = event.get("item") or {}
        target = self.target_name(record.schema, record.table)
        label = f"{target[0]}.{target[1]}"
        info = self.describe(cur, *target)
        fix = (f"change {label} by hand to match the source (the event then passes), or set it "
               f"aside with on_undeliverable = \"dead_letter\"")
        why = ("schema changes are not applied to a MySQL/MariaDB target (a DDL commits "
               "the transaction it runs in)")
        if self.mysql:
            statement = str(item.get("sql") or "")
            if info is not None and _MYSQL_DDL.match(statement):
                raise Refused(index, f"sync: the schema change {record.id} ({statement[:80]!r}) "
                                     f"is not applied to {label}: {why}", fix)
            return
        if not str(item.get("object_type") or "table").startswith("table"):
            return
        columns = item.get("columns")
        if columns is None:
            if info is not None and "DROP" in str(item.get("command", "")).upper():
                raise Refused(index, f"sync: the source dropped {record.schema}."
                                     f"{record.table} ({record.id}); {label} is kept: {why}",
                              f"drop {label} by hand (the event then passes)")
            return
        self.declared[(record.schema, record.table)] = columns
        if info is None:
            return      # created at its first row, with these types
        renames = self.column_names(record.schema, record.table)
        wanted: Dict[str, str] = {renames.get(c["name"], c["name"]): c["type"] for c in columns}
        if set(wanted) != set(info.columns):
            raise Refused(index, f"sync: the schema change {record.id} makes the columns of "
                                 f"{record.schema}.{record.table} ({', '.join(wanted)}); "
                                 f"{label} has ({', '.join(info.columns)}): {why}", fix)
        self.forget(target)
