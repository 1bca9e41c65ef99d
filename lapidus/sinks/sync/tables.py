"""Target tables as the sync sink sees them: columns, their types, the primary key.

Runs in the dispatcher process, in the sync sink's worker thread.  Read from the target's
catalog once per table and kept until a schema change (or an error) makes it stale.  Also
creates a missing target table (``create_tables``), with the types of a schema event when one
named them, else inferred conservatively from the first event's values (docs/sync.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from psycopg2 import sql


@dataclass
class Column:
    name: str
    type_sql: str        # format_type(): "numeric(12,2)", "timestamp with time zone", ...
    kind: str            # "bytea" | "json" | "jsonb" | "array" | "plain"


@dataclass
class TableInfo:
    schema: str
    name: str
    columns: Dict[str, Column]
    pk: List[str]

    @property
    def ident(self) -> sql.Composable:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(self.name))

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.name}"


_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typname, t.typcategory
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum"""

_PK = """
SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)"""


def _kind(typname: str, category: str) -> str:
    if category == "A":
        return "array"
    if typname in ("bytea", "json", "jsonb"):
        return typname
    return "plain"


def describe(cur, schema: str, table: str) -> Optional[TableInfo]:
    """The target table, or None when it does not exist."""
    cur.execute("SELECT to_regclass(quote_ident(%s) || '.' || quote_ident(%s))::oid",
                (schema, table))
    oid = cur.fetchone()[0]
    if oid is None:
        return None
    cur.execute(_COLUMNS, (oid,))
    columns = {name: Column(name, type_sql, _kind(typname, cat))
               for name, type_sql, typname, cat in cur.fetchall()}
    cur.execute(_PK, (oid,))
    return TableInfo(schema, table, columns, [r[0] for r in cur.fetchall()])


def inferred_type(value: Any) -> str:
    """The conservative target type for a value in its event form: nothing is lost (a
    NUMERIC's exact string stays text, base64 stays text), nothing guessed that could refuse a
    later row of another shape."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "numeric"          # any integer, also unsigned 64-bit ones
    if isinstance(value, float):
        return "double precision"
    if isinstance(value, (dict, list)):
        return "jsonb"
    return "text"


def create(cur, schema: str, table: str, columns: Sequence[tuple], pk: Sequence[str]) -> None:
    """``CREATE TABLE IF NOT EXISTS`` with ``columns`` as (name, type SQL) and key ``pk``."""
    cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    parts = [sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(type_sql))
             for name, type_sql in columns]
    if pk:
        parts.append(sql.SQL("PRIMARY KEY ({})").format(
            sql.SQL(", ").join(map(sql.Identifier, pk))))
    cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}.{} ({})").format(
        sql.Identifier(schema), sql.Identifier(table), sql.SQL(", ").join(parts)))
