"""Schema events of a MySQL/MariaDB source, applied to the target in their place in the stream.

Runs in the dispatcher process, in the sync sink's worker thread, inside the target
transaction of the source transaction the DDL is (a MySQL DDL is a transaction of its own).
A MySQL schema event carries the statement only (``item.sql``), so the statement is read:

* ``ALTER TABLE``: ``ADD``, ``DROP``, ``RENAME COLUMN``, ``CHANGE`` and ``MODIFY`` of columns
  become the same changes of the target table (types mapped by :mod:`.mysql_types`);
  ``RENAME [TO]`` renames the target table; clauses that do not change what a row is
  (indexes, foreign keys, checks, defaults, engine, charset, comments, partitions) are
  ignored; ``ADD PRIMARY KEY`` passes when the target's key is those columns already.
* ``RENAME TABLE a TO b, ...`` and ``DROP TABLE`` rename and drop the target tables.
* ``CREATE TABLE`` gives the types of a table the sink creates at its first row
  (``create_tables``), instead of types inferred from the row's values.
* Other statements (indexes, views, routines, databases) change no replicated row: ignored.

Every change is checked against the target first (a column to add that is there, one to
drop or rename that is gone already, passes), so a target changed by hand to match makes a
refused event pass.  Whatever cannot be applied for sure (a clause not understood, a type
without a mapping, a key column dropped, a changed primary key) is refused, named, with the
fix (:class:`.apply.Refused`: the backend's ``on_undeliverable`` decides).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, List, Optional, Tuple

from psycopg2 import sql

from ...events import Record
from . import tables
from .mysql_types import pg_type

if TYPE_CHECKING:
    from .apply import Applier

_IDENT = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_NAME = rf"{_IDENT}(?:\s*\.\s*{_IDENT})?"
_COMMENTS = re.compile(r"/\*.*?\*/|#[^\n]*|--\s[^\n]*", re.S)
_ALTER = re.compile(rf"^\s*ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+(?:IF\s+EXISTS\s+)?"
                    rf"({_NAME})\s*(.*)$", re.I | re.S)
_CREATE = re.compile(rf"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMPORARY\s+)?TABLE\s+"
                     rf"(?:IF\s+NOT\s+EXISTS\s+)?({_NAME})\s*\((.*)\)[^)]*$", re.I | re.S)
_DROP = re.compile(r"^\s*DROP\s+(?:TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.*?)"
                   r"(?:\s+(?:RESTRICT|CASCADE))?\s*$", re.I | re.S)
_RENAME = re.compile(r"^\s*RENAME\s+TABLES?\s+(.*)$", re.I | re.S)

# ALTER TABLE clauses, matched at the clause's start
_ADD_COLUMN = re.compile(rf"^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?({_IDENT})\s+(.+)$",
                         re.I | re.S)
_DROP_COLUMN = re.compile(rf"^DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_IDENT})"
                          rf"(?:\s+(?:RESTRICT|CASCADE))?$", re.I | re.S)
_RENAME_COLUMN = re.compile(rf"^RENAME\s+COLUMN\s+(?:IF\s+EXISTS\s+)?({_IDENT})\s+TO\s+"
                            rf"({_IDENT})$", re.I | re.S)
_CHANGE = re.compile(rf"^CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_IDENT})\s+({_IDENT})"
                     rf"\s+(.+)$", re.I | re.S)
_MODIFY = re.compile(rf"^MODIFY\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?({_IDENT})\s+(.+)$",
                     re.I | re.S)
_ADD_LIST = re.compile(r"^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?\(", re.I)
_RENAME_TO = re.compile(rf"^RENAME\s+(?:TO\s+|AS\s+)?({_NAME})$", re.I | re.S)
_ADD_PK = re.compile(r"^ADD\s+(?:CONSTRAINT\s+(?:\S+\s+)?)?PRIMARY\s+KEY\s*"
                     r"(?:USING\s+\w+\s*)?\((.*)\)", re.I | re.S)
_DROP_PK = re.compile(r"^DROP\s+PRIMARY\s+KEY$", re.I)
# clauses that change no row: keys and indexes, constraints, defaults, table options
_NO_ROW_CHANGE = re.compile(
    r"^(?:ADD\s+(?:CONSTRAINT\b|UNIQUE\b|INDEX\b|KEY\b|FULLTEXT\b|SPATIAL\b|FOREIGN\b|CHECK\b"
    r"|PERIOD\b|SYSTEM\s+VERSIONING\b|PARTITION\b)"
    r"|DROP\s+(?:INDEX|KEY|FOREIGN|CONSTRAINT|CHECK|PARTITION|SYSTEM\s+VERSIONING)\b"
    r"|ALTER\s+(?:COLUMN\s+)?\S+\s+(?:SET\s+DEFAULT|DROP\s+DEFAULT|SET\s+(?:IN)?VISIBLE)"
    r"|ALTER\s+(?:INDEX|KEY)\b|RENAME\s+(?:INDEX|KEY)\b|ENABLE\s+KEYS|DISABLE\s+KEYS"
    r"|ORDER\s+BY\b|FORCE\b|ALGORITHM\b|LOCK\b|WAIT\b|NOWAIT\b|VALIDATION\b|WITH(?:OUT)?\s+"
    r"VALIDATION|(?:DEFAULT\s+)?(?:CHARACTER\s+SET|CHARSET|COLLATE)\b|CONVERT\s+TO\b"
    r"|ENGINE\b|AUTO_INCREMENT\b|COMMENT\b|ROW_FORMAT\b|KEY_BLOCK_SIZE\b|STATS_\w+\b"
    r"|PAGE_\w+\b|CHECKSUM\b|PACK_KEYS\b|TRANSACTIONAL\b|ENCRYPT\w*\b|(?:RE)?PARTITION\w*\b"
    r"|COALESCE\s+PARTITION|TRUNCATE\s+PARTITION|ANALYZE\s+PARTITION|(?:DATA|INDEX)\s+"
    r"DIRECTORY|INSERT_METHOD|MIN_ROWS|MAX_ROWS|AVG_ROW_LENGTH|DELAY_KEY_WRITE|UNION\b)",
    re.I)
_NOT_A_COLUMN = re.compile(r"^(?:PRIMARY\s+KEY|UNIQUE|INDEX|KEY|FULLTEXT|SPATIAL|CONSTRAINT|"
                           r"FOREIGN\s+KEY|CHECK|PERIOD)\b", re.I)


def unquote(name: str) -> str:
    name = name.strip()
    if name.startswith("`") and name.endswith("`"):
        return name[1:-1].replace("``", "`")
    return name


def _table_name(name: str) -> Tuple[Optional[str], str]:
    parts = re.findall(_IDENT, name)
    return (unquote(parts[0]), unquote(parts[1])) if len(parts) == 2 else (None, unquote(parts[0]))


def split_top(text: str) -> List[str]:
    """``text`` cut at the commas outside parentheses, quotes and backquotes."""
    parts, depth, quote, start = [], 0, "", 0
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote != "`":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _key_columns(text: str) -> List[str]:
    # a key part may carry a prefix length or an order: `name`(10) DESC
    return [unquote(re.match(rf"\s*({_IDENT})", part).group(1)) for part in split_top(text)]


class _Change:
    """The target changes of one statement, checked against the target as they are built."""

    def __init__(self, applier: "Applier", cur, record: Record, index: int):
        from .apply import Refused
        self.applier, self.cur, self.record, self.index = applier, cur, record, index
        self.Refused = Refused
        self.renames = applier.column_names(record.schema, record.table or "")
        self.target = applier.target_name(record.schema, record.table or "")
        self.label = f"{self.target[0]}.{self.target[1]}"

    def refuse(self, reason: str, fix: str):
        raise self.Refused(self.index, f"sync: cannot apply the schema change {self.record.id} "
                                       f"to {self.label}: {reason}", fix)

    def column(self, name: str) -> str:
        name = unquote(name)
        return self.renames.get(name, name)

    def mapped(self, name: str, definition: str) -> str:
        type_sql = pg_type(definition)
        if type_sql is None:
            self.refuse(f"the type of column {unquote(name)!r} ({definition.split()[0]}) has "
                        f"no PostgreSQL mapping",
                        f"add or change the column in {self.label} by hand (the event then "
                        f"passes)")
        return type_sql


def apply(applier: "Applier", cur, record: Record, event: dict, index: int) -> None:
    """Apply the schema event ``record`` of a MySQL/MariaDB source (see the module)."""
    statement = _COMMENTS.sub(" ", str((event.get("item") or {}).get("sql") or "")).strip()
    statement = statement.rstrip(";").strip()
    if record.table is None:
        return      # a database, or a statement that names no table: no row changes
    m = _ALTER.match(statement)
    if m:
        _alter(_Change(applier, cur, record, index), m.group(2))
        return
    m = _CREATE.match(statement)
    if m:
        _create(_Change(applier, cur, record, index), m.group(2))
        return
    m = _DROP.match(statement)
    if m:
        for name in split_top(m.group(1)):
            target = applier.target_name(_table_name(name)[0] or record.schema,
                                         _table_name(name)[1])
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}.{}").format(*map(sql.Identifier,
                                                                          target)))
            applier.forget(target)
            applier.declared.pop((record.schema, _table_name(name)[1]), None)
        return
    m = _RENAME.match(statement)
    if m:
        for pair in split_top(m.group(1)):
            old, _, new = re.split(r"\s+TO\s+", pair.strip(), maxsplit=1, flags=re.I) + ["", ""]
            _rename_table(applier, cur, record, _table_name(old)[1], _table_name(new)[1])


def _rename_table(applier: "Applier", cur, record: Record, old: str, new: str) -> None:
    source, target = (applier.target_name(record.schema, name) for name in (old, new))
    if tables.describe(cur, *source) is not None and tables.describe(cur, *target) is None:
        cur.execute(sql.SQL("ALTER TABLE {}.{} RENAME TO {}").format(
            sql.Identifier(source[0]), sql.Identifier(source[1]), sql.Identifier(target[1])))
    applier.forget(source)
    applier.forget(target)
    declared = applier.declared.pop((record.schema, old), None)
    if declared:
        applier.declared[(record.schema, new)] = declared


def _create(change: _Change, body: str) -> None:
    """The declared types of a table the sink will create at its first row."""
    columns = []
    for part in split_top(body):
        if _NOT_A_COLUMN.match(part):
            continue
        m = re.match(rf"({_IDENT})\s+(.+)$", part, re.S)
        if not m:
            change.refuse(f"the column definition {part[:60]!r} is not understood",
                          f"create {change.label} by hand")
        columns.append({"name": unquote(m.group(1)),
                        "type": change.mapped(m.group(1), m.group(2))})
    key = (change.record.schema, change.record.table)
    change.applier.declared[key] = columns


def _alter(change: _Change, body: str) -> None:
    cur, applier = change.cur, change.applier
    m = _RENAME_TO.match(body.strip())
    if m:
        _rename_table(applier, cur, change.record, change.record.table, _table_name(m.group(1))[1])
        return
    info = tables.describe(cur, *change.target)
    applier.declared.pop((change.record.schema, change.record.table), None)
    if info is None:
        return      # created at its first row (create_tables), with the columns it has then
    have = dict(info.columns)
    statements: List[sql.Composable] = []

    def retype(name: str, type_sql: str) -> None:
        if _norm(have[name].type_sql) != _norm(type_sql):
            statements.append(sql.SQL("ALTER TABLE {} ALTER COLUMN {c} TYPE {t} USING {c}::{t}")
                              .format(info.ident, c=sql.Identifier(name), t=sql.SQL(type_sql)))
            have[name] = tables.Column(name, type_sql, have[name].kind)

    def rename(old: str, new: str) -> bool:
        """False when the target has the new name already (renamed by hand)."""
        if old in have and new not in have:
            statements.append(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
                info.ident, sql.Identifier(old), sql.Identifier(new)))
            have[new] = have.pop(old)
            return True
        if new in have and old not in have:
            return False
        change.refuse(f"column {old!r} cannot be renamed to {new!r}: the target has "
                      f"{'both' if old in have else 'neither'}",
                      f"rename the column in {change.label} by hand (the event then passes)")

    for clause in split_top(body):
        clause = clause.strip()
        if m := _ADD_PK.match(clause):
            wanted = [change.column(c) for c in _key_columns(m.group(1))]
            if wanted != info.pk:
                change.refuse(f"its primary key becomes ({', '.join(wanted)}), the target's is "
                              f"({', '.join(info.pk)})",
                              f"give {change.label} the primary key ({', '.join(wanted)}) by "
                              f"hand (the event then passes)")
        elif _DROP_PK.match(clause):
            if not any(_ADD_PK.match(c.strip()) for c in split_top(body)):
                change.refuse("the primary key is dropped: rows cannot be applied by key",
                              "give the source table a primary key; then set the event "
                              "aside with on_undeliverable = \"dead_letter\"")
        elif _NO_ROW_CHANGE.match(clause):
            continue
        elif m := _RENAME_COLUMN.match(clause):
            rename(change.column(m.group(1)), change.column(m.group(2)))
        elif m := _CHANGE.match(clause):
            old, new = change.column(m.group(1)), change.column(m.group(2))
            type_sql = change.mapped(m.group(2), m.group(3))
            if old != new:
                rename(old, new)
            if new in have:
                retype(new, type_sql)
        elif m := _MODIFY.match(clause):
            name = change.column(m.group(1))
            type_sql = change.mapped(m.group(1), m.group(2))
            if name in have:
                retype(name, type_sql)
        elif m := _DROP_COLUMN.match(clause):
            name = change.column(m.group(1))
            if name in info.pk:
                change.refuse(f"the key column {name!r} would be dropped",
                              f"change {change.label} by hand (the event then passes)")
            if name in have:
                statements.append(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(
                    info.ident, sql.Identifier(name)))
                del have[name]
        elif not _ADD_LIST.match(clause) and (m := _ADD_COLUMN.match(clause)):
            name = change.column(m.group(1))
            type_sql = change.mapped(m.group(1), m.group(2))
            if name not in have:
                statements.append(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                    info.ident, sql.Identifier(name), sql.SQL(type_sql)))
                have[name] = tables.Column(name, type_sql, "plain")
        else:
            change.refuse(f"the clause {clause[:80]!r} is not understood",
                          f"apply it to {change.label} by hand, then set the event aside with "
                          f"on_undeliverable = \"dead_letter\" and a reload")
    for statement in statements:
        cur.execute(statement)
    applier.forget(change.target)
    if statements:
        applier.log.info("sync: applied a schema change", table=change.label,
                         id=change.record.id, statements=len(statements))


def _norm(type_sql: str) -> str:
    return re.sub(r"\s+", " ", type_sql.strip().lower())
