"""The target's record of what it already holds: ``lapidus_sync_state`` and the held tail.

Runs in the dispatcher process, in the sync sink's worker thread (psycopg2, blocking; a
MySQL/MariaDB target has the same tables and cursor, :mod:`.mysql_target`).  Both
tables live in the target and are written in the same target transaction as the rows they
describe, which is the whole exactly-once argument: after a crash anywhere, the target's rows
and its cursor are of the same moment.

* ``lapidus_sync_state``: per backend, ``cursor`` = ``{stream: key}`` of the last group
  (transaction or snapshot chunk, :mod:`.order`) with anything applied, and ``open`` = the ids
  already applied of that group when it is a snapshot chunk (the only kind of group applied in
  parts), up to :data:`OPEN_IDS_MAX`.
* ``lapidus_sync_pending``: the events of a source transaction that a batch cut (its end was
  not seen yet).  They are confirmed to the dispatcher, so the worker will not send them again,
  and applied together with the rest of their transaction when it arrives.
"""

from __future__ import annotations

import json

import orjson
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from psycopg2 import sql

from ...events import Record
from .order import order_of

STATE = "lapidus_sync_state"
PENDING = "lapidus_sync_pending"

# The ids of an open snapshot chunk group are kept up to this many.  A MySQL/MariaDB
# snapshot of an idle source is one group (its chunks share the position), and the list is
# rewritten at each commit; beyond this the group's rows are admitted again after a crash
# instead (docs/sync.md, limits).
OPEN_IDS_MAX = 10_000


@dataclass
class Cursor:
    keys: Dict[str, int] = field(default_factory=dict)
    open_group: Optional[Tuple[str, int]] = None
    open_ids: Set[str] = field(default_factory=set)
    pending: List[Record] = field(default_factory=list)
    pending_group: Optional[Tuple[str, int]] = None
    pending_ids: Set[str] = field(default_factory=set)
    open_untracked: bool = False      # more than OPEN_IDS_MAX applied: ids no longer kept

    def admits(self, record: Record, stream: str, key: int) -> bool:
        """False for an event the target already holds (applied, or held as pending)."""
        last = self.keys.get(stream)
        if last is not None and key < last:
            return False
        if last is not None and key == last:
            # only a snapshot chunk is ever applied in parts; its rows have their own ids
            # (untracked: a row of the group applied already is applied again, with the
            # values it had: nothing after the group is in the target yet)
            return self.open_group == (stream, key) and (self.open_untracked or
                                                          record.id not in self.open_ids)
        if self.pending_group == (stream, key) and record.id in self.pending_ids:
            return False
        return True

    def applied(self, stream: str, key: int, ids: List[str], partial: bool) -> None:
        if partial:
            if self.open_group != (stream, key):
                self.open_group, self.open_ids = (stream, key), set()
                self.open_untracked = False
            if not self.open_untracked:
                self.open_ids.update(ids)
                if len(self.open_ids) > OPEN_IDS_MAX:
                    self.open_ids, self.open_untracked = set(), True
        else:
            self.open_group, self.open_ids, self.open_untracked = None, set(), False
        self.keys[stream] = key

    def hold(self, records: List[Record], group: Optional[Tuple[str, int]]) -> None:
        self.pending = list(records)
        self.pending_group = group if records else None
        self.pending_ids = {r.id for r in records}

    def copy(self) -> "Cursor":
        return Cursor(dict(self.keys), self.open_group, set(self.open_ids), list(self.pending),
                      self.pending_group, set(self.pending_ids), self.open_untracked)

    def open_json(self) -> Optional[str]:
        """The ``open`` column: the open group and its applied ids (null: untracked)."""
        if self.open_group is None:
            return None
        return json.dumps({"stream": self.open_group[0], "key": self.open_group[1],
                           "ids": None if self.open_untracked else sorted(self.open_ids)})

    def load_open(self, opened: Optional[dict]) -> None:
        if opened:
            self.open_group = (opened["stream"], int(opened["key"]))
            self.open_untracked = opened["ids"] is None
            self.open_ids = set(opened["ids"] or ())


def pending_rows(records: List[Record]) -> Optional[bytes]:
    """Held events as the one value of a ``lapidus_sync_pending`` row (None: none to store)."""
    if not records:
        return None
    return orjson.dumps([[r.id, r.type, r.schema, r.table,
                          list(r.key) if r.key is not None else None, r.position,
                          r.data.decode("utf-8")] for r in records])


def pending_from_rows(blobs) -> List[Record]:
    """The held events of the ``lapidus_sync_pending`` rows' values, in ``seq`` order."""
    return [Record(i, t, s, n, tuple(k) if k is not None else None, p, d.encode("utf-8"))
            for blob in blobs for i, t, s, n, k, p, d in orjson.loads(blob)]


def ensure_tables(cur, state_schema: str) -> None:
    ident = sql.Identifier(state_schema)
    cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
    cur.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {}.{} (backend text PRIMARY KEY, cursor jsonb NOT NULL, "
        "open jsonb, last_id text, applied_at timestamptz NOT NULL DEFAULT now())"
    ).format(ident, sql.Identifier(STATE)))
    # held events as one row per delivery that added some (one parameter, not one row per
    # event: a batch cut inside a large transaction costs one INSERT)
    cur.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {}.{} (backend text NOT NULL, seq int NOT NULL, "
        "records bytea NOT NULL, PRIMARY KEY (backend, seq))"
    ).format(ident, sql.Identifier(PENDING)))


def load(cur, state_schema: str, backend: str) -> Cursor:
    ident = sql.Identifier(state_schema)
    cur.execute(sql.SQL("SELECT cursor, open FROM {}.{} WHERE backend = %s").format(
        ident, sql.Identifier(STATE)), (backend,))
    row = cur.fetchone()
    cursor = Cursor()
    if row:
        cursor.keys = {k: int(v) for k, v in row[0].items()}
        cursor.load_open(row[1])
    cur.execute(sql.SQL("SELECT records FROM {}.{} WHERE backend = %s ORDER BY seq").format(
        ident, sql.Identifier(PENDING)), (backend,))
    pending = pending_from_rows(bytes(blob) for (blob,) in cur.fetchall())
    if pending:
        cursor.hold(pending, order_of(pending[0].position, pending[0].type))
    return cursor


def save(cur, state_schema: str, backend: str, cursor: Cursor, last_id: Optional[str],
         pending_changed: bool, keep: int = 0) -> None:
    """Write ``cursor`` (inside the caller's transaction).  ``keep``: the first held events
    are stored already (a transaction that goes on over several deliveries is not rewritten)."""
    ident = sql.Identifier(state_schema)
    open_ = cursor.open_json()
    cur.execute(sql.SQL(
        "INSERT INTO {}.{} (backend, cursor, open, last_id, applied_at) "
        "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (backend) DO UPDATE SET "
        "cursor = EXCLUDED.cursor, open = EXCLUDED.open, "
        "last_id = COALESCE(EXCLUDED.last_id, {}.last_id), applied_at = now()"
    ).format(ident, sql.Identifier(STATE), sql.Identifier(STATE)),
        (backend, json.dumps(cursor.keys), open_, last_id))
    if not pending_changed:
        return
    if not keep:
        cur.execute(sql.SQL("DELETE FROM {}.{} WHERE backend = %s").format(
            ident, sql.Identifier(PENDING)), (backend,))
    blob = pending_rows(cursor.pending[keep:])
    if blob is not None:
        cur.execute(sql.SQL("INSERT INTO {}.{} (backend, seq, records) SELECT %s, "
                            "COALESCE(max(seq) + 1, 0), %s FROM {}.{} WHERE backend = %s").format(
            ident, sql.Identifier(PENDING), ident, sql.Identifier(PENDING)),
            (backend, blob, backend))
