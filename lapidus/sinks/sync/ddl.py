"""Schema events of a PostgreSQL source, applied to the target in their place in the stream.

Runs in the dispatcher process, in the sync sink's worker thread, inside the target
transaction of the source transaction the DDL committed in.  The event's ``columns`` (the
table's columns after the statement) are compared with the target table's: columns the
source lost are dropped, columns it gained are added with the source's type, a changed type
is altered (``USING col::type``).  A rename is applied only when it is unambiguous: the DDL
capture's statement says ``RENAME [COLUMN] a TO b``, or a relation event names the table it
was renamed from.  Anything else that cannot be made to match (a drop and an add of one type
that may have been a rename, a type the target does not know) is refused with the reason, so
the backend holds at it (or dead-letters it) rather than guessing.

Comparing with the target, rather than replaying the statement, makes it idempotent: a target
already changed by hand to match passes, which is also the fix for a refused change.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, List

from psycopg2 import sql

from ...events import Record
from . import tables

if TYPE_CHECKING:
    from .apply import Applier

_RENAME_COLUMN = re.compile(r"\bRENAME\s+(?:COLUMN\s+)?(\"[^\"]+\"|\w+)\s+TO\s+(\"[^\"]+\"|\w+)",
                            re.I)
_SAFE_TYPE = re.compile(r"^[\w\s\"(),.\[\]]+$")


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def apply(applier: "Applier", cur, record: Record, event: dict, index: int) -> None:
    from .apply import Refused
    item = event.get("item") or {}
    # a column rename reports the object type "table column"; "table constraint" etc. bring
    # the columns too, and comparing them changes nothing
    if record.table is None or not str(item.get("object_type") or "table").startswith("table"):
        return   # an index, a function, a type ...: nothing a replica of rows needs
    columns = item.get("columns")
    key = (record.schema, record.table)
    target = applier.target_name(record.schema, record.table)
    label = f"{target[0]}.{target[1]}"
    renames = applier.column_names(record.schema, record.table)

    def refuse(reason: str, fix: str):
        raise Refused(index, f"sync: cannot apply the schema change {record.id} to {label}: "
                             f"{reason}", fix)

    if item.get("command") == "DROP TABLE" or (columns is None and "DROP" in
                                               str(item.get("command", "")).upper()):
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}.{}").format(*map(sql.Identifier, target)))
        applier.forget(target)
        applier.declared.pop(key, None)
        return
    if not columns:
        return
    for column in columns:
        if not _SAFE_TYPE.match(str(column.get("type", ""))):
            refuse(f"the type {column.get('type')!r} of column {column.get('name')!r} is not "
                   f"one the sink can write", "change the target table by hand to match")
    applier.declared[key] = columns
    if item.get("renamed_from"):
        old = applier.target_name(record.schema, str(item["renamed_from"]).split(".")[-1])
        if tables.describe(cur, *old) is not None and tables.describe(cur, *target) is None:
            cur.execute(sql.SQL("ALTER TABLE {}.{} RENAME TO {}").format(
                sql.Identifier(old[0]), sql.Identifier(old[1]), sql.Identifier(target[1])))
            applier.forget(old)
    applier.forget(target)
    info = tables.describe(cur, *target)
    if info is None:
        return     # created at its first row, with these types (create_tables)
    wanted: Dict[str, str] = {renames.get(c["name"], c["name"]): c["type"] for c in columns}
    have = info.columns
    gone: List[str] = [n for n in have if n not in wanted]
    new: List[str] = [n for n in wanted if n not in have]
    statements = []
    stmt = str(item.get("sql") or "")
    for m in _RENAME_COLUMN.finditer(stmt):
        a, b = (renames.get(_unquote(x), _unquote(x)) for x in m.groups())
        if a in gone and b in new:
            statements.append(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
                info.ident, sql.Identifier(a), sql.Identifier(b)))
            gone.remove(a)
            new.remove(b)
    if gone and new and item.get("source") == "relation":
        refuse(f"columns {', '.join(gone)} went and {', '.join(new)} came in one change: a "
               f"rename or a drop and an add cannot be told apart without the DDL capture",
               "change the target table by hand (rename or drop/add), or install the DDL "
               "capture (lapidusctl install-ddl-capture)")
    for name in gone:
        if name in info.pk:
            refuse(f"the key column {name!r} would be dropped", "change the target by hand")
        statements.append(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(
            info.ident, sql.Identifier(name)))
    for name in new:
        statements.append(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
            info.ident, sql.Identifier(name), sql.SQL(wanted[name])))
    for name, type_sql in wanted.items():
        if name in have and name not in new and _norm(have[name].type_sql) != _norm(type_sql):
            statements.append(sql.SQL("ALTER TABLE {} ALTER COLUMN {c} TYPE {t} USING {c}::{t}")
                              .format(info.ident, c=sql.Identifier(name), t=sql.SQL(type_sql)))
    for statement in statements:
        cur.execute(statement)
    applier.forget(target)
    if statements:
        applier.log.info("sync: applied a schema change", table=label, id=record.id,
                         statements=len(statements))


def _norm(type_sql: str) -> str:
    return re.sub(r"\s+", " ", type_sql.strip().lower())
