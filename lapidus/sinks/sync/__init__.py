"""The ``sync`` sink: replicates a backend's tables into a PostgreSQL or MySQL/MariaDB database,
exactly once.

Runs in the dispatcher process.  The asyncio side only hands each delivery to one worker
thread of its own, which does all database work with a blocking client (psycopg2, pymysql) so
that the dispatcher's loop, and the other backends' pipelines, never wait on the target.  What
is the target database's own is in :mod:`.pg_target` and :mod:`.mysql_target`.

Per delivery (docs/sync.md has the user's view):

1. events the target already holds are dropped: their group (source transaction or snapshot
   chunk, :mod:`.order`) is not newer than the cursor in ``lapidus_sync_state`` (:mod:`.state`);
2. the events are cut into their groups; the last group is *held* unless it is whole: its
   events complete themselves (snapshot rows), or the delivery ends at a transaction
   boundary (``Delivery.at_boundary``: the worker read the transaction's end) and its last
   event is of that group.  The dispatcher's batches end where the worker's reads end, which
   may be inside a source transaction, and no source transaction may be half visible;
3. up to ``batch_transactions`` groups are applied per target transaction (:mod:`.apply`),
   and the same transaction moves the cursor and stores the held events in
   ``lapidus_sync_pending``; only then does :meth:`send` return, confirming the delivery.

A row the target refuses for good (a constraint, a type, a missing column) is found by
applying the events one by one under savepoints, and raised as ``UndeliverableError`` naming
it, so the backend's ``on_undeliverable`` policy decides (hold, or dead letter and go on).
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ... import logs
from ...events import Record
from ..base import Sink, SinkError, UndeliverableError
from . import options as _options
from . import state
from .apply import Refused
from .order import UnorderedPosition, completes_itself, order_of


class SyncSink(Sink):
    # merged deliveries mean fewer, larger target transactions (one commit each)
    merge_batches = True
    # the end of a delivery's last transaction, when it comes after its last event
    wants_transaction_ends = True

    def __init__(self, options: Mapping[str, Any], backend: str):
        super().__init__(options, backend)
        self.config = _options.SyncOptions.parse(options)
        self.log = logs.get_logger().bind(sink="sync", backend=backend)
        self.target = _target(self.config.dsn)
        self.applier = self.target.Applier(self.config, backend, self.log)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"sync-{backend}")
        self.conn = None
        self.cursor: Optional[state.Cursor] = None
        self.down_since: Optional[float] = time.monotonic()
        self.applied = 0
        self.last_error: Optional[str] = None

    @classmethod
    def validate(cls, options: Mapping[str, Any]) -> list:
        return _options.validate(options)

    async def start(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self.thread, self._connect)
        except SinkError as exc:
            # not fatal: every delivery connects again, and the error is in status meanwhile
            self.log.warning("sync: the target is not reachable yet", error=str(exc))

    async def send(self, records: Sequence[Record]) -> None:
        await asyncio.get_running_loop().run_in_executor(
            self.thread, self._send, list(records), getattr(records, "at_boundary", False))

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.thread, self._disconnect)
        self.thread.shutdown(wait=False)

    def health(self) -> Optional[Dict[str, Any]]:
        down = None if self.down_since is None else round(time.monotonic() - self.down_since, 1)
        held = len(self.cursor.pending) if self.cursor is not None else 0
        out = {"connected": self.conn is not None, "down_seconds": down,
               "applied": self.applied, "held_events": held}
        if self.last_error:
            out["error"] = self.last_error
        return out

    # -- the worker thread ------------------------------------------------------------------

    def _connect(self) -> None:
        if self.conn is not None:
            return
        try:
            conn = self.target.connect(self.config, self.backend)
        except self.target.Error as exc:
            self.last_error = _first_line(exc)
            raise SinkError(f"sync: cannot connect to the target: {self.last_error}; fix: check "
                            f"plugins.sync.dsn and that the target {self.target.name} is "
                            f"up") from None
        try:
            self.cursor = self.target.prepare(conn, self.config, self.backend)
        except self.target.Error as exc:
            conn.close()
            self.last_error = _first_line(exc)
            raise SinkError(f"sync: cannot prepare the target: {self.last_error}") from None
        except SinkError:
            conn.close()
            raise
        self.conn = conn
        self.applier.forget()
        self.down_since = None
        self.last_error = None
        if self.cursor.pending:
            self.log.info("sync: resuming with the held events of an unfinished source "
                          "transaction", events=len(self.cursor.pending))

    def _disconnect(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except self.target.Error:
                pass
        self.conn = None
        self.cursor = None     # read back from the target: a lost COMMIT may have happened
        if self.down_since is None:
            self.down_since = time.monotonic()

    def _send(self, records: List[Record], at_boundary: bool = False) -> None:
        self._connect()
        try:
            self._deliver(records, at_boundary)
        except Refused as refused:
            self._rollback()
            self.applier.forget()     # a table created in the rolled back transaction
            if refused.index < 0:
                # a held event of an earlier delivery: it has no place in this one to name
                raise SinkError(f"{refused.reason} (an event held from an earlier batch); "
                                f"fix: {refused.fix}") from None
            raise UndeliverableError(refused.index, refused.reason, refused.fix) from None
        except UnorderedPosition:
            self._rollback()
            raise
        except self.target.Lost as exc:
            self.last_error = _first_line(exc)
            self._disconnect()
            raise SinkError(f"sync: lost the target: {self.last_error}; reconnecting") from None
        except self.target.Error as exc:
            self.last_error = _first_line(exc)
            self._disconnect()
            raise SinkError(f"sync: the target failed: {self.last_error}") from None

    def _rollback(self) -> None:
        try:
            self.conn.rollback()
        except self.target.Error:
            self._disconnect()

    def _deliver(self, records: List[Record], at_boundary: bool = False) -> None:
        cursor = self.cursor.copy()
        work: List[tuple] = [(r, -1) + order_of(r.position, r.type)
                             for r in cursor.pending]
        last: Optional[tuple] = None        # (stream, key) of the delivery's last event
        for index, record in enumerate(records):
            stream, key = order_of(record.position, record.type)
            if stream != "lsn":
                self.applier.mysql = True
            last = (stream, key)
            if cursor.admits(record, stream, key):
                work.append((record, index, stream, key))
        if not work:
            return      # all of it is in the target already (a replay after a restart)
        groups: List[List[tuple]] = []
        for entry in work:
            if groups and groups[-1][0][2:] == entry[2:]:
                groups[-1].append(entry)
            else:
                groups.append([entry])
        tail: List[tuple] = []
        # At a boundary the last group is whole only if the delivery's last event is of it:
        # events the target has already (a replay after a crash) may end the delivery
        # before the held group, whose end is then still to come.
        whole = at_boundary and tuple(groups[-1][0][2:]) == last
        if not whole and not all(completes_itself(e[0].type, e[0].data) for e in groups[-1]):
            tail = groups.pop()
        chunks = [groups[i:i + self.config.batch_transactions]
                  for i in range(0, len(groups), self.config.batch_transactions)] or [[]]
        had_pending = len(cursor.pending)
        for n, chunk in enumerate(chunks):
            last = n == len(chunks) - 1
            try:
                self._commit(cursor, chunk, n == 0, tail if last else None, had_pending)
            except Refused as refused:
                # what comes before the refused event's transaction is applied: the target
                # then stands right before it while the backend is held there
                self._rollback()
                before = next((g for g, group in enumerate(chunk)
                               if any(e[1] == refused.index for e in group)), len(chunk))
                if before:
                    self._commit(cursor, chunk[:before], n == 0, None, had_pending)
                raise

    def _commit(self, cursor: state.Cursor, chunk: List[List[tuple]], first: bool,
                tail: Optional[List[tuple]], had_pending: int) -> None:
        """One target transaction: the groups of ``chunk``, the cursor after them, and, for
        the delivery's last one (``tail`` not None), the events held from now on."""
        entries = [e for group in chunk for e in group]
        if entries:
            self._apply(entries)
        for group in chunk:
            stream, key = group[0][2], group[0][3]
            partial = all(completes_itself(e[0].type, e[0].data) for e in group)
            cursor.applied(stream, key, [e[0].id for e in group] if partial else [], partial)
        keep = 0
        changed = False
        if tail:
            self._try(tail)
        if tail is not None:
            tail_records = [e[0] for e in tail]
            # the held events go on in the same transaction: store only the new ones
            if had_pending and first and not entries and \
                    [r.id for r in tail_records[:had_pending]] == [r.id for r in cursor.pending]:
                keep = had_pending
            cursor.hold(tail_records, (tail[0][2], tail[0][3]) if tail else None)
            changed = bool(had_pending or tail)
        elif first and had_pending:
            cursor.hold([], None)     # applied in this transaction: no longer held
            changed = True
        last_id = entries[-1][0].id if entries else None
        with self.conn.cursor() as cur:
            self.target.save(cur, self.config, self.backend, cursor, last_id, changed, keep)
        self.conn.commit()
        self.cursor = cursor.copy()
        self.applied += len(entries)

    def _try(self, tail: List[tuple]) -> None:
        """Apply the events to be held and undo it (a savepoint): a row the target refuses
        is found now, while it has its place in this delivery to be named by, not later,
        when its transaction's end arrives in another delivery."""
        with self.conn.cursor() as cur:
            cur.execute("SAVEPOINT lapidus_sync_tail")
        try:
            self._apply(tail, rollback=False)
        finally:
            with self.conn.cursor() as cur:
                cur.execute("ROLLBACK TO SAVEPOINT lapidus_sync_tail")
            self.applier.forget()

    def _apply(self, entries: List[tuple], rollback: bool = True) -> None:
        """Apply in the open transaction; a refused row is found and raised as Refused."""
        batch = [e[0] for e in entries]
        events = [self.applier.decode(r) for r in batch]
        indexes = [e[1] for e in entries]
        try:
            with self.conn.cursor() as cur:
                self.applier.apply(cur, batch, events, indexes)
        except self.target.Error as exc:
            if not self.target.refusing(exc):
                raise
            self.applier.forget()
            if not rollback:
                # inside the savepoint of _try: find the row within it, keep what is before
                with self.conn.cursor() as cur:
                    cur.execute("ROLLBACK TO SAVEPOINT lapidus_sync_tail")
                raise self._culprit(batch, events, indexes, exc, whole=False) from None
            self.conn.rollback()
            raise self._culprit(batch, events, indexes, exc) from None

    def _culprit(self, batch, events, indexes, first: Exception,
                 whole: bool = True) -> Refused:
        """Apply one event at a time under savepoints until the one the target refuses;
        everything is rolled back afterwards (the caller raises): the whole transaction, or
        with ``whole`` false back to the savepoint of :meth:`_try`."""
        try:
            with self.conn.cursor() as cur:
                for record, event, index in zip(batch, events, indexes):
                    cur.execute("SAVEPOINT lapidus_sync_row")
                    try:
                        self.applier.apply(cur, [record], [event], [index])
                    except self.target.Error as exc:
                        if not self.target.refusing(exc):
                            raise
                        key = json.dumps(list(record.key or ()))
                        return Refused(index, f"sync: the target refuses event {record.id} "
                                              f"({record.type} on {record.schema}."
                                              f"{record.table}, key {key}): {_first_line(exc)}",
                                       "change the target (constraint, type, trigger) so it "
                                       "accepts the row, or set on_undeliverable = "
                                       "\"dead_letter\" to set it aside")
                    cur.execute("RELEASE SAVEPOINT lapidus_sync_row")
        finally:
            if whole:
                self.conn.rollback()
            else:
                with self.conn.cursor() as cur:
                    cur.execute("ROLLBACK TO SAVEPOINT lapidus_sync_tail")
            self.applier.forget()
        return Refused(indexes[0], f"sync: the target refuses a batch: {_first_line(first)}",
                       "see the target's log")


def _target(dsn: str):
    """The target's kind from its DSN: a ``mysql://`` or ``mariadb://`` URL, else PostgreSQL."""
    if dsn.split("://", 1)[0].lower() in ("mysql", "mariadb"):
        from .mysql_target import MysqlTarget
        return MysqlTarget()
    from .pg_target import PgTarget
    return PgTarget()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
