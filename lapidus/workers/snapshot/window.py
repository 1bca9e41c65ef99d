"""One held chunk and the watermark hand-off (DBLog's method, in Sequin's variant).

Runs in the worker process.  The source opens a :class:`ChunkWindow` *before* it runs the
chunk's SELECT, gives it the rows, then emits the high watermark.  While the worker reads its
stream up to that high watermark, every change of a key of the held chunk evicts that key
(:meth:`ChunkWindow.saw`); at the high watermark the rows left are emitted, in key order,
right there in the stream: before any change committed after it.

Why this folds to the table's content: a key changed while the window is open has its newest
state in the stream (the change itself, which comes before the high watermark), so its row
from the SELECT, which may be older, is dropped; a key not changed in the window still has
the state the SELECT read.  No low watermark is needed: the window opens at the worker's own
place in the stream, before the SELECT is sent, so every change the SELECT may not have seen
is read with the window open, and a change read before it was committed long enough ago to
be visible to the SELECT (docs/snapshots.md says when it is not: synchronous replication).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .events import pk_text

Row = Tuple[Dict[str, Any], Dict[str, Any]]  # (pk, item)


class ChunkWindow:
    """The rows of one chunk of ``schema.table``, keyed by their primary key.

    ``watermark`` is the id the high watermark carries (``<id>:high``).
    ``last_key`` is the chunk's last key in the source's own form (what the next chunk's
    keyset condition starts after), whether or not that row is evicted.
    """

    def __init__(self, watermark: str, schema: str, table: str, key_names: Sequence[str]):
        self.watermark = watermark
        self.schema = schema
        self.table = table
        self.key_names = tuple(key_names)
        # pk text -> row; insertion order is key order (ORDER BY pk)
        self.rows: Dict[str, Row] = {}
        self.selected = 0
        self.last_key: Optional[List[Any]] = None
        self.evicted = 0

    def hold(self, rows: Sequence[Row], last_key: Optional[List[Any]]) -> None:
        """The SELECT's rows (``(pk, item)``, in key order) and the raw last key.

        Each row's key text is computed here, once: it is the row's key in :attr:`rows`
        and, through :meth:`remaining_keyed`, the tail of its event id.
        """
        held = self.rows
        if len(self.key_names) == 1:
            # the common case, inlined: a one-column integer key needs no function call
            name = self.key_names[0]
            for row in rows:
                value = row[0][name]
                held[f"[{value}]" if value.__class__ is int else pk_text((value,))] = row
        else:
            names = self.key_names
            for row in rows:
                pk = row[0]
                held[pk_text([pk[name] for name in names])] = row
        self.selected = len(rows)
        self.last_key = last_key

    def hold_keyed(self, rows: Sequence[Tuple[str, Row]], last_key: Optional[List[Any]]) -> None:
        """:meth:`hold` for rows that come with their key text, ``(pk text, (pk, item))``:
        a source that computes the text while it builds the rows (PostgreSQL's
        :mod:`...postgresql.chunkrows`) saves the pass over them.  The text must be
        :func:`.events.pk_text` of the key values, or changes would not evict the row."""
        self.rows = dict(rows)
        self.selected = len(rows)
        self.last_key = last_key

    def _key(self, pk) -> Optional[str]:
        try:
            return pk_text([pk[name] for name in self.key_names])
        except (KeyError, TypeError):
            return None   # no complete key (a table without one): cannot match a row

    def saw(self, schema: Optional[str], table: Optional[str], kind: str,
            pk: Optional[dict], before: Optional[dict]) -> None:
        """A change in the stream while the window is open: evict the keys it touches.

        An update that changes the key names the old key in ``before``: both go.  A
        truncate of the table empties the chunk.
        """
        if table != self.table or schema != self.schema:
            return
        if kind == "truncate":
            self.evicted += len(self.rows)
            self.rows.clear()
            return
        for keys in (pk, before):
            if keys:
                key = self._key(keys)
                if key is not None and self.rows.pop(key, None) is not None:
                    self.evicted += 1

    def watermark_kind(self, content: str) -> Optional[str]:
        """``"high"`` for this window's watermark, None for any other (one of an earlier
        window, resent after a restart of the stream)."""
        head, _, kind = content.rpartition(":")
        return kind if head == self.watermark and kind == "high" else None

    def remaining(self) -> List[Row]:
        """The rows no change evicted, in key order: what the high watermark emits."""
        return list(self.rows.values())

    def remaining_keyed(self) -> List[Tuple[str, Row]]:
        """:meth:`remaining` with each row's key text: ``(pk text, (pk, item))``."""
        return list(self.rows.items())


class ValueKeyedWindow(ChunkWindow):
    """A window whose rows are keyed by something other than the id's key text (a subclass's
    :meth:`_key`: tuples of values on MySQL, the BSON ``_id`` on MongoDB); the text of each
    event id is computed when the chunk is emitted, for the rows that are left."""

    def hold(self, rows: Sequence[Row], last_key: Optional[List[Any]]) -> None:
        for pk, item in rows:
            self.rows[self._key(pk)] = (pk, item)
        self.selected = len(rows)
        self.last_key = last_key

    def remaining_keyed(self) -> List[Tuple[str, Row]]:
        return [(pk_text(list(pk.values())), (pk, item)) for pk, item in self.rows.values()]
