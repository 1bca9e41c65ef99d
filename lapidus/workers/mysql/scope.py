"""Which databases and tables a mysql backend streams.

Runs in the mysql worker process.  The ``database`` option limits the stream to that database
unless ``include_tables`` says otherwise: when include patterns are given, exactly the tables
matching one of them pass; a qualified pattern (``other.*``, ``crm.orders``) may name any
database, an unqualified one (``orders``) applies inside ``database``.  ``exclude_tables``
always wins.  The decision is made on the binlog's table map, before any row is decoded
(see :class:`.reader.BinlogReader`), and is cached per table.
"""

from __future__ import annotations

import fnmatch
import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

from ...filters import TableFilter


class Scope:
    """``allows(schema, table)`` for row events; ``allows_schema`` for database-level DDL."""

    def __init__(self, database: Optional[str], include: Sequence[str] = (),
                 exclude: Sequence[str] = ()):
        self.database = database or None
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        qualified = tuple(p for p in self.include if "." in p)
        bare = tuple(p for p in self.include if "." not in p)
        self._excluded = TableFilter(include=(), exclude=self.exclude)
        self._qualified = TableFilter(include=qualified) if qualified else None
        self._bare = TableFilter(include=bare) if bare else None
        self._cache: Dict[Tuple[str, str], bool] = {}

    @property
    def static_schemas(self) -> Optional[Tuple[str, ...]]:
        """The only schemas that can ever pass, when known without a table name
        (lets the library drop other schemas' table maps before parsing their columns)."""
        if self.database and not any("." in p for p in self.include):
            return (self.database,)
        return None

    def allows(self, schema: str, table: str) -> bool:
        key = (schema, table)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._decide(schema, table)
            self._cache[key] = hit
        return hit

    def _decide(self, schema: str, table: str) -> bool:
        if not self._excluded.allows(schema, table):
            return False
        if self._qualified is not None and self._qualified.allows(schema, table):
            return True
        in_database = self.database is None or schema == self.database
        if self._bare is not None:
            return in_database and self._bare.allows(schema, table)
        # Includes given but none matched; without includes, `database` decides.
        return self._qualified is None and in_database

    def allows_schema(self, schema: Optional[str]) -> bool:
        """For statements that name no table (CREATE DATABASE ..., unparsed DDL)."""
        if self.database is None and not self.include:
            return True
        if schema is None:
            return self.database is None
        if schema == self.database:
            return True
        return any(fnmatch.fnmatchcase(schema, p.split(".", 1)[0])
                   for p in self.include if "." in p)

    def fingerprint(self) -> str:
        """Short digest of the settings that decide which rows count inside a transaction.

        Row indexes inside a transaction count only streamed rows; a checkpoint taken in the
        middle of a transaction is only exact under the same scope (see position.py)."""
        text = repr((self.database, self.include, self.exclude))
        return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


# The tables a scope could match, for the warnings at start (system schemas never stream).
SCOPE_TABLES = ("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE "
                "TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', "
                "'sys')")


SCOPE_SCHEMAS = "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA"


def unmatched_patterns(scope: Scope, tables: Sequence[Tuple[str, str]]) -> List[str]:
    """The ``include_tables`` patterns of ``scope`` that match none of ``tables``."""
    return [pattern for pattern in scope.include
            if not any(Scope(scope.database, include=(pattern,)).allows(schema, table)
                       for schema, table in tables)]


def scope_warnings(scope: Scope, schemas: Sequence[str],
                   tables: Sequence[Tuple[str, str]]) -> List[str]:
    """What makes a backend stream nothing today, said at start instead of silently: a
    ``database`` that does not exist, ``include_tables`` patterns that match no table.

    Pure: ``schemas`` and ``tables`` (schema, table) are those that exist now.  Both are
    warnings, not errors: the database or table may be created later and is then streamed.
    """
    out: List[str] = []
    if scope.database and scope.database not in set(schemas):
        out.append(f'database "{scope.database}" does not exist on the server: nothing of it '
                   f"is streamed until it is created; check the backend's database setting")
    for pattern in unmatched_patterns(scope, tables):
        where = f' in database "{scope.database}"' if scope.database and "." not in pattern \
            else ""
        out.append(f'include_tables pattern "{pattern}" matches no table{where}; its tables '
                   f"are streamed once they exist, check the spelling")
    return out


def scope_from(backend) -> Scope:
    """The scope of a ``BackendConfig`` (``database`` option, include/exclude tables)."""
    options = getattr(backend, "options", None) or {}
    return Scope(options.get("database"), tuple(getattr(backend, "include_tables", ()) or ()),
                 tuple(getattr(backend, "exclude_tables", ()) or ()))
