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

``publish_via_partition_root`` (PostgreSQL 13+) is the publication option of that name: a
publication Lapidus makes gets it, one it keeps (``all_tables``, ``filtered``) is changed to it,
and an ``existing`` one must already have it.  pgoutput reads the option, like the table list,
as of each change, so changing it renames only the changes written afterwards.

Every failure is a fatal :class:`BackendError` naming the SQL that fixes it.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import psycopg2

from ..base import BackendError
from .partitions import describe_split, split_partitions
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
    """The publication's options, or None when it does not exist.  ``via_root`` is
    ``pubviaroot``, false before PostgreSQL 13 (which had neither the column nor
    partitioned tables in publications)."""
    via_root = "pubviaroot" if conn.server_version >= 130000 else "false"
    rows = _rows(conn, "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, "
                       f"{via_root} FROM pg_catalog.pg_publication WHERE pubname = %s", (name,))
    if not rows:
        return None
    keys = ("all_tables", "insert", "update", "delete", "truncate", "via_root")
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
                       user: str = "", via_root: bool = False,
                       warn: Optional[Callable[..., None]] = None) -> bool:
    """Make publication ``name`` ready for ``mode`` and ``via_root``
    (``publish_via_partition_root``).  True when it was created now.

    Raises a fatal :class:`BackendError` (with the SQL that fixes it) when the publication is
    missing in ``existing`` mode or its ``publish_via_partition_root`` differs there, when the
    role may not create or change it, when creating it would make UPDATE/DELETE fail on tables
    without a replica identity, or when include/exclude judge a partition apart from the
    parent its changes would arrive as.  ``warn(message, **fields)`` is told when the option
    of an existing publication was changed.
    """
    if mode not in MODES:
        raise BackendError(f'backend "{backend}": unknown publication_mode "{mode}" '
                           f"(expected {', '.join(MODES)})", fatal=True)
    if via_root and conn.server_version < 130000:
        raise BackendError(
            f'backend "{backend}": publish_via_partition_root = true needs PostgreSQL 13 or '
            f"later (older servers cannot publish partitioned tables); upgrade the server or "
            f"set publish_via_partition_root = false", fatal=True)
    info = publication_info(conn, name)
    ident = _quote(name)
    if mode == "existing":
        if info is None:
            raise BackendError(
                f'backend "{backend}": publication "{name}" does not exist, and '
                f'publication_mode = "existing" never creates one; have the DBA run '
                f"CREATE PUBLICATION {ident} FOR ALL TABLES{_with(via_root)}; (or FOR TABLE "
                f'...), or set publication_mode = "all_tables" or "filtered"', fatal=True)
        _refuse_other_via_root(backend, name, info["via_root"], via_root)
        return False
    if via_root:
        _refuse_split_partitions(backend, table_filter, all_tables=mode == "all_tables")
    if mode == "all_tables":
        if info is not None:
            _ensure_via_root(conn, backend, name, info, via_root, user, warn)
            return False
        statement = f"CREATE PUBLICATION {ident} FOR ALL TABLES{_with(via_root)}"
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
        statement = (f"CREATE PUBLICATION {ident} FOR TABLE {table_list_sql(tables)}"
                     f"{_with(via_root)}")
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
    _ensure_via_root(conn, backend, name, info, via_root, user, warn)
    return False


def _with(via_root: bool) -> str:
    """The option clause of a CREATE PUBLICATION: PostgreSQL's default (false) is left
    unsaid, so a backend without the setting creates what it always did."""
    return " WITH (publish_via_partition_root = true)" if via_root else ""


def _set_via_root(name: str, via_root: bool) -> str:
    return (f"ALTER PUBLICATION {_quote(name)} SET (publish_via_partition_root = "
            f"{str(via_root).lower()})")


def _ensure_via_root(conn, backend: str, name: str, info: dict, via_root: bool, user: str,
                     warn: Optional[Callable[..., None]]) -> None:
    """Change the option of a publication Lapidus keeps when it differs from the setting.

    Changes already written keep the naming they had: pgoutput reads the publication as of
    each change (logical decoding's historic catalog), so the pending backlog, if any, still
    arrives the old way.  Said in a warning, since consumers see both namings for a while.
    """
    if bool(info["via_root"]) == via_root:
        return
    statement = _set_via_root(name, via_root)
    _execute(conn, backend, statement, user, name)
    if warn is not None:
        new, old = ("parent", "partitions") if via_root else ("partitions", "parent")
        warn(f"publication changed: partitions' changes written from now on arrive as the "
             f"{new}; those written before (the slot's backlog) still arrive as the {old}",
             publication=name, publish_via_partition_root=via_root)


def _refuse_other_via_root(backend: str, name: str, current: bool, wanted: bool) -> None:
    """``existing`` mode: a publication whose option differs would name events otherwise
    than the configuration says, and Lapidus may not change it."""
    if bool(current) == wanted:
        return
    raise BackendError(
        f'backend "{backend}": publication "{name}" has publish_via_partition_root = '
        f"{str(bool(current)).lower()}, but the backend sets it to {str(wanted).lower()}, and "
        f'publication_mode = "existing" never changes a publication; have the DBA run '
        f"{_set_via_root(name, wanted)}; (changes written before it keep the old naming), or "
        f"set publish_via_partition_root = {str(bool(current)).lower()} on the backend",
        fatal=True)


def _refuse_split_partitions(backend: str, table_filter, *, all_tables: bool) -> None:
    """With publish_via_partition_root a partition's changes arrive as its parent: include /
    exclude cannot then stream one partition and not the parent (or the reverse), and
    would silently stream or drop rows they were meant not to."""
    split = split_partitions(table_filter, all_tables=all_tables)
    if not split:
        return
    raise BackendError(
        f'backend "{backend}": publish_via_partition_root = true streams the changes of '
        f"partitions as their parent, so include_tables/exclude_tables cannot judge a "
        f"partition apart from it: {describe_split(split)}. Name the parent instead of its "
        f"partitions in include_tables/exclude_tables, or set publish_via_partition_root = "
        f"false", fatal=True)


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
            hint = _privilege_hint(statement)
            raise BackendError(
                f'backend "{backend}": role "{user or "?"}" may not run {statement} ({text}; '
                f"{hint}); have a superuser run it, then restart, or set "
                f'publication_mode = "existing" to use a publication made by the DBA',
                fatal=True) from None
        raise BackendError(
            f'backend "{backend}": {statement} failed: {text}; fix the cause or create the '
            f'publication "{name}" yourself and set publication_mode = "existing"',
            fatal=True) from None


def _privilege_hint(statement: str) -> str:
    """What PostgreSQL requires for ``statement`` (one of those ensure_publication runs)."""
    if "ALL TABLES" in statement:
        return "FOR ALL TABLES needs a superuser"
    if " SET (" in statement:
        return "changing a publication's options needs ownership of the publication"
    return ("it needs CREATE on the database and ownership of the tables (and of the "
            "publication, to change it)")


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
