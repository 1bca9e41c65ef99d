"""A normal (non-replication) connection to the captured database, for metadata.

Runs in the PostgreSQL worker process.  Used for the start-up checks, to resolve type OIDs the
built-in table does not know (enums, domains, arrays of them), and to list a table's columns
(wal2json leaves unchanged TOAST values out of an update; the catalog says which ones).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import psycopg2

from ..base import BackendError
from .types import TypeMap

FIRST_USER_OID = 16384  # OIDs below this are built into PostgreSQL


def connect(options: dict, backend: str, application_name: str):
    """Open a psycopg2 connection; failures become :class:`BackendError` with the fix."""
    kwargs = dict(host=options.get("host", "127.0.0.1"), port=options.get("port", 5432),
                  user=options.get("user", "postgres"), dbname=options["database"],
                  connect_timeout=options.get("connect_timeout", 10),
                  application_name=application_name,
                  options="-c timezone=UTC -c datestyle=ISO,YMD -c intervalstyle=postgres")
    if options.get("password"):
        kwargs["password"] = str(options["password"])
    if options.get("passfile"):
        kwargs["passfile"] = str(options["passfile"])
    if options.get("sslmode"):
        kwargs["sslmode"] = options["sslmode"]
    try:
        conn = psycopg2.connect(**kwargs)
    except psycopg2.OperationalError as exc:
        raise connection_error(exc, options, backend) from None
    conn.autocommit = True
    return conn


def connection_error(exc: Exception, options: dict, backend: str) -> BackendError:
    """Classify a connection failure: authentication and missing database are fatal."""
    text = str(exc).strip()
    where = f'{options.get("host", "127.0.0.1")}:{options.get("port", 5432)}'
    user = options.get("user", "postgres")
    db = options.get("database")
    lowered = text.lower()
    if "password authentication failed" in lowered or "no password supplied" in lowered \
            or "authentication failed" in lowered:
        return BackendError(
            f'backend "{backend}": PostgreSQL at {where} rejected user "{user}": wrong or missing '
            f"password; set the backend's password (or passfile) to the role's password",
            fatal=True)
    if "does not exist" in lowered and "database" in lowered:
        return BackendError(
            f'backend "{backend}": database "{db}" does not exist on {where}; '
            f"create it or fix the backend's database setting", fatal=True)
    if "no pg_hba.conf entry" in lowered:
        return BackendError(
            f'backend "{backend}": {where} does not allow user "{user}" to connect '
            f"(pg_hba.conf); add a host line for it, including a 'replication' line", fatal=True)
    first_line = text.splitlines()[0] if text else type(exc).__name__
    return BackendError(
        f'backend "{backend}": cannot reach PostgreSQL at {where}: {first_line}; '
        f"check that the server runs and the host and port are right (retrying)")


class Catalog:
    """Type converters and table columns, cached; queries only on first sight."""

    def __init__(self, conn, type_map: Optional[TypeMap] = None):
        self.conn = conn
        self.type_map = type_map or TypeMap()
        self._resolved: set = set()
        self._columns: Dict[Tuple[str, str], List[str]] = {}

    def converter(self, oid: int) -> Callable:
        if oid >= FIRST_USER_OID and oid not in self._resolved:
            self.type_map.resolve(self.conn, [oid])
            self._resolved.add(oid)
        return self.type_map.converter(oid)

    def columns_of(self, schema: str, table: str) -> List[str]:
        key = (schema, table)
        names = self._columns.get(key)
        if names is None:
            with self.conn.cursor() as cur:
                cur.execute(
                    "SELECT a.attname FROM pg_attribute a "
                    "JOIN pg_class c ON c.oid = a.attrelid "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 "
                    "AND NOT a.attisdropped ORDER BY a.attnum", (schema, table))
                names = [row[0] for row in cur.fetchall()]
            self._columns[key] = names
        return names

    def forget_table(self, schema: str, table: str) -> None:
        """Drop cached columns (after DDL)."""
        self._columns.pop((schema, table), None)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
