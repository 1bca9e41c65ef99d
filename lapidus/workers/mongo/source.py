"""The MongoDB source: one pymongo change stream, read in batches, resumed by resume token.

Runs in the mongo worker process, after fork (the client, its monitor threads and the stream
are created in :meth:`MongoSource.open`).  The contract is :class:`lapidus.workers.base.Source`;
what is specific to MongoDB:

* **Scope.** One database when ``database`` is set, else the whole deployment.  Include/exclude
  globs apply to ``database.collection``; what can be translated exactly is pushed into the
  stream's ``$match`` (:mod:`.pipeline`).
* **Checkpoint** (:mod:`.position`): the resume token after the last delivered change, as
  ``{"position": "...", "resume_token": {"_data": "..."}, "start_after": false}``.  Tokens are
  per change, also inside a multi-document transaction, so a restart neither skips nor repeats
  part of one.
  When the server's batch is exhausted the driver caches the batch's ``postBatchResumeToken``,
  which is past every change the server examined, including filtered ones: an empty batch then
  still carries a newer checkpoint, so a quiet or fully excluded stream keeps its saved position
  inside the oplog.
* **First start** (no checkpoint): from now.  The stream's initial resume token is written to
  ``<state_dir>/mongo-first-start.json`` before :meth:`open` returns and is the first batch's
  checkpoint; until the worker has saved a real checkpoint (:meth:`commit`), a restart resumes
  from that file instead of from a new "now", so changes made while the worker was down
  between its first start and its first checkpoint are not lost.
* **Invalidate** (database dropped while a database is watched): a ``schema`` event, then the
  stream is reopened with ``startAfter`` and follows the database when it is recreated.
* **History lost** (the oplog no longer holds the token): ``history_lost = "fail"`` raises a
  fatal error naming the option; ``"restart_from_now"`` delivers a ``gap`` event and goes on
  from now.  Never a silent jump forward.
* **Snapshots** (docs/snapshots.md): ``snapshot = "initial"`` on a first start, and backfills
  (:meth:`MongoSource.start_backfill`), read collections in ``_id`` chunks between the
  stream's changes (:mod:`.snapshot`); the run's progress is the checkpoint's ``"snapshot"``
  key, so a restart resumes an unfinished run from its last confirmed chunk.  Changes of the
  watermark collection are the runs' watermarks and never become events.
"""

from __future__ import annotations

import datetime as _dt
import time
from typing import Any, Callable, List, Optional

from pymongo.errors import PyMongoError

from ...events import Event
from ...filters import TableFilter
from ..base import BackendError, Batch, Source
from ..first_start import FirstStart
from ..snapshot.progress import RunAtOpen, SnapshotProgress
from ..snapshot.run import SnapshotRefused
from . import errors
from .bson_json import format_datetime
from .changes import ChangeMapper
from .pipeline import match_stage
from .position import ResumePoint, parse_checkpoint
from .settings import MongoSettings, create_client
from .snapshot import (DEFAULT_WATERMARK_DATABASE, DEFAULT_WATERMARKS, MongoSnapshot,
                       backfill_target, check_filter, estimates, snapshot_collections,
                       watermark_namespace)

# getMore waits at most this long for a change when there is none; read() loops until its own
# timeout.  Short, so a read overshoots its timeout (the worker loop uses 0.2 s) by little and
# the loop gets back to its acks soon; an idle stream costs five cheap round trips a second.
MAX_AWAIT_MS = 200

# First-start marker (see the module docstring), next to the worker's checkpoint.
FIRST_START_FILE = "mongo-first-start.json"

# MongoDB 6.0 (wire version 17) introduced pre- and post-images.
_WIRE_VERSION_6_0 = 17


class MongoSource(Source):
    """Change stream of one MongoDB deployment or database.  Runs in the mongo worker process.

    ``client_factory`` builds the pymongo client from the settings (tests replace it).
    """

    def __init__(self, backend, state_dir, log,
                 client_factory: Callable[[MongoSettings], Any] = create_client):
        super().__init__(backend, state_dir, log)
        # Invalid options are reported by open(), where the worker loop expects BackendError
        # (and where a fatal one stops the restarts); the constructor never raises.
        self._invalid: Optional[BackendError] = None
        try:
            self.settings = MongoSettings.from_options(backend.name, backend.options or {})
        except BackendError as exc:
            self._invalid = exc
            self.settings = MongoSettings(backend=backend.name)
        self.table_filter = TableFilter(backend.include_tables, backend.exclude_tables)
        try:
            self.watermarks = watermark_namespace(backend.name, self.settings.database,
                                                  backend.options or {})
        except BackendError as exc:
            self._invalid = self._invalid or exc
            self.watermarks = (DEFAULT_WATERMARK_DATABASE, DEFAULT_WATERMARKS)
        # the watermarks pass the $match whatever the filters say (they are never events)
        match = match_stage(backend.include_tables, backend.exclude_tables,
                            always=self.watermarks)
        self.pipeline: List[dict] = [match] if match else []
        self._client_factory = client_factory
        self.first_start = FirstStart(state_dir, FIRST_START_FILE, log)
        self._client = None
        self._stream = None
        self._mapper: Optional[ChangeMapper] = None
        self.database: Optional[str] = None
        self._point: Optional[ResumePoint] = None    # where the stream is (in memory)
        self._reported: Any = None                    # the last checkpoint handed out
        self._pending: List[Batch] = []               # batches to hand out before reading on
        self._last_ts: Optional[str] = None
        # the current or last snapshot run's progress (None: none in this checkpoint's
        # history) and, while it runs, its driver
        self.snapshot_progress: Optional[SnapshotProgress] = None
        self.snapshot: Optional[MongoSnapshot] = None
        self._run_at_open = RunAtOpen(dict(self.backend.options or {}), self.log)

    # -- Source interface -------------------------------------------------------------------

    def target(self) -> str:
        """``host:port`` of the server(s), for "waiting for ..." (never a password)."""
        if self.settings.uri is not None:
            try:
                from pymongo.uri_parser import parse_uri
                nodes = parse_uri(self.settings.uri, validate=False)["nodelist"]
                return ",".join(f"{host}:{port}" for host, port in nodes)
            except Exception:       # an unparsable uri is reported by open(); name it redacted
                return self.settings.where
        return self.settings.where

    def open(self, checkpoint: Optional[Any]) -> None:
        self.close()
        if self._invalid is not None:
            raise self._invalid
        self._client = self._client_factory(self.settings)
        try:
            hello = self._client.admin.command("hello")
        except PyMongoError as exc:
            raise errors.describe(self.settings, exc, "connecting") from None
        self._check_deployment(hello)
        self.database = self.settings.database
        self._mapper = ChangeMapper(self.backend.name, self.table_filter, self.database)
        self._pending = []

        point = self._start_point(checkpoint)
        # Without a checkpoint the first read hands out the initial token as one.
        self._reported = checkpoint
        self._open_stream(point)
        # After the stream: the first chunk's window then opens on a stream that is running.
        self._prepare_snapshot(checkpoint)
        if point is None:
            self.first_start.remember(self._point.to_checkpoint())
        self.log.info("mongo change stream opened", database=self.database or "*",
                      resumed=point is not None, position=self._point.position)

    def read(self, max_events: int, timeout: float) -> Batch:
        if self._pending:
            return self._pending.pop(0)
        stream = self._require_stream()
        snapshot = self.snapshot
        if snapshot is not None and snapshot.wants_chunk():
            # Only here, when the worker asks for more: sinks that are behind (backpressure)
            # hold the next chunk back, and a held chunk is never joined by another.
            snapshot.start_chunk()
        watermarks = self.watermarks
        deadline = time.monotonic() + timeout
        events: List[Event] = []
        seen = False            # a change (delivered or filtered) came out of ``stream``
        while len(events) < max_events:
            if not stream.alive:
                # Closed by the server after an invalidate (or by the driver): go on from the
                # current point; startAfter when that is the invalidate's token.
                if events:
                    break
                if seen:
                    # Filtered changes came before the close.  Otherwise the point is already
                    # right, and the driver's token would undo the invalidate's startAfter.
                    self._settle(stream, seen)
                    seen = False
                stream = self._open_stream(self._point)
                if self._pending:
                    return self._pending.pop(0)     # the gap comes before anything newer
            if events and not _has_buffered(stream):
                break                # never wait for more once there is something to deliver
            try:
                change = stream.try_next()
            except PyMongoError as exc:
                # The driver's cached token still is the last change it returned.
                self._settle(stream, seen)
                if not errors.is_history_lost(exc):
                    raise errors.describe(self.settings, exc, "reading changes") from None
                delivered = self._batch(events)
                self._restart_after_history_lost(self._point, exc)
                return delivered if events else self._pending.pop(0)
            if change is None:
                if events or time.monotonic() >= deadline:
                    break
                continue
            seen = True
            ns = change.get("ns")
            if ns is not None and (ns.get("db"), ns.get("coll")) == watermarks:
                # a watermark (this run's, a stale one, another backend's): never an event
                if snapshot is not None and snapshot.watermark(change, events):
                    # a chunk's rows: the checkpoint after them carries the progress
                    if self.snapshot_progress.done:
                        self.snapshot = None
                    break
                continue
            if snapshot is not None:
                snapshot.saw_change(change)
            event = self._mapper.event(change)
            if event is not None:
                events.append(event)
                self._last_ts = event.ts
            if change["operationType"] == "invalidate":
                # The driver would resume with resumeAfter, which the server refuses for this
                # token; startAfter is the only way on.
                self._point = ResumePoint(change["_id"], start_after=True)
                return self._batch(events)
        self._settle(stream, seen)
        return self._batch(events)

    def commit(self, checkpoint: Any) -> None:
        self.first_start.settled()

    def status(self) -> dict:
        out = {
            "database": self.database or "*",
            "read_position": self._point.position if self._point else None,
            "last_change_ts": self._last_ts,
        }
        if self.snapshot_progress is not None:
            out["snapshot"] = self.snapshot_progress.status()
        return out

    # -- snapshots (docs/snapshots.md) ------------------------------------------------------

    def start_backfill(self, n: int, table: str, where: Optional[str],
                       sink: Optional[str] = None) -> str:
        """Backfill ``n`` of ``table`` (``collection`` or ``database.collection``), the
        documents matching ``where`` (an Extended JSON filter document) or all; online,
        between the stream's changes.  Returns ``database.collection``."""
        name = self.backend.name
        if self._client is None:
            raise SnapshotRefused(f'backend "{name}": cannot backfill {table}: the backend is '
                                  f"not connected; try again once it streams")
        if self.snapshot_running():
            raise SnapshotRefused(
                f'backend "{name}": cannot backfill {table}: snapshot run '
                f"{self.snapshot_progress.n} is still in progress; wait for it or cancel it "
                f"(lapidusctl backfill --cancel)")
        try:
            namespace = backfill_target(self._client, self.database, table, self.table_filter,
                                        self.watermarks, name)
            check_filter(self._client, name, namespace, where)
        except PyMongoError as exc:
            raise errors.describe(self.settings, exc, f"checking the backfill of {table}") \
                from None
        progress = SnapshotProgress(n, [namespace], where=where or None, sink=sink)
        self._start_run(progress)
        self.log.info("backfill started", n=n, table=".".join(namespace), where=where)
        return ".".join(namespace)

    def _prepare_snapshot(self, checkpoint: Optional[Any]) -> None:
        """The run as of ``checkpoint``: the initial snapshot on a first start, an
        unfinished run (initial or backfill) resumed from its saved progress, or none.  Every
        open starts again from the confirmed checkpoint's progress (a chunk held or emitted
        but unconfirmed is read again, with the same ids)."""
        self.snapshot = None
        self.snapshot_progress = None
        progress = self._run_at_open.progress(checkpoint, self._initial_collections)
        self.snapshot_progress = progress
        if progress is None or progress.done:
            return
        self._start_run(progress)

    def _initial_collections(self) -> list:
        try:
            return snapshot_collections(self._client, self.database, self.table_filter,
                                        self.watermarks)
        except PyMongoError as exc:
            raise errors.describe(self.settings, exc, "listing the collections to "
                                  "snapshot") from None

    def _start_run(self, progress: SnapshotProgress) -> None:
        progress.estimates.update(estimates(self._client, progress.tables[progress.index:]))
        self.snapshot_progress = progress
        self.snapshot = MongoSnapshot(self.backend.name, dict(self.backend.options or {}),
                                      self.settings, self._client, progress, self.log,
                                      self.watermarks)

    def close(self) -> None:
        if self.snapshot is not None:
            self.snapshot.close()   # the held chunk goes; open() builds the run again
        stream, client = self._stream, self._client
        self._stream = self._client = None
        for thing in (stream, client):
            if thing is not None:
                try:
                    thing.close()
                except PyMongoError:
                    pass            # closing a dead connection; nothing left to release

    # -- opening ------------------------------------------------------------------------------

    def _check_deployment(self, hello: dict) -> None:
        if not hello.get("setName") and hello.get("msg") != "isdbgrid":
            raise errors.not_a_replica_set(self.settings)
        needs_images = (self.settings.full_document_before_change != "off"
                        or self.settings.full_document in ("whenAvailable", "required"))
        if needs_images and hello.get("maxWireVersion", 0) < _WIRE_VERSION_6_0:
            option = ("full_document_before_change"
                      if self.settings.full_document_before_change != "off" else "full_document")
            raise BackendError(
                f'backend "{self.settings.backend}": {option} = '
                f'"{getattr(self.settings, option)}" needs pre-/post-images, which MongoDB at '
                f"{self.settings.where} does not have (before 6.0); use "
                '"off" / "updateLookup" or upgrade the server', fatal=True)

    def share_state(self, store) -> None:
        """Cluster mode: the first-start position lives in the bucket, beside the checkpoint,
        so the node that takes the backend over resumes from it too."""
        self.first_start.share(store)

    def _start_point(self, checkpoint: Optional[Any]) -> Optional[ResumePoint]:
        marker = self.first_start.recall(checkpoint)
        if checkpoint is None:
            return parse_checkpoint(marker) if marker is not None else None
        try:
            return parse_checkpoint(checkpoint)
        except ValueError as exc:
            raise BackendError(
                f'backend "{self.settings.backend}": the saved checkpoint is not a MongoDB '
                f"resume point ({exc}); delete the backend's checkpoint to start from now",
                fatal=True) from None

    def _open_stream(self, point: Optional[ResumePoint]):
        """(Re)open the stream at ``point`` (``None``: now); sets ``self._point``."""
        if self._stream is not None:
            try:
                self._stream.close()
            except PyMongoError:
                pass
            self._stream = None
        target = self._client[self.database] if self.database else self._client
        kwargs = {"pipeline": self.pipeline, "full_document": self.settings.full_document,
                  "max_await_time_ms": MAX_AWAIT_MS}
        if self.settings.full_document_before_change != "off":
            kwargs["full_document_before_change"] = self.settings.full_document_before_change
        if self.settings.batch_size:
            kwargs["batch_size"] = self.settings.batch_size
        if point is not None:
            kwargs["start_after" if point.start_after else "resume_after"] = point.token
        try:
            stream = target.watch(**kwargs)
        except PyMongoError as exc:
            if point is not None and errors.is_history_lost(exc):
                self._point = point
                return self._restart_after_history_lost(point, exc)
            raise errors.describe(self.settings, exc, "opening the change stream") from None
        if point is not None:
            self._point = point
        else:
            token = stream.resume_token
            if token is None:       # MongoDB < 4.0.7 sent no postBatchResumeToken
                stream.close()
                raise BackendError(
                    f'backend "{self.settings.backend}": MongoDB at {self.settings.where} '
                    "returned no resume token for a new change stream; MongoDB 4.4 or later "
                    "is required", fatal=True)
            self._point = ResumePoint(token)
        self._stream = stream
        return stream

    def _restart_after_history_lost(self, lost: ResumePoint, exc: PyMongoError):
        """Apply the ``history_lost`` policy; on ``restart_from_now`` queue the gap event."""
        reason = self.settings.redact(str((getattr(exc, "details", None) or {})
                                          .get("errmsg", exc)))
        if self.settings.history_lost != "restart_from_now":
            raise errors.history_lost(self.settings, lost.position, reason)
        self.log.error("mongo change stream history lost; restarting from now",
                       lost_after=lost.position, reason=reason)
        if self.snapshot is not None:
            # the held chunk's watermark may be among what is skipped: read the chunk again
            self.snapshot.window = None
        stream = self._open_stream(None)
        checkpoint = self._point.to_checkpoint()
        position = self._point.position
        gap = Event(
            id=f"{self.backend.name}:{position}:0",
            type="gap",
            backend=self.backend.name,
            schema=self.database,
            table=None,
            pk=None,
            item={"reason": "history_lost", "lost_after": lost.position,
                  "resumed_at": position, "message": reason},
            before=None,
            position=position,
            txid=None,
            ts=format_datetime(_dt.datetime.now(_dt.timezone.utc)),
        )
        self._pending.append(Batch([gap], checkpoint))
        self._reported = checkpoint
        return stream

    # -- reading ------------------------------------------------------------------------------

    def _require_stream(self):
        if self._stream is None:
            raise BackendError(f'backend "{self.settings.backend}": read() before open() or '
                               "after close()")
        return self._stream

    def _settle(self, stream, seen: bool) -> None:
        """Move the in-memory point to the driver's cached resume token.

        That token is the last returned change's, or the server batch's post-batch token once
        the batch is used up, which is past every change the server examined (filtered ones
        included).  Read once per batch: the driver deep-copies it on every access.
        """
        token = stream.resume_token
        if token is None:
            return
        if seen:
            # Like the driver: once a change was returned, resumeAfter is right again.
            self._point = ResumePoint(token)
        elif token != self._point.token:
            self._point = ResumePoint(token, self._point.start_after)

    def _batch(self, events: List[Event]) -> Batch:
        checkpoint = self._point.to_checkpoint()
        if self.snapshot_progress is not None:
            checkpoint["snapshot"] = self.snapshot_progress.state()
        if events or checkpoint != self._reported:
            self._reported = checkpoint
            # A change outside a multi-document transaction is one by itself; one inside it
            # cannot say whether more of its transaction follow (the stream has no COMMIT).
            return Batch(events, checkpoint, not events or events[-1].txid is None)
        return Batch()


def _has_buffered(stream) -> bool:
    """Whether the stream holds changes it can return without asking the server.

    pymongo has no public API for this; ``ChangeStream._cursor._has_next()`` is what the
    driver itself uses to decide about the post-batch token.  Without it the only safe answer
    is "no", which costs batching, never correctness.  (tests/unit/test_mongo_source.py pins it.)
    """
    cursor = getattr(stream, "_cursor", None)
    has_next = getattr(cursor, "_has_next", None)
    return bool(has_next()) if has_next is not None else False
