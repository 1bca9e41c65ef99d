"""MysqlSource: the MySQL/MariaDB backend's change stream.

Runs in the mysql worker process, after fork: the worker loop calls ``open(checkpoint)``, then
``read()`` in a loop, ships the batches and calls ``commit()`` once they are delivered.

open():  connect (one attempt: the worker loop waits out an unreachable server), check the
         server (checks.py), choose the start (the checkpoint, or the binlog's current end on
         a first start), refuse a start the server no longer has, send the binlog dump request
         and wait for the server's first answer, so that refusals (purged GTID, missing
         REPLICATION SLAVE) surface here as clear errors.
read():  returns as soon as it has events (after draining what already arrived, without
         waiting), or an empty batch at the timeout.  While a snapshot or backfill runs
         (docs/snapshots.md, .snapshot), it starts a chunk when asked for more and emits the
         held rows where the stream reaches the chunk's binlog position.  Any failure of the
         stream raises a non-fatal BackendError: the worker restarts from its checkpoint
         (never the library's reconnect, which replays from where this reader started).
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any, Dict, FrozenSet, Optional, Tuple

import pymysql

from ..base import RECOVER_LOST_POSITION, Batch, BackendError, Source
from ..first_start import FirstStart
from ..snapshot.progress import RunAtOpen, SnapshotProgress
from ..snapshot.run import SnapshotRefused
from .changes import ChangeStream
from .checks import check_server
from .connection import (
    ER_MASTER_FATAL_READING_BINLOG, Idle, LinkDead, connect, describe_error, server_id_clash,
)
from .position import (
    MARIADB, MYSQL, Checkpoint, CheckpointError, MariadbGtidState, missing_after,
)
from .reader import BinlogReader, StreamEnded
from .retention import binlog_files, expire_seconds, retention_warning, server_position
from .scope import (SCOPE_SCHEMAS, SCOPE_TABLES, scope_from, scope_warnings,
                    unmatched_patterns)
from ..scopewatch import ScopeWatch
from .settings import settings_from
from .snapshot import MysqlSnapshot, backfill_table, snapshot_tables

RETENTION_CHECK_EVERY = 60.0
FIRST_START_FILE = "mysql-first-start.json"
CHECKPOINT_FILE = "checkpoint.json"      # lapidus.checkpoint.CheckpointStore's default name
_JSON_CHECK = re.compile(r"^json_valid\(`((?:[^`]|``)+)`\)$", re.I)


class JsonColumnLookup:
    """MariaDB JSON columns (LONGTEXT + CHECK json_valid) of a table, cached per table.

    The binlog cannot tell a MariaDB JSON column from LONGTEXT; information_schema can.  It
    answers for the table as it is now, not as it was when an old row was written: a column
    changed to or from JSON later is mapped by its current definition (docs/types-mysql.md).
    """

    def __init__(self, conn):
        self._conn = conn
        self._cache: Dict[Tuple[str, str], FrozenSet[str]] = {}

    def reset(self) -> None:
        self._cache.clear()

    def __call__(self, schema: str, table: str) -> FrozenSet[str]:
        key = (schema, table)
        hit = self._cache.get(key)
        if hit is None:
            try:
                self._conn.ping()
            except pymysql.err.MySQLError:
                self._conn.connect()    # a query connection: reconnecting replays nothing
            cur = self._conn.cursor()
            try:
                cur.execute("SELECT CONSTRAINT_NAME, CHECK_CLAUSE FROM "
                            "information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = %s "
                            "AND TABLE_NAME = %s", (schema, table))
                names = set()
                for name, clause in cur.fetchall():
                    match = _JSON_CHECK.match((clause or "").strip())
                    if match and match.group(1).replace("``", "`") == name:
                        names.add(name)
            finally:
                cur.close()
            hit = self._cache[key] = frozenset(names)
        return hit


class MysqlSource(Source):
    """One MySQL/MariaDB backend (``type = "mysql"``)."""

    def __init__(self, backend, state_dir, log):
        super().__init__(backend, state_dir, log)
        self.settings = settings_from(backend.name, getattr(backend, "options", None))
        self.scope = scope_from(backend)
        self._conn = None
        self._reader: Optional[BinlogReader] = None
        self._changes: Optional[ChangeStream] = None
        self._flavor: Optional[str] = None
        self._last_commit: Any = None
        self._retention_checked = 0.0
        self._retention_cache: Dict[str, Any] = {}
        self._scope_checked = False
        self.scope_watch = ScopeWatch(log)
        # where the very first open started, until a checkpoint is saved (a restart before
        # that resumes there, not at a new end of the binlog: the changes between would be lost)
        self.first_start = FirstStart(state_dir, FIRST_START_FILE, log)
        self._opened_at: Tuple[Optional[str], Optional[int]] = (None, None)
        self._settled = False
        # the snapshot's progress (None: no snapshot in this checkpoint's history) and, while
        # it runs, its driver (docs/snapshots.md)
        self.snapshot_progress: Optional[SnapshotProgress] = None
        self.snapshot: Optional[MysqlSnapshot] = None
        self._json_lookup: Optional[JsonColumnLookup] = None
        self._run_at_open = RunAtOpen(self._options(), self.log)
        if (getattr(backend, "options", None) or {}).get("connect_retry_seconds") is not None:
            self.log.warning("connect_retry_seconds no longer has an effect: an unreachable "
                             "server is retried for ever (reconnect_max_delay caps the wait); "
                             "remove it from the backend")

    # ------------------------------------------------------------------ open

    def open(self, checkpoint: Optional[Any]) -> None:
        try:
            self._open(checkpoint)
        except (pymysql.err.MySQLError, OSError) as exc:   # e.g. the server went away mid-check
            self.close()
            raise self._stream_error(exc) from exc
        except BaseException:
            self.close()
            raise

    def _open(self, checkpoint: Optional[Any]) -> None:
        s = self.settings
        self._conn = connect(s)
        facts = check_server(s, self._conn, self.log)
        if not self._scope_checked:
            self._scope_checked = True
            schemas = [str(row[0]) for row in self._query(SCOPE_SCHEMAS)]
            tables = [(str(row[0]), str(row[1])) for row in self._query(SCOPE_TABLES)]
            for text in scope_warnings(self.scope, schemas, tables):
                self.log.warning(f"{s.describe()}: {text}")
            self.scope_watch.expect(unmatched_patterns(self.scope, tables))
        mariadb = (s.flavor == "mariadb") if s.flavor else facts.mariadb
        self._flavor = MARIADB if mariadb else MYSQL
        gtid_mode = mariadb or (facts.variables.get("gtid_mode", "").upper() == "ON")
        # A reopen before anything was confirmed (a reconnect, a restarted worker) starts
        # where the first open did, not at a new end of the binlog: changes made in between
        # would be skipped.
        marker = self.first_start.recall(checkpoint)
        resume = self._parse_checkpoint(checkpoint if checkpoint is not None else marker)
        if resume is None:
            gtid, file, pos = self._current_end(gtid_mode)
        else:
            gtid, file, pos = self._resume_point(resume, gtid_mode)
        self._json_lookup = JsonColumnLookup(self._conn) if mariadb else None
        self._changes = ChangeStream(
            s.name, self._flavor, self.scope, gtid=gtid, file=file, pos=pos, resume=resume,
            json_columns=self._json_lookup, describe=s.describe())
        self._reader = BinlogReader(s, mariadb=mariadb, gtid=gtid,
                                    log_file=None if gtid is not None else file,
                                    log_pos=None if gtid is not None else pos,
                                    scope=self.scope)
        self._await_first_answer()
        # After a GTID start the reader's coordinates lag (the server skips the events
        # before the GTID without sending them) until an event or heartbeat comes
        self._opened_at = (self._reader.log_file, self._reader.log_pos)
        self._settled = False
        self._prepare_snapshot(checkpoint)
        if checkpoint is None and marker is None:
            self.first_start.remember(self._changes.checkpoint().to_json())
        self.log.info("mysql stream open", position=self._changes.position,
                      resumed=resume is not None, flavor=self._flavor, server_id=s.server_id)

    def _checkpoint_path(self) -> Path:
        return Path(self.state_dir) / CHECKPOINT_FILE

    def _parse_checkpoint(self, checkpoint: Optional[Any]) -> Optional[Checkpoint]:
        if checkpoint is None:
            return None
        try:
            resume = Checkpoint.from_json(checkpoint)
        except CheckpointError as exc:
            raise BackendError(
                f"{self.settings.describe()}: the saved checkpoint is unusable ({exc}); delete "
                f"{self._checkpoint_path()} to start from the current end of the binlog",
                fatal=True) from None
        if resume.flavor != self._flavor:
            raise BackendError(
                f"{self.settings.describe()}: the saved checkpoint is a {resume.flavor} position "
                f"but {self.settings.address} is {self._flavor}; point the backend at the right "
                f"server, or delete {self._checkpoint_path()} to start from the current end",
                fatal=True)
        return resume

    def _query(self, sql: str, args: Any = None):
        cur = self._conn.cursor()
        try:
            cur.execute(sql, args)
            return cur.fetchall()
        except pymysql.err.MySQLError as exc:
            raise describe_error(self.settings, exc) from exc
        finally:
            cur.close()

    def _master_status(self) -> Tuple[Optional[str], Optional[int]]:
        try:
            rows = self._query("SHOW MASTER STATUS")
        except BackendError:
            rows = self._query("SHOW BINARY LOG STATUS")      # MySQL >= 8.4 knows only this
        if not rows:
            return None, None
        return str(rows[0][0]), int(rows[0][1])

    def _current_end(self, gtid_mode: bool) -> Tuple[Optional[str], Optional[str], Optional[int]]:
        """First start: the end of the binlog now (changes committed later are streamed)."""
        file, pos = self._master_status()
        if self._flavor == MARIADB:
            gtid = str(self._query("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")
        elif gtid_mode:
            gtid = str(self._query("SELECT @@GLOBAL.gtid_executed")[0][0] or "").replace("\n", "")
        else:
            gtid = None
        return gtid, file, pos

    def _resume_point(self, resume: Checkpoint,
                      gtid_mode: bool) -> Tuple[Optional[str], Optional[str], Optional[int]]:
        """Where to start for ``resume``, after making sure the server still has it."""
        logs = [str(row[0]) for row in self._query("SHOW BINARY LOGS")]
        oldest = logs[0] if logs else None
        if resume.gtid is not None and self._flavor == MARIADB:
            start = str(self._query("SELECT BINLOG_GTID_POS(%s, 4)", (oldest,))[0][0] or "") \
                if oldest else ""
            missing = missing_after(resume.gtid, start)
            if missing:
                raise self._purged(resume, f"first missing transaction {missing}; the oldest "
                                           f"binlog on the server, {oldest}, starts after "
                                           f"{start}")
            return resume.gtid, resume.file, resume.pos
        if resume.gtid is not None and gtid_mode:
            purged = str(self._query("SELECT @@GLOBAL.gtid_purged")[0][0] or "").replace("\n", "")
            if purged and not self._gtid_set_covers(resume.gtid, purged):
                raise self._purged(resume, f"the server purged {purged}")
            return resume.gtid, resume.file, resume.pos
        if resume.file not in logs:
            raise self._purged(resume, f"binlog file {resume.file} is gone; the oldest the "
                                       f"server has is {oldest}")
        return None, resume.file, resume.pos

    @staticmethod
    def _gtid_set_covers(have: str, purged: str) -> bool:
        from pymysqlreplication.gtid import GtidSet
        return GtidSet(purged) in GtidSet(have)

    def _purged(self, resume: Checkpoint, detail: str) -> BackendError:
        where = resume.gtid if resume.gtid is not None else f"{resume.file}:{resume.pos}"
        return BackendError(
            f"{self.settings.describe()}: the server no longer has the binlog after the "
            f"checkpoint {where} (saved at {resume.file}:{resume.pos}; {detail}): those changes "
            f"were purged and cannot be streamed. Lapidus does not skip them silently: "
            f"{RECOVER_LOST_POSITION} (or delete the checkpoint file "
            f"{self._checkpoint_path()} alone to start from the current end of the binlog, "
            f"accepting the gap)", fatal=True)

    def _await_first_answer(self) -> None:
        """Send the dump request and read until the server's format description event, so
        that a refused start fails in open(), not in the first read()."""
        from pymysqlreplication.event import FormatDescriptionEvent
        reader = self._reader
        reader.set_deadline(time.monotonic() + self.settings.connect_timeout)
        try:
            reader.connect()
            while True:
                event = reader.fetchone()
                self._changes.feed(event, reader.log_file, reader.log_pos)
                if isinstance(event, FormatDescriptionEvent):
                    return
        except Idle:
            raise BackendError(
                f"{self.settings.describe()}: {self.settings.address} accepted the binlog dump "
                f"request but sent nothing in {self.settings.connect_timeout:g} s; will retry")
        except Exception as exc:
            raise self._stream_error(exc) from exc

    # ------------------------------------------------------------------ snapshots

    def _prepare_snapshot(self, checkpoint: Optional[dict]) -> None:
        """The snapshot run as of ``checkpoint``: the initial one on a first start, an
        unfinished one (initial or backfill) resumed from its saved progress, or none.
        Every open starts again from the confirmed checkpoint's progress (a chunk held or
        emitted but unconfirmed is read again, with the same ids)."""
        if self.snapshot is not None:
            self.snapshot.close()
        self.snapshot = None
        self.snapshot_progress = None
        progress = self._run_at_open.progress(
            checkpoint, lambda: snapshot_tables(self._conn, self.backend.name, self.scope))
        self.snapshot_progress = progress
        if progress is None or progress.done:
            return
        self._check_snapshots_possible('snapshot = "initial"', fatal=True)
        self._begin_run(progress)

    def _options(self) -> dict:
        return dict(getattr(self.backend, "options", None) or {})

    def _check_snapshots_possible(self, what: str, *, fatal: bool) -> None:
        """Snapshots need MariaDB's (or Percona's) Binlog_snapshot_position: the binlog
        position consistent with a snapshot, which is how a chunk meets the stream."""
        rows = self._query("SHOW STATUS LIKE 'binlog_snapshot_position'")
        if rows:
            return
        message = (f"{self.settings.describe()}: {what} needs the binlog position of a "
                   f"consistent snapshot (status Binlog_snapshot_position), which "
                   f"{self.settings.address} does not report; snapshots are built for MariaDB "
                   f"and Percona Server, not Oracle MySQL")
        if fatal:
            raise BackendError(message + '; set snapshot = "never"', fatal=True)
        raise SnapshotRefused(message)

    def _begin_run(self, progress: SnapshotProgress) -> None:
        self.snapshot_progress = progress
        self.snapshot = MysqlSnapshot(self.backend.name, self._options(),
                                      self.settings, self._json_lookup, progress, self.log,
                                      encoded=self.encoded_reads)

    def start_backfill(self, n: int, table: str, where: Optional[str],
                       sink: Optional[str] = None) -> str:
        if self._conn is None:      # not a refusal: the request stays queued
            raise BackendError(f"{self.settings.describe()}: backfill of \"{table}\" asked "
                               f"for while the source is not open; reconnecting")
        try:
            self._check_snapshots_possible("a backfill", fatal=False)
            schema, name = backfill_table(self._conn, self.backend.name, self.scope, table,
                                          where)
        except pymysql.err.MySQLError as exc:
            raise self._stream_error(exc) from None
        self._begin_run(SnapshotProgress(n, [(schema, name)], where=where, sink=sink))
        return f"{schema}.{name}"

    def _checkpoint(self) -> dict:
        state = self._changes.checkpoint().to_json()
        if self.snapshot_progress is not None:
            state["snapshot"] = self.snapshot_progress.state()
        return state

    def _settle_reader_position(self) -> None:
        """Once per open, before the first chunk: make the reader's coordinates exact.

        After a GTID start MariaDB skips the binlog up to that GTID without sending it, so
        the reader's offset stays behind until an event or heartbeat arrives, and a chunk of
        an idle binlog would wait for it.  When the GTID position of the binlog's end is the
        stream's own state, no transaction lies between: the reader stands at that end."""
        self._settled = True
        reader = self._reader
        if self._flavor != MARIADB or (reader.log_file, reader.log_pos) != self._opened_at:
            return
        file, pos = self._master_status()
        state = self._changes.gtid_state()
        if file is None or state is None:
            return
        at = self._query("SELECT BINLOG_GTID_POS(%s, %s)", (file, pos))
        if not at or at[0][0] is None:
            return
        seqs = {d: seq for d, (_server, seq) in MariadbGtidState(str(at[0][0])).domains().items()}
        if seqs == {d: seq for d, (_server, seq) in state.domains().items()}:
            reader.log_file, reader.log_pos = file, pos
            self._opened_at = (None, None)      # exact from here on

    def _snapshot_due(self, events: list) -> bool:
        """At the held chunk's P with nothing pending: its rows go out now (True: the batch
        ends here, its checkpoint carries the progress)."""
        snapshot = self.snapshot
        if snapshot is None or snapshot.window is None or self._changes.pending:
            return False
        reader = self._reader
        if not snapshot.reached(reader.log_file, reader.log_pos):
            if (reader.log_file, reader.log_pos) == self._opened_at:
                # coordinates not exact yet: the GTID position of P decides
                return self._snapshot_idle(events)
            return False
        snapshot.emit(events, self._changes.position)
        return True

    def _snapshot_idle(self, events: list) -> bool:
        """Nothing more arrived: see :meth:`MysqlSnapshot.reached_when_idle`."""
        snapshot = self.snapshot
        if snapshot is None or snapshot.window is None or self._changes.pending \
                or self._flavor != MARIADB:
            return False
        try:
            state = self._changes.gtid_state()
            verdict = snapshot.reached_when_idle(self._conn, state)
        except pymysql.err.MySQLError as exc:
            raise describe_error(self.settings, exc) from None
        if verdict is None:
            return False
        if verdict:
            snapshot.emit(events, self._changes.position)
            return True
        snapshot.retry_chunk()
        return False

    # ------------------------------------------------------------------ read

    def read(self, max_events: int, timeout: float) -> Batch:
        changes = self._changes
        reader = self._reader
        if changes is None or reader is None:
            raise BackendError(f"{self.settings.describe()}: read() before open()")
        snapshot = self.snapshot
        if snapshot is not None and snapshot.progress.done:
            self.snapshot = snapshot = None     # finished: back to the fast path
        if snapshot is not None:
            return self._read_during_snapshot(snapshot, max_events, timeout)
        events = changes.take(max_events)
        deadline = time.monotonic() + timeout
        # With events in hand, only what has already arrived is read: no added waiting.
        reader.set_deadline(0.0 if events else deadline, self.wake_fd)
        try:
            while len(events) < max_events:
                event = reader.fetchone()
                changes.feed(event, reader.log_file, reader.log_pos)
                if changes.pending:
                    if not events:
                        reader.set_deadline(0.0, self.wake_fd)
                    events.extend(changes.take(max_events - len(events)))
                elif not events and time.monotonic() >= deadline:
                    break       # a long run of filtered changes: report progress on time
        except Idle:
            pass
        except BackendError:
            raise
        except Exception as exc:
            raise self._stream_error(exc) from exc
        self.scope_watch.seen(events)
        return Batch(events, self._checkpoint(), changes.between_transactions)

    def idle_wait(self) -> float:
        """No limit: the binlog socket and the wake-up pipe are watched together, and a
        dead link is still noticed (``heartbeat_seconds``, :mod:`.connection`) at the first
        wait that ends without a byte after ``dead_after``."""
        return math.inf if self.wake_fd is not None else super().idle_wait()

    def _read_during_snapshot(self, snapshot: MysqlSnapshot, max_events: int,
                              timeout: float) -> Batch:
        """:meth:`read` while a snapshot runs: the slower path with evictions and the
        hand-off at the held chunk's binlog position."""
        changes, reader = self._changes, self._reader
        if not self._settled:
            self._settle_reader_position()
        if snapshot.wants_chunk():
            # Only here, when the worker asks for more: sinks that are behind (backpressure)
            # hold the next chunk back, and a held chunk is never joined by another.
            snapshot.start_chunk((reader.log_file, reader.log_pos)
                                 if reader.log_file and reader.log_pos else None)
        events = self._taken(changes.take(max_events))
        snapshot.take_ended(events)
        deadline = time.monotonic() + timeout
        reader.set_deadline(0.0 if events else deadline, self.wake_fd)
        try:
            while len(events) < max_events:
                if self._snapshot_due(events):
                    break       # before any event at or after P (the binlog may be idle)
                try:
                    event = reader.fetchone()
                except Idle:
                    self._snapshot_idle(events)
                    break
                changes.feed(event, reader.log_file, reader.log_pos)
                if changes.pending:
                    if not events:
                        reader.set_deadline(0.0, self.wake_fd)
                    events.extend(self._taken(changes.take(max_events - len(events))))
                elif not events and time.monotonic() >= deadline:
                    break
        except BackendError:
            raise
        except Exception as exc:
            raise self._stream_error(exc) from exc
        self.scope_watch.seen(events)
        return Batch(events, self._checkpoint(), changes.between_transactions)

    def _taken(self, events: list) -> list:
        """Changes handed out while a chunk is held evict their keys from it."""
        snapshot = self.snapshot
        if snapshot is not None and snapshot.window is not None:
            saw = snapshot.saw
            for event in events:
                saw(event.schema, event.table, event.type, event.pk, event.before)
        return events

    def _stream_error(self, exc: BaseException) -> BackendError:
        s = self.settings
        who = s.describe()
        if isinstance(exc, BackendError):
            return exc
        if isinstance(exc, LinkDead):
            return BackendError(
                f"{who}: the binlog stream from {s.address} went silent ({exc}; the server "
                f"sends a heartbeat every {s.heartbeat_seconds:g} s); reconnecting from the "
                f"last checkpoint")
        if isinstance(exc, StreamEnded):
            return BackendError(f"{who}: {s.address} ended the binlog stream; reconnecting from "
                                f"the last checkpoint")
        if isinstance(exc, pymysql.err.MySQLError):
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
            text = str(exc.args[1]) if len(exc.args) > 1 else ""
            if "same server_uuid/server_id" in text or "same server_id" in text:
                return server_id_clash(s, text)
            if code == ER_MASTER_FATAL_READING_BINLOG:
                position = self._changes.position if self._changes else "?"
                return BackendError(
                    f"{who}: {s.address} refuses to stream from {position}: {exc.args[1]}. If "
                    f"the binlog was purged or the server was reset, those changes are gone: "
                    f"{RECOVER_LOST_POSITION} (or delete the checkpoint file "
                    f"{self._checkpoint_path()} alone to start from the current end of the "
                    f"binlog, accepting the gap)", fatal=True)
            return describe_error(s, exc)
        if isinstance(exc, OSError):
            return BackendError(f"{who}: connection to {s.address} failed ({exc}); reconnecting "
                                f"from the last checkpoint")
        return BackendError(f"{who}: reading the binlog failed: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ rest

    def commit(self, checkpoint: Any) -> None:
        # Nothing to release on the server (a binlog reader holds no slot); kept for status.
        self._last_commit = checkpoint
        self.first_start.settled()

    def share_state(self, store) -> None:
        self.first_start.share(store)

    def status(self) -> dict:
        out: Dict[str, Any] = {"server": self.settings.address,
                               "server_id": self.settings.server_id, "flavor": self._flavor}
        if self._changes is not None:
            out["read_position"] = self._changes.position
        if self._reader is not None:
            out["binlog"] = f"{self._reader.log_file}:{self._reader.log_pos}"
        out.update(self._retention())
        if self.snapshot_progress is not None:
            out["snapshot"] = self.snapshot_progress.status()
        return out

    def _retention(self) -> dict:
        """Binlog expiry against the checkpoint, checked once a minute (see retention.py)."""
        now = time.monotonic()
        if self._conn is None or now - self._retention_checked < RETENTION_CHECK_EVERY:
            return self._retention_cache
        self._retention_checked = now
        checkpoint = self._last_commit if isinstance(self._last_commit, dict) else {}
        try:
            cur = self._conn.cursor()
            expire = expire_seconds(cur)
            files = binlog_files(cur)
            server_gtid = server_position(cur, self._flavor == MARIADB)
        except pymysql.MySQLError as exc:   # status must never stop the stream
            self.log.warning("could not check binlog retention", error=str(exc))
            return self._retention_cache
        warning = retention_warning(
            checkpoint_file=checkpoint.get("file"), checkpoint_gtid=checkpoint.get("gtid"),
            files=files, expire=expire, server_gtid=server_gtid)
        if warning:
            self.log.warning(warning, binlog=checkpoint.get("file"), expire_seconds=expire)
        self._retention_cache = {"binlog_expire_seconds": expire,
                                 "oldest_binlog": files[0] if files else None,
                                 "retention_warning": warning}
        return self._retention_cache

    def close(self) -> None:
        if self.snapshot is not None:
            self.snapshot.close()
        reader, self._reader = self._reader, None
        conn, self._conn = self._conn, None
        if reader is not None:
            try:
                reader.close()
            except Exception:    # closing a broken connection may fail; nothing to keep
                pass
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
