"""PostgreSQL source: a supervised pg_recvlogical writing a durable spool, read back as events.

Runs in the PostgreSQL worker process, after fork.  The delivery invariant for this backend:

* the server's slot only advances past what pg_recvlogical fsynced into the spool;
* the worker's checkpoint (segment, offset, transaction state) only advances past what the sinks
  confirmed;
* so after ``kill -9`` of anything, the restart reads the spool from the checkpoint and the slot
  resends whatever never reached the disk.  Nothing is skipped; repeats carry the same ids.
"""

from __future__ import annotations

import collections
import datetime
import math
import time
from pathlib import Path
from typing import Any, Deque, List, Optional, Tuple

import psycopg2

from ...events import Event
from ...filters import TableFilter
from ..base import Batch, BackendError, Source
from ..scopewatch import ScopeWatch
from ..snapshot.progress import RunAtOpen, SnapshotProgress
from ..snapshot.run import SnapshotRefused
from .catalog import Catalog, connect
from .checks import (check_encoding, check_server, choose_decoder, drop_slot, ensure_slot,
                     retained_wal, slot_info)
from .decoding import parse_lsn
from .errors import child_error, query_error
from .fswatch import DirectoryWatch
from .partitions import partition_filter
from .pgoutput_relations import FILE_NAME as RELATION_LOG, RelationLog
from .publications import (check_slot_sees_publication, drop_publication, ensure_publication,
                           explain_child_error, unmatched_includes)
from .recvlogical import RecvLogical, find_pg_recvlogical
from .snapshot import PgSnapshot, backfill_table, snapshot_tables
from .spool import Spool, SpoolReader
from .transactions import TransactionAssembler
from .walstream import WalStream

SLOT_CHECK_EVERY = 10.0


def make_decoder(name: str, catalog: Catalog, table_filter: TableFilter, options: dict, *,
                 publication: Optional[str] = None, server_version: int = 150000,
                 relation_log=None, warn=None):
    """The decoder for ``name`` (``pgoutput`` or ``wal2json``; ``auto`` is resolved before).

    pgoutput also takes the publication, the server version (its ``messages`` option exists
    from PostgreSQL 14 on), its durable relation log and a logger's ``warn``.
    """
    messages = options.get("messages", True)
    if name == "wal2json":
        from .wal2json import Wal2JsonDecoder
        return Wal2JsonDecoder(catalog, table_filter, messages=messages, warn=warn)
    if name == "pgoutput":
        from .pgoutput import PgOutputDecoder
        from .pgoutput_relations import CatalogRelations
        return PgOutputDecoder(
            catalog, table_filter, publication or "", messages=messages,
            server_version=server_version, relations=CatalogRelations(catalog.conn),
            log=relation_log, warn=warn)
    raise BackendError(f"unknown PostgreSQL decoder {name!r} (expected pgoutput or wal2json)",
                       fatal=True)


class PostgresSource(Source):
    """See the module docstring.  Checkpoint: ``{"segment", "offset", "last_lsn", "tx", ...}``."""

    def __init__(self, backend, state_dir: Path, log):
        super().__init__(backend, state_dir, log)
        self.options = dict(backend.options)
        self.slot = self.options.get("slot") or f"lapidus_{backend.name}".lower()
        self.spool = Spool(Path(state_dir) / "spool")
        self.catalog: Optional[Catalog] = None
        self.child: Optional[RecvLogical] = None
        self.reader: Optional[SpoolReader] = None
        self.watch: Optional[DirectoryWatch] = None
        # decoded messages not yet fed, each with its size in the spool
        self.decoded: Deque[Tuple[Any, int]] = collections.deque()
        self.assembler: Optional[TransactionAssembler] = None
        self.paused_for_cap = False
        self._gap: Optional[Batch] = None
        self._scope_checked = False
        self.scope_watch = ScopeWatch(log)
        self._last_cap_check = 0.0
        self._child_may_have_exited = True     # look at pg_recvlogical (its pidfd woke us)
        self._slot_checked = 0.0
        self.publication: Optional[str] = None
        self._slot_cache: dict = {}
        # the snapshot's progress (None: no snapshot in this checkpoint's history) and, while
        # it runs, its driver (docs/snapshots.md)
        self.snapshot_progress: Optional[SnapshotProgress] = None
        self.snapshot: Optional[PgSnapshot] = None
        self._run_at_open = RunAtOpen(self.options, self.log)
        # cluster mode (share_state): the slot is the durable position, the spool a buffer
        self.cluster = False
        self.node: Optional[str] = None

    def share_state(self, store) -> None:
        """Cluster mode: the checkpoint lives in the bucket, and the slot confirms only what
        it covers (:mod:`.walstream`); nothing else is kept on this host."""
        self.cluster = True
        self.node = store.lease.cluster.node

    # -- lifecycle ------------------------------------------------------------------------

    def target(self) -> str:
        return f'{self.options.get("host", "127.0.0.1")}:{self.options.get("port", 5432)}'

    def open(self, checkpoint: Optional[Any]) -> None:
        """Connect, check, set up publication and slot, start pg_recvlogical.

        A query that fails on the way is classified (:mod:`.errors`): a lost or refused
        connection is transient, a missing privilege fatal.
        """
        self.decoded.clear()
        self.paused_for_cap = False
        self._gap = None
        try:
            self._open(checkpoint)
        except psycopg2.Error as exc:
            raise query_error(exc, self.options, self.backend.name,
                              "checking the server and the slot") from None

    def _open(self, checkpoint: Optional[Any]) -> None:
        name = self.backend.name
        # cluster mode: pg_stat_replication (application_name) shows which node streams
        app = f"lapidus_{name}" + (f"@{self.node}" if self.node else "")
        self.catalog = Catalog(connect(self.options, name, app))
        conn = self.catalog.conn
        # include/exclude naming a partitioned table cover its partitions (.partitions)
        table_filter = partition_filter(conn, TableFilter(self.backend.include_tables,
                                                          self.backend.exclude_tables))
        decoder_name = choose_decoder(conn, backend=name, slot=self.slot,
                                      configured=self.options.get("decoder") or "auto")
        self._check_partition_root(decoder_name)
        check_server(conn, name, decoder_name)
        if not self._scope_checked:         # once per worker, not at every reconnect
            self._scope_checked = True
            unmatched = unmatched_includes(conn, self.backend.include_tables or ())
            self.scope_watch.expect(unmatched)
            for pattern in unmatched:
                self.log.warning(f'include_tables pattern "{pattern}" matches no table of '
                                 f'database "{self.options["database"]}"; its tables are '
                                 f"streamed once they exist (a filtered publication needs a "
                                 f"restart), check the spelling", pattern=pattern)
        checkpoint_path = str(Path(self.state_dir) / "checkpoint.json")
        publication = self.options.get("publication") or f"lapidus_{name}".lower()
        publication_created = False
        if decoder_name == "pgoutput":
            self.publication = publication
            check_encoding(conn, name, self.options["database"])
            # Before the slot: pgoutput cannot decode changes written before the publication.
            publication_created = ensure_publication(
                conn, backend=name, name=publication,
                mode=self.options.get("publication_mode") or "all_tables",
                table_filter=table_filter, user=self.options.get("user") or "",
                via_root=bool(self.options.get("publish_via_partition_root")),
                warn=self.log.warning)
            if publication_created:
                self.log.info("publication created", publication=publication,
                              mode=self.options.get("publication_mode") or "all_tables")
        recreate = (self.options.get("temporary_slot") and checkpoint is not None
                    and slot_info(conn, self.slot) is None)
        if self.cluster:
            checkpoint_path = "the cluster bucket"
        created = ensure_slot(
            conn, backend=name, slot=self.slot, plugin=decoder_name,
            database=self.options["database"],
            has_checkpoint=checkpoint is not None and not recreate,
            checkpoint_path=checkpoint_path,
            take_over=self._take_over if self.cluster else None)
        if recreate:
            self._gap = self._gap_batch(checkpoint)
        if created:
            self.log.info("replication slot created", slot=self.slot, plugin=decoder_name)
        elif publication_created:
            check_slot_sees_publication(conn, backend=name, slot=self.slot,
                                        publication=publication)
        relation_log = None
        if self.cluster:
            checkpoint = self._fresh_spool(checkpoint)
        if decoder_name == "pgoutput":
            resume = (checkpoint["segment"], checkpoint["offset"]) if checkpoint else None
            if self.cluster:
                resume = None       # a new session: the server describes every relation again
            relation_log = RelationLog(Path(self.state_dir) / RELATION_LOG, resume)
        self._prepare_snapshot(checkpoint, decoder_name, publication, table_filter)
        self.decoder = make_decoder(
            decoder_name, self.catalog, table_filter, self.options, publication=publication,
            server_version=conn.server_version, relation_log=relation_log,
            warn=self.log.warning)

        start_segment = checkpoint["segment"] if checkpoint else None
        self.spool.prepare(first_segment=start_segment or 1)
        if checkpoint is None:
            existing = self.spool.segments()
            start_segment, offset = (existing[0] if existing else self.spool.active_segment()), 0
        else:
            offset = checkpoint["offset"]
        self.reader = SpoolReader(self.spool, start_segment, offset)
        self.assembler = TransactionAssembler(name, checkpoint)
        self.watch = DirectoryWatch(str(self.spool.directory))
        if self.cluster:
            self.child = self._walstream(conn, app, checkpoint)
        else:
            try:
                binary = find_pg_recvlogical(self.options.get("pg_recvlogical"))
            except FileNotFoundError as exc:
                raise BackendError(f'backend "{name}": {exc}', fatal=True) from None
            self.child = RecvLogical(
                binary=binary, options=self.options,
                slot=self.slot, output=self.spool.active_link,
                plugin_options=self.decoder.plugin_options(),
                log_path=Path(self.state_dir) / "pg_recvlogical.log", application_name=app)
        self._repair_tail()
        self._spawn()

    def _check_partition_root(self, decoder_name: str) -> None:
        """``publish_via_partition_root`` with ``decoder = "auto"`` that chose wal2json (an
        existing wal2json slot, a server without pgoutput): ``lapidus -t`` refuses the explicit
        combination, this is the same refusal once the decoder is known."""
        if decoder_name == "pgoutput" or not self.options.get("publish_via_partition_root"):
            return
        raise BackendError(
            f'backend "{self.backend.name}": publish_via_partition_root = true needs the '
            f"pgoutput decoder, but this backend decodes with {decoder_name} (the plugin of "
            f'slot "{self.slot}", or the only one the server allows), which names every change '
            f"by its partition and has no such option; set publish_via_partition_root = false, "
            f'or switch to decoder = "pgoutput" (a new slot, docs/postgresql.md)', fatal=True)

    # -- cluster mode -----------------------------------------------------------------------

    def _fresh_spool(self, checkpoint: Optional[dict]) -> Optional[dict]:
        """Cluster mode: what the local spool holds is not this checkpoint's (another node may
        have streamed since); drop it and read the slot from its confirmed position into new
        segments, numbered after any the checkpoint names.  The transaction state stays: the
        assembler skips what the checkpoint covers, a transaction partly delivered included."""
        self.spool.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        existing = self.spool.segments()
        named = (checkpoint or {}).get("segment") or 0
        first = max([named] + existing) + 1
        self.spool.delete_before(first)
        self.spool.prepare(first_segment=first)
        if checkpoint is None:
            return None
        # a replay under way in the old spool is no state of the new stream (it starts at a
        # transaction's beginning)
        return dict(checkpoint, segment=first, offset=0, replay=False)

    def _walstream(self, conn, app: str, checkpoint: Optional[dict]) -> WalStream:
        info = slot_info(conn, self.slot) or {}
        floor = info.get("confirmed_flush_lsn")
        child = WalStream(
            options=self.options, slot=self.slot, output=self.spool.active_link,
            plugin_options=self.decoder.plugin_options(),
            log_path=Path(self.state_dir) / "walstream.log", application_name=app,
            floor=parse_lsn(floor) if floor else 0)
        if checkpoint is not None:
            self._ack(child, checkpoint)
        return child

    @staticmethod
    def _ack(child, checkpoint: dict) -> None:
        """What the saved checkpoint lets the slot confirm: the commit LSN + 1 of its last
        complete transaction (the server resends transactions committed at or after the
        confirmed position, so an open one comes again whole)."""
        last = checkpoint.get("last_lsn") or 0
        child.ack(last + 1 if last else 0, checkpoint["segment"], checkpoint["offset"])

    def _take_over(self, pid: int) -> None:
        """The slot stays active for a server process after the grace: a walsender of the
        previous owner (its host died or froze; the server keeps it until TCP gives up).  This
        node holds the lease, so that owner's worker is stopped by now: end that walsender."""
        self.log.warning("the replication slot is still active for a server process of the "
                         "previous owner; this node holds the lease, terminating it",
                         slot=self.slot, active_pid=pid)

    def _prepare_snapshot(self, checkpoint: Optional[dict], decoder_name: str,
                          publication: str, table_filter: TableFilter) -> None:
        """The snapshot run as of ``checkpoint``: the initial one on a first start, an
        unfinished one (initial or backfill) resumed from its saved progress, or none.
        Every open starts again from the confirmed checkpoint's progress (a chunk held or
        emitted but unconfirmed is read again, with the same ids)."""
        if self.snapshot is not None:
            self.snapshot.close()
        self.snapshot = None
        self.snapshot_progress = None
        self._snapshot_setup = (decoder_name, publication, table_filter)
        progress = self._run_at_open.progress(checkpoint, lambda: self._initial_tables(
            publication, table_filter))
        self.snapshot_progress = progress
        if progress is None or progress.done:
            return
        self._check_snapshots_possible("this snapshot", fatal=True)
        self._begin_run(progress)

    def _initial_tables(self, publication: str, table_filter: TableFilter) -> list:
        self._check_snapshots_possible('snapshot = "initial"', fatal=True)
        return snapshot_tables(self.catalog.conn, self.backend.name, publication, table_filter)

    def _check_snapshots_possible(self, what: str, *, fatal: bool) -> None:
        """Snapshots need pgoutput on PostgreSQL 14+ (logical messages are the watermarks)."""
        decoder_name = self._snapshot_setup[0]
        problem = None
        if decoder_name != "pgoutput":
            problem = (f'{what} needs the pgoutput decoder (this backend uses {decoder_name}); '
                       f'set decoder = "pgoutput"')
        elif self.catalog.conn.server_version < 140000:
            problem = (f"{what} needs PostgreSQL 14 or later (pgoutput sends logical "
                       f"messages, the snapshot's watermarks, from 14 on); upgrade the server")
        if problem is None:
            return
        message = f'backend "{self.backend.name}": {problem}'
        if fatal:
            raise BackendError(message + ' or set snapshot = "never"', fatal=True)
        raise SnapshotRefused(message)

    def _begin_run(self, progress: SnapshotProgress) -> None:
        self.snapshot_progress = progress
        self.snapshot = PgSnapshot(self.backend.name, self.options, self.catalog, progress,
                                   self.log, encoded=self.encoded_reads)

    def start_backfill(self, n: int, table: str, where: Optional[str],
                       sink: Optional[str] = None) -> str:
        self._check_snapshots_possible("a backfill", fatal=False)
        _decoder, publication, table_filter = self._snapshot_setup
        try:
            schema, name = backfill_table(self.catalog.conn, self.backend.name, publication,
                                          table_filter, table, where)
        except psycopg2.Error as exc:
            raise query_error(exc, self.options, self.backend.name,
                              f"checking the table of a backfill ({table})") from None
        self._begin_run(SnapshotProgress(n, [(schema, name)], where=where, sink=sink))
        return f"{schema}.{name}"

    def suspend(self) -> None:
        """Before a reconnect: let go of the server but keep a temporary slot (it still
        holds the position the reconnect resumes from)."""
        self._release(drop_temporary=False)

    def close(self) -> None:
        self._release(drop_temporary=True)

    def _release(self, *, drop_temporary: bool) -> None:
        if self.child:
            self.child.stop()
            self.child = None
        if self.reader:
            self.reader.close()
            self.reader = None
        if self.watch:
            self.watch.close()
            self.watch = None
        if self.snapshot is not None:
            self.snapshot.close()
        if self.catalog:
            if drop_temporary and self.options.get("temporary_slot"):
                self._drop_temporary_objects()
            self.catalog.close()
            self.catalog = None

    def _drop_temporary_objects(self) -> None:
        """``temporary_slot``: leave nothing on the server, the publication Lapidus made
        included."""
        try:
            if drop_slot(self.catalog.conn, self.slot):
                self.log.info("temporary replication slot dropped", slot=self.slot)
            mode = self.options.get("publication_mode") or "all_tables"
            if self.publication and mode != "existing" and \
                    drop_publication(self.catalog.conn, self.publication):
                self.log.info("publication dropped", publication=self.publication)
        except Exception as exc:  # the slot may still be marked active for a moment
            self.log.warning("could not drop the temporary slot", slot=self.slot,
                             error=str(exc))

    def _gap_batch(self, checkpoint: dict) -> Batch:
        """``temporary_slot``: the slot went with the last stop; a new one starts from now.

        What was committed while no slot existed is not streamed: one ``gap`` event says so
        (docs/postgresql.md), and the spool still delivers what it held.
        """
        last = checkpoint.get("last_lsn") or 0
        from .decoding import format_lsn
        position = format_lsn(last) if isinstance(last, int) else str(last)
        self.log.warning("temporary replication slot created again; changes made while none "
                         "existed are not streamed (a gap event says so)", slot=self.slot,
                         lost_after=position)
        now = datetime.datetime.now(datetime.timezone.utc)
        gap = Event(
            id=f"{self.backend.name}:{position}:gap", type="gap", backend=self.backend.name,
            schema=None, table=None, pk=None,
            item={"reason": "temporary_slot", "lost_after": position,
                  "message": f'the temporary slot "{self.slot}" was dropped at the last stop '
                             f"and created again; changes committed in between are missing"},
            before=None, position=position, txid=None,
            ts=now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z")
        return Batch([gap], checkpoint)

    # -- reading --------------------------------------------------------------------------

    def read(self, max_events: int, timeout: float) -> Batch:
        if self._gap is not None:
            gap, self._gap = self._gap, None
            return gap
        try:
            batch = self._read(max_events, timeout)
            self.scope_watch.seen(batch.events)
            return batch
        except psycopg2.Error as exc:     # a catalog look-up by the decoder
            raise query_error(exc, self.options, self.backend.name,
                              "looking up a table or type") from None

    def _read(self, max_events: int, timeout: float) -> Batch:
        deadline = time.monotonic() + timeout
        events: List = []
        snapshot = self.snapshot
        if snapshot is not None and snapshot.progress.done:
            self.snapshot = snapshot = None     # finished: back to the fast path
        if snapshot is not None and snapshot.wants_chunk():
            # Only here, when the worker asks for more: sinks that are behind (backpressure)
            # hold the next chunk back, and a held chunk is never joined by another.
            snapshot.start_chunk()
            snapshot.take_ended(events)
        if self.watch is not None:
            # what was written up to now is read below; notifications of it would only end
            # the next wait for nothing (the worker loop's linger lets them pile up)
            self.watch.drain()
        while True:
            self._supervise_child()
            consumed = self._consume(events, max_events)
            if events or consumed:
                return Batch(events, self._checkpoint(), self.assembler.between_transactions)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Batch(events, None)
            if self._sleep(remaining):
                return Batch(events, None)      # the worker loop was woken (a signal)

    def _sleep(self, timeout: float) -> bool:
        """Until the spool changes, pg_recvlogical exits (its pidfd; the next look at it
        says why) or ``timeout`` passes; True when the worker's wake-up pipe ended it."""
        pidfd = self.child.pidfd
        others = [fd for fd in (self.wake_fd, pidfd) if fd is not None]
        ready = self.watch.wait(timeout, others)
        if pidfd is not None and pidfd in ready:
            self._child_may_have_exited = True
        return self.wake_fd is not None and self.wake_fd in ready

    def idle_wait(self) -> float:
        """No limit once every wake-up has a file descriptor: the spool (inotify), the
        child's death (its pidfd) and signals (the worker's pipe).  The spool's rotation and
        cap only change when pg_recvlogical writes, which wakes the read anyway; a child
        paused at the cap is resumed by a periodic look, so then a second."""
        child = self.child
        if self.watch is not None and self.watch.watching and self.wake_fd is not None \
                and child is not None and child.pidfd is not None and not self.paused_for_cap:
            return math.inf
        return super().idle_wait()

    def _consume(self, events: List, max_events: int) -> bool:
        """Decode spooled messages into ``events``; True when at least one was consumed."""
        decoded, reader, feed = self.decoded, self.reader, self.assembler.feed
        snapshot = self.snapshot
        # Moving on to the next segment counts as progress even without a frame: the new
        # checkpoint is what lets the finished segment be deleted (and a paused
        # pg_recvlogical resume once the spool is below its cap).
        segment_before = reader.segment
        consumed = False
        while len(events) < max_events:
            if not decoded:
                # Decoded a run ahead, at most what this batch can take: memory stays bounded.
                decoded.extend(reader.read_messages(self.decoder, max_events - len(events)))
                if not decoded:
                    break
            message, size = decoded.popleft()
            cut = False
            if message is not None:
                if snapshot is not None:
                    # slower path while a snapshot runs: watermarks and evictions
                    for each in (message if message.__class__ is list else (message,)):
                        cut = snapshot.feed(each, feed, events, self.assembler) or cut
                elif message.__class__ is list:
                    # pgoutput: one TRUNCATE of several tables is one frame, one event each
                    for each in message:
                        feed(each, events)
                else:
                    feed(message, events)
            reader.consumed(size)
            consumed = True
            if cut:
                break   # a chunk's rows: the checkpoint after them carries the progress
        return consumed or reader.segment != segment_before

    def _checkpoint(self) -> dict:
        state = self.assembler.state()
        state["segment"] = self.reader.segment
        state["offset"] = self.reader.offset
        if self.snapshot_progress is not None:
            state["snapshot"] = self.snapshot_progress.state()
        return state

    def tick(self) -> None:
        """While the sinks hold us back: the child still needs watching, and the spool cap
        must still pause it (otherwise a down sink lets the spool grow without bound)."""
        self._supervise_child()

    def commit(self, checkpoint: Any) -> None:
        self.spool.delete_before(checkpoint["segment"])
        if self.cluster and self.child is not None:
            self._ack(self.child, checkpoint)

    def status(self) -> dict:
        """Spool size, and the spooled bytes not yet read (the source-side lag)."""
        total = self.spool.size_bytes()
        unread = 0
        if self.reader is not None:
            for seg in self.spool.segments():
                try:
                    size = self.spool.path(seg).stat().st_size
                except FileNotFoundError:
                    continue
                if seg > self.reader.segment:
                    unread += size
                elif seg == self.reader.segment:
                    unread += max(0, size - self.reader.offset)
        child_kind = WalStream if self.cluster else RecvLogical
        out = {"slot": self.slot, child_kind.STATUS_KEY: self.child.pid if self.child else None,
               "spool_bytes": total, "lag_bytes": unread}
        out.update(self._slot_health())
        if self.snapshot_progress is not None:
            out["snapshot"] = self.snapshot_progress.status()
        return out

    def _slot_health(self) -> dict:
        """WAL the server retains for our slot, checked every SLOT_CHECK_EVERY seconds."""
        now = time.monotonic()
        if now - self._slot_checked >= SLOT_CHECK_EVERY and self.catalog is not None:
            self._slot_checked = now
            try:
                retained, wal_status = retained_wal(self.catalog.conn, self.slot)
            except Exception as exc:   # a metrics query must never stop the stream
                self.log.warning("could not read the slot's retained WAL", error=str(exc))
                return self._slot_cache
            limit = int(self.options.get("slot_warn_bytes") or 1 << 30)
            self._slot_cache = {"slot_retained_wal_bytes": retained, "slot_wal_status": wal_status,
                                "slot_warn_bytes": limit}
            if retained is not None and retained > limit:
                self.log.warning("the server retains much WAL for this slot; is a sink down or "
                                 "Lapidus behind?", slot=self.slot, retained_bytes=retained,
                                 slot_warn_bytes=limit, wal_status=wal_status)
        return self._slot_cache

    # -- the child ------------------------------------------------------------------------

    def _spawn(self) -> None:
        self.child.start()
        if self.cluster:
            self.log.info("replication reader started (cluster mode: confirms what the sinks "
                          "acknowledged)", pid=self.child.pid, slot=self.slot)
        else:
            self.log.info("pg_recvlogical started", pid=self.child.pid, slot=self.slot)

    def _supervise_child(self) -> None:
        """Notice a dead pg_recvlogical; rotate the spool; pause at the spool cap.

        A death is raised, classified (:func:`.errors.child_error`): the worker loop waits
        out a transient one and opens the source again, which respawns the child after
        cutting a half-written tail (no retry loop of its own here).
        """
        now = time.monotonic()
        if now - self._last_cap_check >= 1.0:
            self._last_cap_check = now
            self._child_may_have_exited = True
            self._rotate_and_cap()
        child = self.child
        if child.proc is not None and child.pidfd is not None \
                and not self._child_may_have_exited:
            # its pidfd says when it exits (in _sleep); a busy reader that does not sleep
            # looks once a second: a waitpid per read costs as much as the read
            return
        code = child.exit_code()
        if code is None and child.proc is not None:
            self._child_may_have_exited = False
            return
        if self.paused_for_cap:
            return
        if self.child.proc is not None:
            self._child_died(code)
            return
        self._repair_tail()          # resuming after a pause for the spool cap
        self.child.resumed = True    # reports every second (recvlogical's module docstring)
        self._spawn()

    def _child_died(self, code: int) -> None:
        errors = self.child.recent_errors()
        self.child.forget()
        program = "lapidus-walstream" if self.cluster else "pg_recvlogical"
        explained = explain_child_error(errors, backend=self.backend.name, slot=self.slot,
                                        program=program)
        if explained:
            raise BackendError(explained, fatal=True)
        error = child_error(errors, self.options, self.backend.name, program=program)
        self.log.warning(f"{program} exited", exit_code=code, error=str(error),
                         fatal=error.fatal)
        raise error

    def _repair_tail(self) -> None:
        """Cut a frame that a dying pg_recvlogical left half-written in the newest segment."""
        segments = self.spool.segments()
        if not segments:
            return
        newest = segments[-1]
        start = self.reader.offset if self.reader.segment == newest else 0
        if self.reader.segment > newest:
            return
        new_size = self.spool.truncate_partial_tail(newest, start, self.decoder)
        if new_size is not None:
            self.log.warning("cut a half-written message from the spool; the server resends it",
                             segment=newest, size=new_size)
            if self.reader.segment == newest:
                self.reader.after_truncate(new_size)

    def _rotate_and_cap(self) -> None:
        limit = int(self.options.get("spool_segment_bytes", 64 << 20))
        running = self.child.running()
        # Only a pg_recvlogical we paused ourselves (stopped cleanly, last message whole) lets
        # us create segment files; a dead one may have left a half-written frame, which
        # _repair_tail must cut in the newest segment before anything moves on.
        paused = self.paused_for_cap and not running
        active = self.spool.path(self.spool.active_segment())
        if paused and not active.exists():
            # Rotated just before pg_recvlogical was paused: it never created the new segment,
            # and the reader waits for it to leave the old one.  Nobody writes now: create it.
            self._repair_tail()
            active.touch(mode=0o600)
        try:
            size = active.stat().st_size
        except FileNotFoundError:
            size = 0
        if size >= limit and (running or paused):
            # Also while paused: a full segment must be able to go once read.
            if paused:
                self._repair_tail()
            self.spool.rotate(create=paused)
            if running:
                self.child.reopen_output()
        cap = int(self.options.get("spool_max_bytes", 1 << 30))
        total = self.spool.size_bytes()
        if total >= cap and not self.paused_for_cap:
            # Sinks are behind: stop taking WAL from the server until the spool drains.
            self.paused_for_cap = True
            self.log.warning("spool is full; pausing pg_recvlogical until sinks catch up",
                             spool_bytes=total, spool_max_bytes=cap)
            self.child.stop()
        elif self.paused_for_cap and total < cap * 0.8:
            self.paused_for_cap = False
            self.log.info("spool drained; resuming pg_recvlogical", spool_bytes=total)
