"""A PostgreSQL target of the sync sink: its connection, session, lock, state and errors.

Runs in the dispatcher process, in the sync sink's worker thread (psycopg2, blocking).  The
sink (:mod:`lapidus.sinks.sync`) drives any target through these few operations, so that what
is PostgreSQL's own (SQLSTATE classes, advisory locks, the state tables' SQL) stays here.
"""

from __future__ import annotations

import psycopg2
import psycopg2.errors

from ..base import SinkError
from . import state
from .apply import Applier

# SQLSTATE classes that mean "this row, for good": data exception, integrity constraint,
# syntax error or access rule violation (an unknown column or type), raised by a trigger
_REFUSING = ("22", "23", "42", "P0", "2B", "44")


class PgTarget:
    name = "PostgreSQL"
    Error = psycopg2.Error
    Lost = (psycopg2.OperationalError, psycopg2.InterfaceError)
    Applier = Applier

    def connect(self, config, backend: str):
        return psycopg2.connect(config.dsn, connect_timeout=max(1, int(config.connect_timeout)),
                                application_name=f"lapidus sync {backend}"[:63])

    def prepare(self, conn, config, backend: str) -> state.Cursor:
        """Session settings, the backend's lock, the state tables; the cursor read back."""
        with conn.cursor() as cur:
            # event timestamps without a zone are UTC (docs/events.md)
            cur.execute("SET TIME ZONE 'UTC'")
            cur.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (f"lapidus_sync:{backend}",))
            if not cur.fetchone()[0]:
                raise SinkError(
                    f"sync: another session applies backend {backend!r} into this target "
                    f"(advisory lock taken); fix: run one Lapidus per backend and target")
            state.ensure_tables(cur, config.state_schema)
            cursor = state.load(cur, config.state_schema, backend)
        conn.commit()
        return cursor

    @staticmethod
    def save(cur, config, backend, cursor, last_id, changed, keep) -> None:
        state.save(cur, config.state_schema, backend, cursor, last_id, changed, keep=keep)

    @staticmethod
    def refusing(exc: BaseException) -> bool:
        code = getattr(exc, "pgcode", None) or ""
        return code[:2] in _REFUSING
