"""The generic worker loop: source -> encoded batches -> dispatcher, acks -> checkpoint.

Runs in a worker process, one per backend, forked by the workers' fork server
(:mod:`.forkserver`).  A database that cannot
be reached (at start or mid-stream) is waited for here, for ever, in the WAITING state
(:mod:`.waiting`); sources only say whether an error is fatal.  Flow control: at most
``max_inflight_batches`` batches are unconfirmed at any time; when the sinks are slow or down
the worker stops reading its source (backpressure, nothing is dropped).  A checkpoint is saved
only for positions whose batches every sink confirmed, at most every ``CHECKPOINT_EVERY`` seconds
and always before a clean exit.  In cluster mode the checkpoint lives in the cluster bucket
(:mod:`lapidus.cluster.checkpoints`); a refused write (another node holds the lease) or a
batch due past the lease's stop time ends the worker at once with ``exitcodes.LEASE_LOST``.
"""

from __future__ import annotations

import collections
import datetime
import importlib
import math
import operator
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any, Deque, Optional, Tuple

from .. import exitcodes, logs
from ..checkpoint import CheckpointStore
from ..cluster.protocol import CheckpointUnavailable, LeaseLost
from ..events import batch_fields
from ..sink_runs import END
from ..procutil import die_with_parent, run_profiled, set_process_name, tune_gc_for_throughput
from ..settings.backends import BATCH_LINGER
from ..transport import DispatcherLink, LinkLost
from .base import BackendError, Batch, Source
from .snapshot.backfills import Backfills
from .snapshot.requests import BackfillQueue
from .waiting import DEFAULT_MAX_DELAY, StopGate, StopRequested, Waiter
from .wakeup import Wakeup

_COUNT_KEY = operator.itemgetter(2, 3, 1)     # schema, table, type of a Record's fields
CHECKPOINT_EVERY = 0.2  # seconds; bounds fsyncs to a few per second under load
# While anything moves (batches in flight, a new position) the stats go out at most this
# often; sources that cannot sleep longer (Source.idle_wait) are looked at this often too.
STATUS_EVERY = 1.0
# Stats that did not change since the last report are sent again only this often (at most;
# less when the supervisor's heartbeat_timeout is short), so a hundred idle workers do not
# wake the supervisor a hundred times a second to learn nothing.
QUIET_REPORT_EVERY = 10.0
# How long one read may wait for the source while batches are in flight or a position is
# unsaved: acks and a pending checkpoint need the loop soon.  Sources wake at once when data
# arrives (inotify, a socket), so this only bounds how late the loop looks at other things.
# With nothing in flight a read waits until the next report is due (StatusSchedule), or a
# second for a source that cannot sleep longer: that is what lets a hundred idle backends
# cost next to no CPU.
READ_WAIT_BUSY = 0.2
READ_WAIT_IDLE = STATUS_EVERY
DRAIN_SECONDS = 7.0   # longest wait for the acks of what is in flight (stop, reconnect)
LINK_LOST_GRACE = 1.0  # seconds a worker that lost its dispatcher waits for a stop signal


def quiet_report_every(heartbeat_timeout: float) -> float:
    """Seconds between two reports of unchanged stats (a worker's, the dispatcher's): the
    supervisor kills a child silent for ``heartbeat_timeout``, so well within it."""
    return max(STATUS_EVERY, min(QUIET_REPORT_EVERY, heartbeat_timeout / 4))


def next_keep_alive(last_report: float, every: float) -> float:
    """When unchanged stats are due again after a report at ``last_report`` (monotonic): the
    next multiple of ``every``, at most ``every`` later.  Every process of the box counts on
    the same monotonic clock, so idle children report together and the supervisor wakes
    once for many of them rather than once for each."""
    return (math.floor(last_report / every) + 1) * every


#: backend type -> (module, class) of its Source
SOURCES = {"postgresql": ("lapidus.workers.postgresql.source", "PostgresSource"),
           "mysql": ("lapidus.workers.mysql.source", "MysqlSource"),
           "mongo": ("lapidus.workers.mongo.source", "MongoSource")}


def make_source(backend, state_dir: Path, log) -> Source:
    """The Source class for ``backend.type`` (imported lazily: a worker loads only its own,
    unless the fork server preloaded it, :func:`server_preload`)."""
    if backend.type not in SOURCES:
        raise BackendError(f"unknown backend type {backend.type!r}", fatal=True)
    module_name, class_name = SOURCES[backend.type]
    module = importlib.import_module(module_name)
    return getattr(module, class_name)(backend, state_dir, log)


def server_preload(backend_types) -> list:
    """The modules the workers' fork server imports before it forks a worker: what every
    worker runs, and the Source modules of ``backend_types`` (only those: whatever the
    server holds is resident in each worker, so a PostgreSQL-only box carries no MongoDB
    driver)."""
    return sorted(SOURCES[t][0] for t in set(backend_types) if t in SOURCES) + [
        "lapidus.workers.forkserver"]           # last: it freezes what the others loaded


class StatusSchedule:
    """When the worker loop next takes its status step (stats, backfill requests).

    Runs in the worker process.  The step is due at once after a wake-up (a signal: a
    backfill request, see :mod:`.wakeup`); ``STATUS_EVERY`` after the last one while the
    loop's own figures move (a batch, an ack, a new position), and always for a source that
    cannot sleep longer than that anyway (``every_second``); otherwise only when the
    unchanged stats are due again as the worker's keep-alive (at most ``quiet_every`` after
    the last report, well inside the supervisor's ``heartbeat_timeout``; on a grid common to
    all children, :func:`next_keep_alive`).  Stats go out when they changed or at the
    keep-alive.
    """

    def __init__(self, quiet_every: float, start: float, *, every_second: bool):
        self.quiet_every = quiet_every
        self.every_second = every_second
        self.last_step = start          # the first step follows the first read
        self.keep_alive_at = -math.inf  # the first stats go out whatever they are
        self.reported: Optional[dict] = None
        self.seen: Optional[tuple] = None     # the loop's figures at the last step

    def next_due(self, figures: tuple) -> float:
        """Monotonic time of the next step, ``figures`` being the loop's figures now."""
        soon = self.last_step + STATUS_EVERY
        if self.every_second or figures != self.seen:
            return soon
        return max(soon, self.keep_alive_at)

    def due(self, now: float, figures: tuple) -> bool:
        return now >= self.next_due(figures)

    def stepped(self, now: float, figures: tuple, stats: dict) -> bool:
        """Record a step; True when ``stats`` must be sent (changed, or keep-alive due)."""
        self.last_step, self.seen = now, figures
        if stats == self.reported and now < self.keep_alive_at:
            return False
        self.reported = stats
        self.keep_alive_at = next_keep_alive(now, self.quiet_every)
        return True


class WorkerLoop:
    """State of one worker process; :meth:`run` is its whole life.

    Life: open the source (a transient failure waits and retries, :mod:`.waiting`), stream,
    and when the connection is lost mid-stream take the acks of what is in flight, save the
    checkpoint, close the source and open it again from the confirmed checkpoint, on the
    same dispatcher link.  Only a fatal :class:`BackendError` (or a lost dispatcher) ends
    the process before it is told to stop.
    """

    def __init__(self, backend, state_dir: Path, socket_path: str, status, log,
                 heartbeat_timeout: float = 60.0, lease=None, wake: Optional[Wakeup] = None):
        self.backend = backend
        self.state_dir = state_dir
        self.socket_path = socket_path
        self.status = status            # multiprocessing Connection to the supervisor
        self.quiet_report_every = quiet_report_every(heartbeat_timeout)
        self.log = log
        self.wake = wake                # signals end an idle read at once (None: tests)
        self.gate = StopGate()
        if lease is not None:
            from ..cluster.checkpoints import FencedCheckpointStore
            self.store = FencedCheckpointStore(lease, backend.name, log,
                                               stopping=lambda: self.gate.stopping)
        else:
            self.store = CheckpointStore(state_dir)
        self.unsaved_since: Optional[float] = None   # cluster: the bucket did not answer
        self.stop_at = lease.stop_at if lease is not None else None   # cluster: shared
        # (seq or None, checkpoint, commit time of the batch's first event or None)
        self.inflight: Deque[Tuple[Optional[int], Any, Optional[str]]] = collections.deque()
        self.confirmed: Any = None      # newest checkpoint whose events are all delivered
        self.saved: Any = None
        self.last_save = 0.0
        self.seq = 0
        # the last batch sent ended inside a transaction (not at_boundary): its end, when it
        # comes in a batch without events, is sent as an empty batch (_loop)
        self.open_tail = False
        self.events_sent = 0
        self.event_counts: dict = {}   # (schema.table, type) -> events, for /metrics
        self.backfills = Backfills(BackfillQueue(state_dir), log)
        # within the supervisor's stop_timeout, so a clean stop is never a SIGKILL
        self.drain_timeout = DRAIN_SECONDS
        options = backend.options
        self.batch_size = int(options.get("batch_size", 1000))
        self.linger = float(options.get("batch_linger", BATCH_LINGER))
        self.read_not_before = 0.0      # monotonic; see _linger
        self.max_inflight = int(options.get("max_inflight_batches", 8))
        self.waiter = Waiter(
            maximum=float(options.get("reconnect_max_delay") or DEFAULT_MAX_DELAY),
            report=self.report, log=log, gate=self.gate)

    @property
    def stopping(self) -> bool:
        return self.gate.stopping

    def request_stop(self, *_):
        self.gate.request()

    @property
    def oldest_unconfirmed_ts(self) -> Optional[str]:
        """Commit time of the oldest event sent and not yet confirmed (None: nothing is)."""
        for _seq, _checkpoint, ts in self.inflight:
            if ts is not None:
                return ts
        return None

    def report(self, kind: str, **fields) -> None:
        try:
            self.status.send((kind, fields))
        except (OSError, ValueError):
            pass  # the supervisor is gone; die_with_parent ends us shortly

    def run(self) -> int:
        source = None
        link = None
        try:
            source = make_source(self.backend, self.state_dir, self.log)
            source.wake_fd = self.wake.fd if self.wake is not None else None
            source.encoded_reads = True       # _take sends batch_fields' records as they are
            if not isinstance(self.store, CheckpointStore):
                source.share_state(self.store)     # cluster mode
            checkpoint = self.store.load()
            self.saved = self.confirmed = checkpoint
            resumed = checkpoint is not None
            while self._open(source):
                if link is None:
                    link = DispatcherLink(self.socket_path, self.backend.name,
                                          config=self.backend)
                self.report("ready", position=_position_of(self.confirmed))
                self.log.info("streaming", resumed=resumed)
                resumed = True
                try:
                    self._loop(source, link)
                    break                           # told to stop
                except BackendError as exc:
                    if exc.fatal:
                        raise
                    self._reconnect_after(exc, source, link)
            if link is not None:
                self._drain(link)
                self._save(force=True, source=source)
                link.close()
            return exitcodes.CHILD_OK
        except LeaseLost as exc:
            self.log.warning("this node does not hold this backend's lease any more; stopping "
                             "at once", reason=str(exc))
            return exitcodes.LEASE_LOST
        except CheckpointUnavailable as exc:     # only when told to stop while waiting
            self.log.warning("stopped before the checkpoint could be read", error=str(exc))
            return exitcodes.CHILD_OK
        except BackendError as exc:
            self.report("error", message=str(exc), fatal=exc.fatal)
            self.log.error("backend failed", error=str(exc), fatal=exc.fatal)
            return exitcodes.CHILD_FATAL if exc.fatal else exitcodes.CHILD_ERROR
        except LinkLost as exc:
            if not self.stopping:
                # The dispatcher may have gone because Lapidus is stopping (its output was
                # closed, as in `lapidus --stdout | head`): the supervisor's SIGTERM follows
                # within moments, and this is then a stop, not a loss.
                deadline = time.monotonic() + LINK_LOST_GRACE
                while not self.stopping and time.monotonic() < deadline:
                    time.sleep(0.05)
            if self.stopping:
                # the supervisor is stopping everything: the dispatcher may go first (its
                # output was closed); what was not confirmed is sent again at the next start
                self.log.info("dispatcher gone while stopping", error=str(exc))
                return exitcodes.CHILD_OK
            self.log.warning("lost the dispatcher; starting again", error=str(exc))
            return exitcodes.LINK_LOST
        finally:
            try:
                if source is not None:
                    source.close()
            except Exception as exc:  # closing must not hide the original failure
                self.log.warning("error while closing the source", error=str(exc))
            if hasattr(self.store, "close"):
                self.store.close()

    def _open(self, source: Source) -> bool:
        """Open ``source`` at the confirmed checkpoint, waiting out transient failures.

        True once open; False when the worker was told to stop first.  Fatal errors raise.
        """
        error: Optional[BackendError] = None
        while not self.stopping:
            if error is not None:
                self.waiter.heartbeat(source.target(), error)
            try:
                with self.gate.blocking():
                    source.open(self.confirmed)
                self.waiter.connected()
                return True
            except StopRequested:
                return False
            except BackendError as exc:
                if exc.fatal:
                    raise
                error = exc
            source.suspend()                    # whatever the attempt left half-open
            if not self.waiter.wait(error, source.target()):
                return False
        return False

    def _reconnect_after(self, error: BackendError, source: Source,
                         link: DispatcherLink) -> None:
        """The connection broke mid-stream: settle what the sinks confirm, then close.

        Batches still unconfirmed after the bounded wait are forgotten here: the source
        reads them again from the confirmed checkpoint, and a late ack of theirs moves
        nothing (acks are cumulative and the new batches have higher numbers).
        """
        self.log.warning("lost the connection to the database; reconnecting from the last "
                         "confirmed position", error=str(error), target=source.target())
        short_lived = self.waiter.lost(error, source.target())
        self._drain(link)
        self._save(force=True, source=source)
        self.inflight.clear()
        # the source reads again from the confirmed checkpoint: an end it reads now belongs
        # to what it sends again, not to the last batch sent
        self.open_tail = False
        source.suspend()
        if short_lived:
            self.waiter.wait(error, source.target())   # a stop ends it; _open then sees it

    def _loop(self, source: Source, link: DispatcherLink) -> None:
        """Stream until told to stop: read, send, take acks, save; and the status step
        (stats, backfill requests) when it is due or a signal woke the worker."""
        schedule = StatusSchedule(self.quiet_report_every, time.monotonic(),
                                  every_second=source.idle_wait() <= STATUS_EVERY)
        while not self.stopping:
            if self.inflight:
                self._take_acks(link, 0.0)
            if len(self.inflight) >= self.max_inflight:
                self._take_acks(link, 0.2)     # backpressure: the sinks are behind
                source.tick()
            else:
                self._linger()
                wait = self._read_wait(source, schedule)
                batch = source.read(self.batch_size, wait)
                self._take(batch, link, source)
                if batch.events and len(batch.events) < self.batch_size and self.linger:
                    # more may follow close behind: they go out with the next read, one
                    # batch (one frame, delivery, ack) for all that came within the linger
                    self.read_not_before = time.monotonic() + self.linger
            self._settle_unsent()
            self._save(source=source)
            # emptied before the step: a signal arriving later ends the next read at once
            woken = self.wake is not None and self.wake.drain()
            now = time.monotonic()
            figures = self._figures()
            if woken or schedule.due(now, figures):
                self._status_step(source, schedule, now, figures)

    def _linger(self) -> None:
        """Wait until ``read_not_before``: after a read that found events but did not fill a
        batch, what arrives in the next ``batch_linger`` seconds is read as one batch
        instead of one batch per transaction.  A signal (a stop, a backfill request) ends
        the wait at once; an idle source is not waited for (the read after a quiet spell
        sends its first events at once)."""
        left = self.read_not_before - time.monotonic()
        if left <= 0 or self.stopping:
            return
        if self.wake is None:
            time.sleep(left)
        else:
            select.select([self.wake.fd], [], [], left)

    def _figures(self) -> tuple:
        """What the loop itself changes in the stats: while these move, the stats are due
        every STATUS_EVERY; once they stand still, only as a keep-alive."""
        return self.seq, self.confirmed, len(self.inflight)

    def _read_wait(self, source: Source, schedule: "StatusSchedule") -> float:
        """How long the next read may wait for the source (see READ_WAIT_BUSY)."""
        if self.inflight or self.confirmed is not self.saved:
            return READ_WAIT_BUSY
        longest = source.idle_wait()
        if source.snapshot_running():
            longest = min(longest, READ_WAIT_IDLE)  # chunks and their hand-off need looks
        due = schedule.next_due(self._figures())
        return max(0.0, min(longest, due - time.monotonic()))

    def _take(self, batch: Batch, link: DispatcherLink, source: Source) -> None:
        """Send what ``batch`` carries, or just take its new position."""
        if batch.checkpoint is None:
            return
        if batch.events:
            self._check_lease()
            self.seq += 1
            fields = batch_fields(batch.events)
            link.send_batch(self.seq, fields, batch.at_boundary, _routed(source, batch))
            self.open_tail = not batch.at_boundary
            self.events_sent += len(fields)
            self._count(fields)
            self.inflight.append((self.seq, batch.checkpoint, batch.events[0].ts))
        elif batch.at_boundary and self.open_tail:
            # the last batch's transaction ended after its last event (a COMMIT, rows
            # filtered out): an empty batch says so, or a sink that applies whole
            # transactions would wait for the next one
            self.seq += 1
            link.send_batch(self.seq, [], True)
            self.open_tail = False
            self.inflight.append((self.seq, batch.checkpoint, None))
        elif self.inflight:
            self.inflight.append((None, batch.checkpoint, None))
        elif batch.checkpoint != self.confirmed:
            # a source may hand out the same position on every empty read (MySQL): only a
            # new one is worth a save (two fsyncs)
            self.confirmed = batch.checkpoint

    def _status_step(self, source: Source, schedule: "StatusSchedule", now: float,
                     figures: tuple) -> None:
        """Bring the backfills in line with their request files, and send the stats when
        they changed or the keep-alive is due."""
        self.backfills.poll(source, self.saved)
        stats = dict(source.status())
        # always given: the supervisor keeps the fields of earlier reports, so a run reported
        # by a worker before its restart would otherwise stay "running" in the status
        stats.setdefault("snapshot", None)
        stats["backfills"] = self.backfills.status()
        # the loop's own fields win over a source's extras of the same name
        stats.update(events=self.events_sent, inflight=len(self.inflight),
                     position=_position_of(self.confirmed),
                     event_counts=dict(self.event_counts),
                     lag_seconds=_age(self.oldest_unconfirmed_ts))
        if schedule.stepped(now, figures, stats):
            self.report("stats", **stats)

    def _check_lease(self) -> None:
        """Cluster mode: no batch goes out past the stop time the supervisor set (it moves
        with every confirmed renewal); past it the worker ends as one whose lease is lost."""
        if self.stop_at is not None and time.monotonic() >= self.stop_at.value:
            raise LeaseLost("this node's lease was not renewed in time; stopping before it "
                            "can expire")

    def _count(self, fields) -> None:
        """Events per (schema.table, type) for /metrics, from the batch's Record fields:
        counted in C over the batch, then named once per distinct table and type."""
        counts = self.event_counts
        for (schema, table, kind), n in collections.Counter(map(_COUNT_KEY, fields)).items():
            key = (f"{schema}.{table}" if table else "", kind)
            counts[key] = counts.get(key, 0) + n

    def _take_acks(self, link: DispatcherLink, timeout: float) -> None:
        acked = link.acks(timeout)
        if acked is None:
            return
        while self.inflight and (self.inflight[0][0] is None or self.inflight[0][0] <= acked):
            self.confirmed = self.inflight.popleft()[1]

    def _settle_unsent(self) -> None:
        """Checkpoints that needed no delivery become confirmed once everything before is."""
        while self.inflight and self.inflight[0][0] is None:
            self.confirmed = self.inflight.popleft()[1]

    def _save(self, *, source: Source, force: bool = False) -> None:
        if self.confirmed is None or self.confirmed is self.saved:
            return
        now = time.monotonic()
        if not force and now - self.last_save < CHECKPOINT_EVERY:
            return
        try:
            self.store.save(self.confirmed)
        except CheckpointUnavailable as exc:
            # cluster mode: the position is saved again at the next chance; the lease decides
            # whether this worker may go on meanwhile
            self.last_save = now
            if self.unsaved_since is None:
                self.unsaved_since = now
                self.log.warning("cannot save the checkpoint to the cluster bucket; retrying",
                                 error=str(exc))
            return
        if self.unsaved_since is not None:
            self.log.info("checkpoint saved to the cluster bucket again",
                          after_seconds=round(now - self.unsaved_since, 1))
            self.unsaved_since = None
        self.saved, self.last_save = self.confirmed, now
        source.commit(self.confirmed)

    def _drain(self, link: DispatcherLink) -> None:
        """Wait (bounded by ``drain_timeout``) for the sinks to confirm what was sent; not
        while the dispatcher says a sink holds the batches (down, or refusing an event), whose
        acks cannot come (what is left is sent again from the saved position, same ids)."""
        deadline = time.monotonic() + self.drain_timeout
        while self.inflight and time.monotonic() < deadline:
            if link.held_by:
                self.log.warning("not waiting for the acks of the batches in flight: a sink "
                                 "holds them", sinks=link.held_by)
                break
            self._take_acks(link, 0.1)
            self._settle_unsent()
        if self.inflight:
            self.log.warning("unconfirmed batches left; they will be sent again",
                             batches=len(self.inflight))


def _routed(source: Source, batch: Batch) -> bool:
    """Whether ``batch`` may hold events of a run made for one sink, which the dispatcher
    then gives to that sink only (lapidus.sink_runs).  Runs start between reads, so the
    source's run after the read is the run of the batch's ``read`` events; the event that
    ends a sink's run is the last of its batch, or the first (its table was dropped)."""
    progress = source.snapshot_progress
    events = batch.events
    return progress is not None and progress.sink is not None \
        and (not progress.done or events[-1][1] == END or events[0][1] == END)


def _age(ts: Optional[str]) -> float:
    """Seconds since an RFC 3339 commit time; 0 when everything read is confirmed."""
    if not ts:
        return 0.0
    try:
        then = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, round(time.time() - then.timestamp(), 3))


def _position_of(checkpoint: Any) -> Optional[str]:
    if checkpoint is None:
        return None
    if isinstance(checkpoint, dict):
        for key in ("position", "gtid", "last_lsn"):
            if key in checkpoint:
                value = checkpoint[key]
                if key == "last_lsn" and isinstance(value, int):
                    from .postgresql.decoding import format_lsn
                    return format_lsn(value)
                return str(value)
    return str(checkpoint)


def _fork_server_pid() -> Optional[int]:
    """The pid of the fork server that forked this worker, its parent (None when the module
    that records it was not preloaded there)."""
    from . import forkserver
    return forkserver.SERVER_PID if forkserver.SERVER_PID != os.getpid() else None


def _let_go_of_the_fork_servers_pipes() -> None:
    """Close this worker's copies of the write ends of the fork server's "alive" pipe and of
    the resource tracker's pipe.

    multiprocessing hands them to every process its fork server starts, so that such a
    process could start others in turn; a worker never does.  The server exits once every
    copy is closed: a worker holding one kept the server (and so itself, which dies with the
    server) alive after a kill -9 of the supervisor until the worker noticed by itself that
    the supervisor was gone, seconds later under load.  Private attributes of multiprocessing
    (CPython 3.8 to 3.13 set them in ``forkserver._serve_one``); where they are missing the
    worker only keeps the pipes, as before."""
    try:
        from multiprocessing import forkserver, resource_tracker
        holders = ((forkserver._forkserver, "_forkserver_alive_fd"),
                   (resource_tracker._resource_tracker, "_fd"))
    except (ImportError, AttributeError):
        return
    for holder, name in holders:
        fd = getattr(holder, name, None)
        if isinstance(fd, int):
            setattr(holder, name, None)
            try:
                os.close(fd)
            except OSError:
                pass


def take_signals(on_stop, wake: Wakeup) -> None:
    """Set the worker's signal handlers, then let SIGTERM in: blocked since the fork
    (:mod:`lapidus.workers.forkserver`), a stop that came already is delivered now, to
    ``on_stop``."""
    signal.signal(signal.SIGTERM, on_stop)
    wake.install()
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C goes to the supervisor, which stops us
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def worker_main(backend, state_dir: str, socket_path: str, log_format: str, log_level: str,
                heartbeat_timeout: float, lease, status) -> None:
    """Entry point of a worker process (the target of multiprocessing.Process).

    ``lease`` is None, or in cluster mode the :class:`lapidus.cluster.protocol.WorkerLease`
    this node holds for the backend.  ``status`` is the write end of the pipe to the
    supervisor (appended by ChildHandle.spawn).
    """
    # SIGKILL, not TERM: a worker stuck in a connect retry must still go within a second;
    # nothing is lost, the checkpoint and the slot only ever move after delivery.
    server = _fork_server_pid()
    die_with_parent(signal.SIGKILL, server)
    if server is not None:
        _let_go_of_the_fork_servers_pipes()
    set_process_name(f"lapidus:{backend.name}")
    tune_gc_for_throughput()
    logs.configure(log_format, log_level, process="worker")
    log = logs.get_logger(backend=backend.name)
    path = Path(state_dir)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    wake = Wakeup()
    loop = WorkerLoop(backend, path, socket_path, status, log, heartbeat_timeout, lease, wake)
    take_signals(loop.request_stop, wake)
    try:
        code = run_profiled(f"worker-{backend.name}", loop.run)
    except StopRequested:       # a stop that hit the very end of a blocking section
        code = exitcodes.CHILD_OK
    except Exception:
        log.exception("worker crashed")
        code = exitcodes.CHILD_ERROR
    sys.stdout.flush()
    os._exit(code)
