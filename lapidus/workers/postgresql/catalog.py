"""A normal (non-replication) connection to the captured database, for metadata.

Runs in the PostgreSQL worker process.  Used for the start-up checks, to resolve type OIDs the
built-in table does not know (enums, domains, arrays of them), and to list a table's columns
(wal2json leaves unchanged TOAST values out of an update; the catalog says which ones).
"""

from __future__ import annotations

import select
import time
from typing import Callable, Dict, List, Optional, Tuple

import psycopg2
import psycopg2.extensions

from .errors import connection_error
from .tls import tls_options
from .types import TypeMap

FIRST_USER_OID = 16384  # OIDs below this are built into PostgreSQL


# The worker's own queries (checks, slot health, relation and type look-ups) end after this
# long on the server, so a hung server cannot freeze the worker (it reconnects instead).
QUERY_TIMEOUT_MS = 15_000
# A dead network (no RST, no answer) is noticed within about idle + interval * count seconds.
KEEPALIVES = dict(keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3)


def connect(options: dict, backend: str, application_name: str):
    """Open a psycopg2 connection; failures become :class:`BackendError` with the fix.

    The attempt runs through a Python-level wait (psycopg2's wait callback) bounded by
    ``connect_timeout``: libpq's own blocking connect would hold off the worker's SIGTERM
    handler until it gave up, this one lets a stop interrupt it at once.
    """
    kwargs = dict(host=options.get("host", "127.0.0.1"), port=options.get("port", 5432),
                  user=options.get("user", "postgres"), dbname=options["database"],
                  application_name=application_name,
                  options="-c timezone=UTC -c datestyle=ISO,YMD -c intervalstyle=postgres "
                          f"-c statement_timeout={QUERY_TIMEOUT_MS}", **KEEPALIVES)
    if options.get("password"):
        kwargs["password"] = str(options["password"])
    if options.get("passfile"):
        kwargs["passfile"] = str(options["passfile"])
    kwargs.update(tls_options(options, backend))
    deadline = time.monotonic() + float(options.get("connect_timeout") or 10)
    psycopg2.extensions.set_wait_callback(lambda conn: _wait_until(conn, deadline))
    try:
        conn = psycopg2.connect(**kwargs)
    except psycopg2.Error as exc:
        raise connection_error(exc, options, backend) from None
    finally:
        # Only the connect: queries later block in libpq, bounded by statement_timeout.
        psycopg2.extensions.set_wait_callback(None)
    conn.autocommit = True
    return conn


def _wait_until(conn, deadline: float) -> None:
    """psycopg2 wait callback: drive the connection's state machine, give up at ``deadline``."""
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise psycopg2.OperationalError("timeout expired")
        wait = min(remaining, 1.0)
        if state == psycopg2.extensions.POLL_READ:
            select.select([conn.fileno()], [], [], wait)
        else:
            select.select([], [conn.fileno()], [], wait)


class Catalog:
    """Type converters and table columns, cached; queries only on first sight."""

    def __init__(self, conn, type_map: Optional[TypeMap] = None):
        self.conn = conn
        self.type_map = type_map or TypeMap()
        self._resolved: set = set()
        self._columns: Dict[Tuple[str, str], List[str]] = {}
        self._type_names: Dict[int, str] = {}

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

    def type_name(self, oid: int) -> str:
        """``format_type(oid, NULL)``: ``integer``, ``text``, ``character varying`` ..."""
        name = self._type_names.get(oid)
        if name is None:
            with self.conn.cursor() as cur:
                cur.execute("SELECT pg_catalog.format_type(%s, NULL)", (oid,))
                name = self._type_names[oid] = str(cur.fetchone()[0])
        return name

    def forget_table(self, schema: str, table: str) -> None:
        """Drop cached columns (after DDL)."""
        self._columns.pop((schema, table), None)

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
