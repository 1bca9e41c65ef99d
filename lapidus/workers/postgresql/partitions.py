"""Partitions and their partitioned parents, for include/exclude and publish_via_partition_root.

Runs in the PostgreSQL worker process, on the catalog connection.  A partition holds rows of
its parent, so ``include_tables``/``exclude_tables`` naming the parent must cover the
partitions: whether their changes arrive under their own names (the default) or under the
parent's (``publish_via_partition_root``).  :class:`PartitionFilter` judges a partition by its
own name and its parents' (:meth:`lapidus.filters.TableFilter.allows_any`).

Only declarative partitioning counts (``relispartition``): children of plain table inheritance
are separate tables to publications and to pgoutput, and so to Lapidus.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from ...filters import TableFilter

Table = Tuple[str, str]

# Every ordinary or partitioned table with its partitioned parents, nearest first (none for a
# table that is no partition).  pg_inherits rather than pg_partition_ancestors (PostgreSQL 12+)
# so servers from 10 on answer.  %(one)s: NULL for all tables (but the system catalogs, which
# are never published), else one quoted name.
_TABLES_AND_PARENTS = """
WITH RECURSIVE up(child, parent, depth) AS (
    SELECT i.inhrelid, i.inhparent, 1
    FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
    WHERE c.relispartition
  UNION ALL
    SELECT up.child, i.inhparent, up.depth + 1
    FROM up JOIN pg_catalog.pg_inherits i ON i.inhrelid = up.parent
    JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
    WHERE c.relispartition
)
SELECT n.nspname::text, c.relname::text,
       array_remove(array_agg(pn.nspname::text ORDER BY up.depth), NULL),
       array_remove(array_agg(p.relname::text ORDER BY up.depth), NULL)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN up ON up.child = c.oid
LEFT JOIN pg_catalog.pg_class p ON p.oid = up.parent
LEFT JOIN pg_catalog.pg_namespace pn ON pn.oid = p.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND (%(one)s::text IS NULL OR c.oid = pg_catalog.to_regclass(%(one)s::text))
GROUP BY 1, 2
"""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def parents_of(conn, one: Optional[Table] = None) -> Dict[Table, Tuple[Table, ...]]:
    """Each table's partitioned parents, nearest first (empty for a table that is no
    partition): of every table of the database, or of ``one`` (absent when it does not
    exist)."""
    arg = None if one is None else f"{_quote(one[0])}.{_quote(one[1])}"
    with conn.cursor() as cur:
        cur.execute(_TABLES_AND_PARENTS, {"one": arg})
        rows = cur.fetchall()
    return {(schema, table): tuple(zip(schemas, tables))
            for schema, table, schemas, tables in rows}


class PartitionFilter:
    """A :class:`TableFilter` that judges a partition by its own name and its parents'.

    The hierarchy is read once at construction; a table met later (a partition created
    while Lapidus runs) is looked up on its first decision.  Decisions are cached, like
    TableFilter's: a partition attached or detached while Lapidus runs keeps the decision of
    its first sight until the next start.
    """

    def __init__(self, conn, table_filter: TableFilter):
        self.conn = conn
        self.table_filter = table_filter
        self.parents = parents_of(conn)
        self._cache: Dict[Table, bool] = {}

    @property
    def is_trivial(self) -> bool:
        return self.table_filter.is_trivial

    def allows(self, schema: str, table: str) -> bool:
        key = (schema, table)
        hit = self._cache.get(key)
        if hit is None:
            hit = self.table_filter.allows_any((key,) + self.parents_of(key))
            self._cache[key] = hit
        return hit

    def parents_of(self, table: Table) -> Tuple[Table, ...]:
        """``table``'s partitioned parents, nearest first; looked up when not known yet."""
        if table not in self.parents:
            # none for a table gone meanwhile: looked up once, judged by its own name
            self.parents[table] = parents_of(self.conn, table).get(table, ())
        return self.parents[table]

    def partitions(self) -> List[Table]:
        """The partitions of the database known now, sorted."""
        return sorted(t for t, parents in self.parents.items() if parents)


def partition_filter(conn, table_filter: TableFilter):
    """The filter a PostgreSQL backend applies: ``table_filter`` itself when it has no
    patterns (every table passes, partitions need no look-up), else a
    :class:`PartitionFilter` over it."""
    if table_filter.is_trivial:
        return table_filter
    return PartitionFilter(conn, table_filter)


def split_partitions(table_filter, *, all_tables: bool) -> List[Tuple[Table, Table, bool]]:
    """With publish_via_partition_root, the partitions include/exclude would have to judge
    apart from the parent their changes arrive as: ``(partition, parent, partition
    streamed)`` for each.

    A FOR ALL TABLES publication (``all_tables``) sends every partition's changes as its
    topmost parent; a FOR TABLE one (filtered: the tables that pass) as its topmost parent
    in the publication, or as itself when none is.  Either way a decision for the partition
    that differs from that parent's cannot be honoured: the event names the parent only.
    """
    if not isinstance(table_filter, PartitionFilter):
        return []                       # no patterns: every table passes, none differ
    found = []
    for partition in table_filter.partitions():
        streamed = table_filter.allows(*partition)
        parents = table_filter.parents_of(partition)
        if all_tables:
            via: Optional[Table] = parents[-1]
        else:
            published = [p for p in parents if table_filter.allows(*p)]
            via = published[-1] if published else None
        if via is not None and table_filter.allows(*via) != streamed:
            found.append((partition, via, streamed))
    return found


def describe_split(split: Sequence[Tuple[Table, Table, bool]]) -> str:
    """``public.m1 is excluded but its parent public.m is not, ...`` (ten at most)."""
    parts = [f"{'.'.join(partition)} is {'included' if streamed else 'excluded'} but its "
             f"parent {'.'.join(parent)} is not" for partition, parent, streamed in split[:10]]
    return ", ".join(parts) + (" ..." if len(split) > 10 else "")
