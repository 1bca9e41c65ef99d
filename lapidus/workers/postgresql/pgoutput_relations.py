"""Where the pgoutput decoder finds a relation's description when its ``R`` message is not at hand.

Runs in the PostgreSQL worker process.

pgoutput describes a table once per replication session (and again after DDL), before its first
change; changes carry only the table's OID.  The worker resumes reading the spool at its
checkpoint, which may lie after that description (the worker was killed, the segment holding it
was delivered and deleted), so a description must outlive the spool:

* :class:`RelationLog` keeps every ``R`` frame the decoder saw, with the spool position it
  was read at, in ``<state>/pgoutput-relations.jsonl`` (appended and fsynced before the change
  that needs it can be delivered).  On start, for each relation it keeps the newest frame read
  before the resume position: exactly the description the spool had in force there.  Frames at
  or after the resume position are dropped; reading the spool again meets them again.
* :class:`CatalogRelations` asks the current catalog: a table's primary key (the event's ``pk``
  when the replica identity is FULL or an index), and, only if the log was lost, a relation's
  columns as they are now.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ...checkpoint import fsync_dir
from .pgoutput import Relation

Position = Tuple[int, int]
FILE_NAME = "pgoutput-relations.jsonl"


class RelationLog:
    """Durable ``R`` frames with their spool positions; see the module docstring.

    ``resume`` is the spool position reading starts at, ``None`` when the spool is read from
    its beginning (no checkpoint yet): then nothing from earlier runs is kept.
    """

    def __init__(self, path: Path, resume: Optional[Position]):
        self.path = Path(path)
        kept = self._load(resume) if resume is not None else {}
        self._frames: List[bytes] = [frame for _, frame in kept.values()]
        self._rewrite(kept)

    def frames(self) -> List[bytes]:
        """The frames in force at the resume position, one per relation."""
        return list(self._frames)

    def append(self, position: Position, frame: bytes) -> None:
        """Add one frame read at ``position``, durably (R frames are rare: once per table
        per replication session and after DDL, so an fsync each costs nothing noticeable)."""
        record = {"segment": position[0], "offset": position[1], "frame": frame.hex()}
        with open(self.path, "ab") as f:
            f.write(json.dumps(record).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())

    def _load(self, resume: Position) -> Dict[int, Tuple[Position, bytes]]:
        kept: Dict[int, Tuple[Position, bytes]] = {}
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return kept
        for number, line in enumerate(lines):
            try:
                record = json.loads(line)
                position = (int(record["segment"]), int(record["offset"]))
                frame = bytes.fromhex(record["frame"])
            except (ValueError, KeyError, TypeError):
                if number == len(lines) - 1:
                    # Torn by a crash while appending: the change needing it was not yet
                    # delivered, so the spool still has the frame after the resume position.
                    break
                raise ValueError(f"{self.path}: line {number + 1} is damaged; delete the "
                                 f"file to describe relations from the current catalog") from None
            if position >= resume:
                continue
            relid = int.from_bytes(frame[1:5], "big")
            if relid not in kept or kept[relid][0] <= position:
                kept[relid] = (position, frame)
        return kept

    def _rewrite(self, kept: Dict[int, Tuple[Position, bytes]]) -> None:
        """Replace the file by what is kept (temp file, fsync, rename, fsync directory)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            for (segment, offset), frame in sorted(kept.values()):
                record = {"segment": segment, "offset": offset, "frame": frame.hex()}
                f.write(json.dumps(record).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)


_RELATION_QUERY = """
SELECT n.nspname, c.relname, c.relreplident
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = %s
"""

# Columns as pgoutput sends them: no dropped or generated columns, in attnum order, flagged
# when they belong to the replica identity (every column for FULL).
_COLUMNS_QUERY = """
SELECT a.attname, a.atttypid::int8,
       CASE c.relreplident
         WHEN 'f' THEN true
         WHEN 'd' THEN EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid
                               AND i.indisprimary AND a.attnum = ANY(i.indkey))
         WHEN 'i' THEN EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid
                               AND i.indisreplident AND a.attnum = ANY(i.indkey))
         ELSE false END
FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""

_PRIMARY_KEY_QUERY = """
SELECT a.attname
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY a.attnum
"""


class CatalogRelations:
    """Relation facts from the current catalog, over the worker's normal connection."""

    def __init__(self, conn):
        self.conn = conn

    def primary_key(self, relid: int) -> Optional[Tuple[str, ...]]:
        """Primary-key column names in column order (as wal2json's ``pk``), or None."""
        with self.conn.cursor() as cur:
            cur.execute(_PRIMARY_KEY_QUERY, (relid,))
            names = tuple(row[0] for row in cur.fetchall())
        return names or None

    def describe(self, relid: int) -> Optional[Relation]:
        """The relation as an ``R`` message would describe it now; None if it is gone."""
        with self.conn.cursor() as cur:
            cur.execute(_RELATION_QUERY, (relid,))
            row = cur.fetchone()
            if row is None:
                return None
            schema, table, identity = row
            cur.execute(_COLUMNS_QUERY, (relid,))
            columns = cur.fetchall()
        return Relation(relid, schema, table, identity, tuple(c[0] for c in columns),
                        tuple(bool(c[2]) for c in columns), tuple(int(c[1]) for c in columns))
