"""One snapshot run (the initial snapshot or a backfill): its progress and its held chunk.

Runs in the worker process.  :class:`SnapshotRun` is the source-agnostic half; a source
subclasses it with the database half (:meth:`SnapshotRun.start_chunk`: open a window with
:meth:`open_window`, read the chunk between its watermarks, :meth:`ChunkWindow.hold` the
rows) and calls, from its stream reading, :meth:`saw` for every change and
:meth:`emit_window` when the chunk's high watermark (or position) is reached.

Contract with the source and the worker loop:

* a chunk is started only when the worker asks the source for more (:meth:`wants_chunk` in
  ``read``), so sinks that are behind hold the snapshot back and at most one chunk is held;
* the ``read`` events of a chunk end their batch: the checkpoint of that batch carries the
  progress (:meth:`SnapshotProgress.state`), saved once every sink confirmed it;
* a source that is opened again (a reconnect, a restart) builds a new run from the confirmed
  checkpoint's progress: a chunk held or emitted but not confirmed is read again, same ids.
"""

from __future__ import annotations

import uuid
from typing import List, Optional, Sequence, Tuple

from ...events import Event, ReadChunk, read_pieces
from ...sink_runs import end_event, run_label
from ..base import BackendError
from .events import id_head, read_events
from .lines import Texts, chunk_lines
from .progress import SnapshotProgress
from .window import ChunkWindow


class SnapshotRefused(BackendError):
    """A backfill request that cannot run (unknown table, not streamed, no key, bad filter):
    the message names the table, the reason and the fix; the backend streams on."""


class SnapshotRun:
    """The progress and held chunk of one run; subclasses implement :meth:`start_chunk`."""

    #: what :meth:`open_window` makes (a source may key its held rows its own way)
    window_class = ChunkWindow

    def __init__(self, backend: str, options: dict, progress: SnapshotProgress, log,
                 encoded: bool = False):
        self.backend = backend
        # the worker loop's run (Source.encoded_reads): the source holds each row as
        # (event id, record key, line) made by lines(), and a chunk is emitted as one
        # ReadChunk; otherwise rows are (pk, item) dicts and each becomes an Event
        self.encoded = encoded
        self.options = options
        self.progress = progress
        self.log = log
        self.chunk_rows = int(options.get("snapshot_chunk_rows") or 5000)
        self.timeout_seconds = float(options.get("snapshot_chunk_timeout") or 30.0)
        self.window: Optional[ChunkWindow] = None
        self.nonce = uuid.uuid4().hex[:12]   # tells this run's watermarks from a stale run's
        self.chunks = 0
        self.conn = None                     # the run's own connection, once a chunk opened it
        self.ended: Optional[object] = None  # a sink's run's end, for the source's next batch

    # -- the worker's side ----------------------------------------------------------------

    def wants_chunk(self) -> bool:
        return self.window is None and not self.progress.done

    def start_chunk(self) -> None:
        """Open a window, read the next chunk of ``progress.table`` after
        ``progress.last_key`` (and matching ``progress.where``) between the watermarks, and
        hold its rows.  Called only when :meth:`wants_chunk`."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the run's own connection; the held chunk is dropped (read again later)."""
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:       # closing a broken connection may fail; nothing to keep
                pass
            self.conn = None
        self.window = None

    def cancel(self) -> None:
        """``lapidusctl backfill --cancel``: stop here; events already emitted stand."""
        self.log.info("snapshot cancelled", n=self.progress.n, rows=self.progress.rows)
        self.progress.cancel()
        self.close()

    # -- helpers for the source's half ----------------------------------------------------

    def require_key(self, schema: str, table: str, key: Sequence[str]) -> Sequence[str]:
        """``key``, the table's primary key columns as found now; a table that lost its key
        after the run began (it was checked before) stops the backend with the fix."""
        if not key:
            raise BackendError(
                f'backend "{self.backend}": table {schema}.{table} lost its primary key '
                f"during the snapshot; give it one again (or exclude it) and restart",
                fatal=True)
        return key

    def open_window(self, schema: str, table: str, key_names: Sequence[str]) -> ChunkWindow:
        """A new window for the next chunk; its ``watermark`` is unique to this run."""
        self.chunks += 1
        mark = f"{self.backend}:{self.progress.n}:{self.nonce}:{self.chunks}"
        self.window = self.window_class(mark, schema, table, key_names)
        return self.window

    def saw(self, schema, table, kind: str, pk, before) -> None:
        """A change read from the stream: it evicts its keys from the held chunk."""
        if self.window is not None:
            self.window.saw(schema, table, kind, pk, before)

    def emit_window(self, events: List, position: str, ts: Optional[str]) -> None:
        """The held chunk's high watermark: its remaining rows become ``read`` events,
        appended to ``events`` (the source then ends the batch)."""
        window, self.window = self.window, None
        progress = self.progress
        if self.encoded:
            rows = window.remaining()
            if rows:
                events.append(self._read_chunk(window.schema, window.table, rows, position, ts))
        else:
            rows = window.remaining_keyed()
            events.extend(read_events(self.backend, run_label(progress.n, progress.sink),
                                      window.schema, window.table, rows, position, ts))
        progress.chunk_emitted(window.last_key, len(rows), window.selected, self.chunk_rows)
        if progress.done and progress.sink is not None:
            # a sink's run says where it ends (its tables are one: a backfill's)
            events.append(end_event(self.backend, progress.n, progress.sink, window.schema,
                                    window.table, progress.rows, position, ts))
        self._finish_if_done()

    def lines(self, schema: str, table: str, columns: Sequence[Texts], names: Sequence[str],
              key_index: Sequence[int], keys) -> List[Tuple[str, Tuple[str, tuple, str]]]:
        """A chunk's rows of ``schema.table`` as :func:`.lines.chunk_lines` gives them (for an
        ``encoded`` run), under their key text: the source holds ``(event id, record key,
        line)`` under its window's key."""
        head, middle, _ = read_pieces(self._sample(schema, table, "", None))
        label = run_label(self.progress.n, self.progress.sink)
        return chunk_lines(columns, names, key_index, keys,
                           id_head(self.backend, label, schema, table), head.decode(),
                           middle.decode())

    def _sample(self, schema: str, table: str, position: str, ts: Optional[str]) -> Event:
        """A read event of ``schema.table`` at ``position``: what the pieces of its run's JSON
        are cut from (:func:`lapidus.events.read_pieces`)."""
        return Event("", "read", self.backend, schema, table, {}, {}, None, position, None, ts)

    def _read_chunk(self, schema: str, table: str, rows: list, position: str,
                    ts: Optional[str]) -> ReadChunk:
        """Held ``(event id, record key, line)`` rows as one :class:`ReadChunk` of finished
        records: each line with the tail of the high watermark's position and time."""
        tail = read_pieces(self._sample(schema, table, position, ts))[2].decode()
        return ReadChunk([(event_id, "read", schema, table, key, position,
                           (line + tail).encode()) for event_id, key, line in rows],
                         "read", self.backend, schema, table, ts)

    def skip_table(self, schema: str, table: str) -> None:
        """The table was dropped since the run began: nothing of it is left to read (its
        rows read so far stay with the consumer, as after any DROP TABLE)."""
        self.log.warning("table dropped during the snapshot; nothing more to read",
                         table=f"{schema}.{table}")
        self.window = None
        progress = self.progress
        progress.chunk_emitted(None, 0, 0, self.chunk_rows)
        if progress.done and progress.sink is not None:
            self.ended = end_event(self.backend, progress.n, progress.sink, schema, table,
                                   progress.rows, "", None)
        self._finish_if_done()

    def take_ended(self, events: List) -> None:
        """Put the end of a sink's run that ended without a chunk (its table was dropped,
        :meth:`skip_table`) first in ``events``, the source's next batch."""
        if self.ended is not None:
            events.insert(0, self.ended)
            self.ended = None

    def _finish_if_done(self) -> None:
        if self.progress.done:
            self.log.info("snapshot finished", n=self.progress.n, rows=self.progress.rows)
            self.close()
