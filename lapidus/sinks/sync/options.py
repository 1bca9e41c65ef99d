"""The sync plugin's options: validation (with key paths) and the parsed, typed form.

Runs in the supervisor and in ``lapidus -t`` (:func:`validate`, through ``Sink.validate``) and in
the dispatcher (:meth:`SyncOptions.parse`).  Never echoes the DSN: it may hold a password
(``${VAR}`` is expanded by the configuration loader before a sink sees it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

Problems = List[Tuple[str, str]]

KNOWN = {"dsn", "schema", "tables", "create_tables", "batch_transactions", "state_schema",
         "connect_timeout"}


@dataclass(frozen=True)
class TableMap:
    """Where one source table goes: target table name and column renames (source -> target)."""
    table: Optional[str] = None
    columns: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SyncOptions:
    dsn: str
    schema: Optional[str]                 # None: the source's schema (MySQL: database) name
    tables: Dict[str, TableMap]           # "table" or "schema.table" -> its mapping
    create_tables: bool = True
    batch_transactions: int = 500         # source transactions per target transaction, at most
    state_schema: str = "public"
    connect_timeout: float = 10.0

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> "SyncOptions":
        """Options already checked by :func:`validate`."""
        tables = {}
        for name, spec in (options.get("tables") or {}).items():
            if isinstance(spec, str):
                tables[name] = TableMap(table=spec)
            else:
                tables[name] = TableMap(table=spec.get("table"),
                                        columns=dict(spec.get("columns") or {}))
        return cls(dsn=options["dsn"], schema=options.get("schema"), tables=tables,
                   create_tables=bool(options.get("create_tables", True)),
                   batch_transactions=int(options.get("batch_transactions", 500)),
                   state_schema=options.get("state_schema") or "public",
                   connect_timeout=float(options.get("connect_timeout", 10.0)))

    def table_map(self, schema: Optional[str], table: str) -> TableMap:
        """The mapping of a source table: ``schema.table`` first, then the bare name."""
        return (self.tables.get(f"{schema}.{table}") or self.tables.get(table) or TableMap())


def validate(options: Mapping[str, Any]) -> Problems:
    """Problems as ``(key, message)`` pairs; empty when valid."""
    problems: Problems = []
    for key in sorted(set(options) - KNOWN):
        problems.append((key, f"unknown option; known: {', '.join(sorted(KNOWN))}"))
    dsn = options.get("dsn")
    if "dsn" in options and dsn is None:
        pass    # a secret whose variable is unset (lapidus -t, which only warns): not checked
    elif not isinstance(dsn, str) or not dsn.strip():
        problems.append(("dsn", 'required: the target PostgreSQL as a libpq DSN, e.g. '
                                '"host=replica dbname=copy user=lapidus password=${SYNC_PASSWORD}"'
                                ' or "postgresql://lapidus@replica/copy", or a MySQL/MariaDB '
                                'target as "mysql://lapidus:${SYNC_PASSWORD}@replica:3306/copy"'))
    for key in ("schema", "state_schema"):
        value = options.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            problems.append((key, "must be a non-empty string (a schema name)"))
    for key in ("create_tables",):
        if key in options and not isinstance(options[key], bool):
            problems.append((key, "must be true or false"))
    count = options.get("batch_transactions", 500)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        problems.append(("batch_transactions", "must be an integer >= 1 (source transactions "
                                               "merged into one target transaction)"))
    timeout = options.get("connect_timeout", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        problems.append(("connect_timeout", "must be a number of seconds > 0"))
    tables = options.get("tables")
    if tables is not None:
        if not isinstance(tables, Mapping):
            problems.append(("tables", 'must be a table: source name -> target name, or '
                                       '-> {table = "...", columns = {old = "new"}}'))
        else:
            for name, spec in tables.items():
                where = f"tables.{name}"
                if isinstance(spec, str):
                    if not spec:
                        problems.append((where, "must be a non-empty target table name"))
                    continue
                if not isinstance(spec, Mapping):
                    problems.append((where, 'must be a target name or {table = "...", '
                                            'columns = {...}}'))
                    continue
                for key in sorted(set(spec) - {"table", "columns"}):
                    problems.append((f"{where}.{key}", "unknown key; known: table, columns"))
                if spec.get("table") is not None and not isinstance(spec.get("table"), str):
                    problems.append((f"{where}.table", "must be a string"))
                columns = spec.get("columns")
                if columns is not None and (not isinstance(columns, Mapping) or not all(
                        isinstance(v, str) and v for v in columns.values())):
                    problems.append((f"{where}.columns",
                                     "must map source column names to target column names"))
    return problems
