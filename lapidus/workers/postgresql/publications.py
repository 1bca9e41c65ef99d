"""The publication the pgoutput decoder reads, set up according to ``publication_mode``.

Runs in the PostgreSQL worker process, at start-up, before the replication slot is created:
pgoutput looks publications up in the catalog *as it was when each change was written*, so a
publication created after the slot's position makes decoding of the older changes fail with
``publication "..." does not exist``.  Creating the publication first avoids that; when the slot
already existed, :func:`check_slot_sees_publication` finds out before streaming starts.

Modes (like Debezium's ``publication.autocreate.mode``):

* ``all_tables``: create ``FOR ALL TABLES`` when missing (superuser only); an existing
  publication is used as it is;
* ``filtered``: resolve ``include_tables``/``exclude_tables`` against the catalog, create the
  publication ``FOR TABLE`` those, or ``ALTER ... SET TABLE`` an existing one whose tables
  differ.  Tables created later are added at the next start only;
* ``existing``: use a publication the DBA made; never create or change it.

Every failure is a fatal :class:`BackendError` naming the SQL that fixes it.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import psycopg2

from ..base import BackendError
from .pgoutput import quote_name

MODES = ("all_tables", "filtered", "existing")
Table = Tuple[str, str]

# Tables a publication can hold: ordinary and partitioned, permanent, outside system schemas.
_CANDIDATE_TABLES = """
SELECT n.nspname, c.relname
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%'
ORDER BY 1, 2
"""

# Published tables on which UPDATE and DELETE would fail ("cannot update table ... because it
# does not have a replica identity and publishes updates") once they are in the publication.
_WITHOUT_IDENTITY = """
SELECT n.nspname, c.relname
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%'
  AND (c.relreplident = 'n'
       OR (c.relreplident = 'd' AND NOT EXISTS (
             SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))
       OR (c.relreplident = 'i' AND NOT EXISTS (
             SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)))
ORDER BY 1, 2
"""

_PUBLISHED_TABLES = """
SELECT n.nspname, c.relname
FROM pg_catalog.pg_publication p
JOIN pg_catalog.pg_publication_rel r ON r.prpubid = p.oid
JOIN pg_catalog.pg_class c ON c.oid = r.prrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE p.pubname = %s
ORDER BY 1, 2
"""


def _rows(conn, query: str, args=None) -> list:
    with conn.cursor() as cur:
        cur.execute(query, args)
        return cur.fetchall()


def table_list_sql(tables: Sequence[Table]) -> str:
    """``"public"."a", "Odd Schema"."B"``: table names quoted for SQL."""
    return ", ".join(_quote(schema) + "." + _quote(table) for schema, table in tables)


def _quote(name: str) -> str:
    """An SQL identifier, always quoted: table names may be keywords (``order``)."""
    return '"' + name.replace('"', '""') + '"'


def publication_info(conn, name: str) -> Optional[dict]:
    rows = _rows(conn, "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate "
                       "FROM pg_catalog.pg_publication WHERE pubname = %s", (name,))
    if not rows:
        return None
    keys = ("all_tables", "insert", "update", "delete", "truncate")
    return dict(zip(keys, rows[0]))


def filtered_tables(conn, table_filter) -> List[Table]:
    """The catalog's tables that pass include/exclude, sorted."""
    return [(s, t) for s, t in _rows(conn, _CANDIDATE_TABLES) if table_filter.allows(s, t)]


def unmatched_includes(conn, include: Sequence[str]) -> List[str]:
    """The ``include_tables`` patterns that match no table of the database now (each one a
    backend that silently streams less than its owner thinks)."""
    from ...filters import TableFilter
    tables = [tuple(r) for r in _rows(conn, _CANDIDATE_TABLES)]
    return [pattern for pattern in include
            if not any(TableFilter(include=(pattern,)).allows(s, t) for s, t in tables)]


def tables_without_identity(conn, among: Optional[Sequence[Table]] = None) -> List[Table]:
    """Tables on which UPDATE/DELETE fail once a publication publishes them."""
    found = [tuple(r) for r in _rows(conn, _WITHOUT_IDENTITY)]
    if among is not None:
        wanted = set(among)
        found = [t for t in found if t in wanted]
    return found


def ensure_publication(conn, *, backend: str, name: str, mode: str, table_filter,
                       user: str = "") -> bool:
    """Make publication ``name`` ready for ``mode``.  True when it was created now.

    Raises a fatal :class:`BackendError` (with the SQL that fixes it) when the publication is
    missing in ``existing`` mode, when the role may not create or change it, or when creating
    it would make UPDATE/DELETE fail on tables without a replica identity.
    """
    if mode not in MODES:
        raise BackendError(f'backend "{backend}": unknown publication_mode "{mode}" '
                           f"(expected {', '.join(MODES)})", fatal=True)
    info = publication_info(conn, name)
    ident = _quote(name)
    if mode == "existing":
        if info is None:
            raise BackendError(
                f'backend "{backend}": publication "{name}" does not exist, and '
                f'publication_mode = "existing" never creates one; have the DBA run '
                f"CREATE PUBLICATION {ident} FOR ALL TABLES; (or FOR TABLE ...), or set "
                f'publication_mode = "all_tables" or "filtered"', fatal=True)
        return False
    if mode == "all_tables":
        if info is not None:
            return False
        statement = f"CREATE PUBLICATION {ident} FOR ALL TABLES"
        _refuse_tables_without_identity(conn, backend, statement, None)
        _execute(conn, backend, statement, user, name)
        return True
    # filtered
    tables = filtered_tables(conn, table_filter)
    if not tables:
        raise BackendError(
            f'backend "{backend}": publication_mode = "filtered" but no table of the database '
            f"passes include_tables/exclude_tables, so the publication would be empty; create "
            f"the tables first (Lapidus adds them at its next start) or fix the globs",
            fatal=True)
    if info is None:
        statement = f"CREATE PUBLICATION {ident} FOR TABLE {table_list_sql(tables)}"
        _refuse_tables_without_identity(conn, backend, statement, tables)
        _execute(conn, backend, statement, user, name)
        return True
    if info["all_tables"]:
        raise BackendError(
            f'backend "{backend}": publication "{name}" is FOR ALL TABLES, but '
            f'publication_mode = "filtered" needs one listing the tables; set '
            f'publication_mode = "all_tables" (the decoder still applies include/exclude), or '
            f"DROP PUBLICATION {ident}; and restart so Lapidus creates it", fatal=True)
    current = [tuple(r) for r in _rows(conn, _PUBLISHED_TABLES, (name,))]
    if current != tables:
        added = sorted(set(tables) - set(current))
        statement = f"ALTER PUBLICATION {ident} SET TABLE {table_list_sql(tables)}"
        _refuse_tables_without_identity(conn, backend, statement, added)
        _execute(conn, backend, statement, user, name)
    return False


def _refuse_tables_without_identity(conn, backend: str, statement: str,
                                    tables: Optional[Sequence[Table]]) -> None:
    """Creating the publication must not break the application's UPDATEs and DELETEs."""
    bad = tables_without_identity(conn, tables)
    if not bad:
        return
    shown = ", ".join(f"{s}.{t}" for s, t in bad[:10]) + (" ..." if len(bad) > 10 else "")
    first = table_list_sql(bad[:1])
    raise BackendError(
        f'backend "{backend}": Lapidus will not run {statement}: {len(bad)} table(s) have no '
        f"primary key or replica identity ({shown}), and once published, UPDATE and DELETE on "
        f"them fail in every application. Give each an identity (ALTER TABLE {first} REPLICA "
        f"IDENTITY FULL; or add a primary key), or leave them out with exclude_tables and "
        f'publication_mode = "filtered", or use decoder = "wal2json"', fatal=True)


def _execute(conn, backend: str, statement: str, user: str, name: str) -> None:
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    except psycopg2.Error as exc:
        text = (exc.pgerror or str(exc)).strip().splitlines()[0]
        if exc.pgcode == "42501":       # insufficient_privilege, must be owner ...
            hint = "FOR ALL TABLES needs a superuser" if "ALL TABLES" in statement else \
                "it needs CREATE on the database and ownership of the tables (and of the " \
                "publication, to change it)"
            raise BackendError(
                f'backend "{backend}": role "{user or "?"}" may not run {statement} ({text}; '
                f"{hint}); have a superuser run it, then restart, or set "
                f'publication_mode = "existing" to use a publication made by the DBA',
                fatal=True) from None
        raise BackendError(
            f'backend "{backend}": {statement} failed: {text}; fix the cause or create the '
            f'publication "{name}" yourself and set publication_mode = "existing"',
            fatal=True) from None


def check_slot_sees_publication(conn, *, backend: str, slot: str, publication: str) -> None:
    """After creating the publication for a slot that already existed: can pgoutput decode
    the slot's pending changes?  Those written before the publication existed cannot be.

    Peeks (without consuming) at the changes up to now; the cost is one decoding pass over
    the slot's backlog, paid only in this rare situation.
    """
    (upto,) = _rows(conn, "SELECT pg_current_wal_lsn()::text")[0]
    try:
        _rows(conn, "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("
                    "%s, %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', %s)",
              (slot, upto, quote_name(publication)))
    except psycopg2.Error as exc:
        text = (exc.pgerror or str(exc)).strip().splitlines()[0]
        if "does not exist" not in text:
            raise BackendError(f'backend "{backend}": cannot check slot "{slot}": {text}; '
                               f"retrying") from None
        raise BackendError(
            f'backend "{backend}": publication "{publication}" did not exist when changes '
            f'still pending in slot "{slot}" were written, and pgoutput reads publications as '
            f"they were at each change ({text}). Those changes cannot be streamed with "
            f"pgoutput: re-snapshot the tables that changed meanwhile, skip them with SELECT "
            f"pg_replication_slot_advance('{slot}', pg_current_wal_lsn()); and restart",
            fatal=True) from None


def explain_child_error(errors: str, *, backend: str, slot: str,
                        program: str = "pg_recvlogical") -> Optional[str]:
    """The operator's message for a pg_recvlogical that died of a missing publication.

    ``errors`` is the tail of pg_recvlogical's log, whose last line is only
    ``pg_recvlogical: error: disconnected``; the server's reason is on an ``ERROR:`` line
    before it.  Returns None when the death has another cause.
    """
    for line in reversed(errors.splitlines()):
        if "ERROR:" in line and "publication" in line and "does not exist" in line:
            reason = line.split("ERROR:", 1)[1].strip()
            return (
                f'backend "{backend}": {program} stopped: {reason}, as of a change still '
                f'pending in slot "{slot}": the publication was dropped, or created after that '
                f"change was written (pgoutput reads publications as they were at each change). "
                f"Re-create it if it is gone (CREATE PUBLICATION ... FOR ALL TABLES;). The "
                f"pending changes cannot be streamed with pgoutput: re-snapshot the tables that "
                f"changed meanwhile, skip them with SELECT pg_replication_slot_advance('{slot}', "
                f"pg_current_wal_lsn()); and restart")
    return None


def drop_publication(conn, name: str) -> bool:
    """Drop publication ``name`` if it exists (temporary backends clean up after themselves)."""
    if publication_info(conn, name) is None:
        return False
    with conn.cursor() as cur:
        cur.execute(f"DROP PUBLICATION {_quote(name)}")
    return True
