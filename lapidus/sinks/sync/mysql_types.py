"""MySQL/MariaDB column types as the PostgreSQL types the sync sink gives them in a target.

Pure functions; runs in the dispatcher process (the sync sink's worker thread), for the
columns of a MySQL ``CREATE TABLE`` (tables the sink creates) and of ``ALTER TABLE ... ADD /
CHANGE / MODIFY`` (columns it adds or retypes).  The mapping keeps every value of the source
type as the event carries it (docs/types-mysql.md) and refuses none: unsigned types get the
next wider type, strings are ``text`` (a length limit only refuses), ``TIME`` is an
``interval`` (its hours go to 838, negative too), ``BIT`` a ``numeric(20)``.  The names are
those ``format_type()`` prints, so a target column can be compared with them.  The table is
in docs/sync.md ("MySQL and MariaDB sources").  :func:`mysql_type` maps the other way, for
tables created in a MySQL/MariaDB target ("A MySQL or MariaDB target").
"""

from __future__ import annotations

import re
from typing import Optional

_INTEGERS = {
    # type: (signed, unsigned)
    "tinyint": ("smallint", "smallint"),
    "smallint": ("smallint", "integer"),
    "mediumint": ("integer", "integer"),
    "int": ("integer", "bigint"),
    "integer": ("integer", "bigint"),
    "bigint": ("bigint", "numeric(20,0)"),
}
_PLAIN = {
    "bool": "smallint", "boolean": "smallint",   # TINYINT(1): 0/1 mostly, any TINYINT value
    "float": "real", "double": "double precision", "real": "double precision",
    "date": "date", "year": "smallint", "bit": "numeric(20,0)", "json": "jsonb",
    "enum": "text", "set": "text[]",
    "char": "text", "varchar": "text", "tinytext": "text", "text": "text",
    "mediumtext": "text", "longtext": "text", "nchar": "text", "nvarchar": "text",
    "binary": "bytea", "varbinary": "bytea", "tinyblob": "bytea", "blob": "bytea",
    "mediumblob": "bytea", "longblob": "bytea",
    "geometry": "text", "point": "text", "linestring": "text", "polygon": "text",
    "multipoint": "text", "multilinestring": "text", "multipolygon": "text",
    "geometrycollection": "text", "inet4": "inet", "inet6": "inet", "uuid": "uuid",
}
_TYPE = re.compile(r"^\s*(?P<name>[a-z][a-z0-9_]*(?:\s+(?:precision|varying)\b)?)\s*"
                   r"(?:\((?P<args>[^)]*)\))?(?P<rest>.*)$", re.I | re.S)


def pg_type(mysql_type: str) -> Optional[str]:
    """The PostgreSQL type for a MySQL column type as written in a statement (``DECIMAL(12,2)
    UNSIGNED``, ``datetime(6)``, ``double precision``...); None for a type without a mapping."""
    m = _TYPE.match(mysql_type)
    if not m:
        return None
    name = re.sub(r"\s+", " ", m.group("name").lower())
    if name == "double precision":
        name = "double"
    if name in ("character varying", "national varchar", "national char", "character"):
        name = "varchar"
    args = [a.strip() for a in (m.group("args") or "").split(",") if a.strip()]
    unsigned = bool(re.search(r"\bunsigned\b", m.group("rest") or "", re.I))
    if name in _INTEGERS:
        return _INTEGERS[name][unsigned]
    if name in ("decimal", "numeric", "dec", "fixed"):
        precision = args[0] if args else "10"
        scale = args[1] if len(args) > 1 else "0"
        if not (precision.isdigit() and scale.isdigit()):
            return None
        return f"numeric({precision},{scale})"
    if name in ("datetime", "timestamp", "time"):
        digits = args[0] if args else "0"
        if not digits.isdigit():
            return None
        if name == "time":
            return "interval"
        zone = "with" if name == "timestamp" else "without"
        return f"timestamp({digits}) {zone} time zone"
    if name == "tinyint" and args == ["1"]:
        return "smallint"
    return _PLAIN.get(name)


# -- the other way: columns of a MySQL/MariaDB target -------------------------------------------

_FROM_PG = {
    "smallint": "SMALLINT", "integer": "INT", "bigint": "BIGINT", "real": "FLOAT",
    "double precision": "DOUBLE", "boolean": "BOOLEAN", "date": "DATE", "bytea": "LONGBLOB",
    "json": "JSON", "jsonb": "JSON", "uuid": "CHAR(36)", "text": "LONGTEXT",
}


def mysql_type(pg: str, key: bool = False) -> str:
    """The MySQL/MariaDB column type for a PostgreSQL type (``format_type()`` form, or one of
    :func:`.tables.inferred_type`'s), holding every value exactly; a key column gets a type
    MySQL can index (``VARCHAR(255)``/``VARBINARY(255)`` for text and bytea)."""
    pg = re.sub(r"\s+", " ", pg.strip().lower())
    if pg.endswith("[]"):
        return "JSON"
    m = re.match(r"^numeric\((\d+),(\d+)\)$", pg.replace(" ", ""))
    if m and int(m.group(1)) <= 65 and int(m.group(2)) <= 30:
        return f"DECIMAL({m.group(1)},{m.group(2)})"
    m = re.match(r"^timestamp(?:\((\d)\))? with(out)? time zone$", pg)
    if m:
        return f"DATETIME({m.group(1) or 6})"
    m = re.match(r"^time(?:\((\d)\))? without time zone$", pg)
    if m:
        return f"TIME({m.group(1) or 6})"
    m = re.match(r"^(?:character varying|varchar|character|char)\((\d+)\)$", pg)
    if m:
        return f"VARCHAR({m.group(1)})"
    if pg in _FROM_PG and not (key and pg in ("text", "bytea")):
        return _FROM_PG[pg]
    if pg == "bytea":
        return "VARBINARY(255)"
    # an unconstrained numeric keeps every digit as text; so do intervals, ranges, enums...
    return "VARCHAR(255)" if key else "LONGTEXT"
