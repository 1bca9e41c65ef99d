"""The worker's own waiting for an unreachable database (lapidus/workers/waiting.py and the
WorkerLoop around it), the classification of PostgreSQL errors, and the delivery-lag metric.

No database and no processes: a fake source, a fake dispatcher link, a fake clock.
"""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List, Optional

import psycopg2
import pytest
import structlog

from lapidus.events import Event
from lapidus.workers import runner
from lapidus.workers.base import BackendError, Batch, Source
from lapidus.workers.postgresql import errors as pg_errors
from lapidus.workers.waiting import StopGate, StopRequested, Waiter
from lapidus.workers.wakeup import WAKE_SIGNAL, Wakeup

LOG = structlog.get_logger()
OPTIONS = {"host": "db.example", "port": 5433, "user": "cdc", "database": "shop"}


# ----------------------------------------------------------------------------- PostgreSQL

@pytest.mark.parametrize("text,fatal,needle", [
    ('connection to server at "db.example", port 5433 failed: FATAL:  role "cdc" does not '
     'exist', True, 'has no role "cdc"'),
    ('FATAL:  password authentication failed for user "cdc"', True, "wrong or missing password"),
    ('FATAL:  database "shop" does not exist', True, 'database "shop" does not exist'),
    ('FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "cdc"', True, "pg_hba.conf"),
    ('FATAL:  permission denied for database "shop"', True, "lacks a privilege"),
    ('connection to server at "db.example", port 5433 failed: Connection refused\n\tIs the '
     'server running on that host and accepting TCP/IP connections?', False,
     "cannot reach PostgreSQL at db.example:5433: connection to server"),
    ("timeout expired", False, "cannot reach PostgreSQL"),
    ("FATAL:  sorry, too many clients already", False, "cannot reach"),
    ("FATAL:  remaining connection slots are reserved for non-replication superuser "
     "connections", False, "refuses more connections"),
    ("FATAL:  the database system is starting up", False, "starting or stopping"),
    ("FATAL:  the database system is shutting down", False, "starting or stopping"),
    ('could not translate host name "db.exmaple" to address', False, "DNS"),
])
def test_postgresql_connection_errors_are_classified(text, fatal, needle):
    error = pg_errors.connection_error(psycopg2.OperationalError(text), OPTIONS, "shop")
    assert error.fatal is fatal, error
    assert needle in str(error), error
    assert str(error).startswith('backend "shop": ')
    assert "\n" not in str(error)


class FakePgError(psycopg2.Error):
    def __init__(self, text, code):
        super().__init__(text)
        self._text, self._code = text, code

    @property
    def pgerror(self):
        return self._text

    @property
    def pgcode(self):
        return self._code


@pytest.mark.parametrize("text,code,fatal,needle", [
    ("ERROR:  permission denied for table orders", "42501", True, "lacks a privilege"),
    ("ERROR:  relation \"x\" does not exist", "42P01", True, "SQLSTATE 42P01"),
    ("ERROR:  canceling statement due to statement timeout", "57014", False, "timed out"),
    ("FATAL:  terminating connection due to administrator command", "57P01", False,
     "lost the connection"),
    ("server closed the connection unexpectedly", None, False, "lost the connection"),
])
def test_postgresql_query_errors_are_classified(text, code, fatal, needle):
    error = pg_errors.query_error(FakePgError(text, code), OPTIONS, "shop", "checking")
    assert error.fatal is fatal and needle in str(error), error


@pytest.mark.parametrize("log,fatal,needle", [
    ("pg_recvlogical: error: could not receive data from WAL stream: server closed the "
     "connection unexpectedly\npg_recvlogical: error: disconnected", False,
     "lost its connection to PostgreSQL at db.example:5433: pg_recvlogical: error: could not "
     "receive data"),
    ('pg_recvlogical: error: connection to server at "db.example" (10.0.0.1), port 5433 '
     'failed: Connection refused', False, "reconnecting"),
    ('pg_recvlogical: error: connection to server failed: FATAL:  role "cdc" does not exist',
     True, 'has no role "cdc"'),
    ('pg_recvlogical: error: could not send replication command "START_REPLICATION": ERROR:  '
     'replication slot "lapidus_shop" does not exist', True, "dropped while Lapidus streamed"),
    ("", False, "exited without a message"),
])
def test_pg_recvlogical_deaths_are_classified(log, fatal, needle):
    error = pg_errors.child_error(log, OPTIONS, "shop")
    assert error.fatal is fatal and needle in str(error), error


# ----------------------------------------------------------------------------- the waiter

class Clock:
    def __init__(self):
        self.now = 100.0
        self.slept: List[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def make_waiter(maximum=4.0):
    clock = Clock()
    reports: List[tuple] = []
    waiter = Waiter(maximum=maximum, report=lambda kind, **f: reports.append((kind, f)),
                    log=LOG, gate=StopGate(), clock=clock, sleep=clock.sleep)
    waiter.backoff.jitter = 0.0
    return waiter, clock, reports


def test_waiting_reports_at_once_and_every_second_with_capped_doubling_delays():
    waiter, clock, reports = make_waiter(maximum=4.0)
    error = BackendError("cannot reach PostgreSQL at db:5432")
    delays = []
    for _ in range(6):
        before = clock.now
        assert waiter.wait(error, "db:5432") is True
        delays.append(clock.now - before)
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert max(clock.slept) <= 1.0                 # a report at least every second
    assert reports[0] == ("waiting", {"target": "db:5432", "since": waiter.since,
                                      "error": str(error)})
    assert len(reports) >= sum(delays)            # about one a second, plus one at once
    since = waiter.since
    assert all(f["since"] == since for _, f in reports)   # one wait, one start time
    waiter.connected()
    assert not waiter.waiting


def test_backoff_starts_over_only_after_a_connection_that_lasted():
    waiter, clock, _ = make_waiter(maximum=4.0)
    error = BackendError("down")
    for _ in range(3):
        waiter.wait(error, "db")
    waiter.connected()
    waiter.lost(error, "db")              # dropped at once: still slow
    assert waiter.backoff.peek() == 4.0
    assert waiter.waiting
    waiter.connected()
    clock.now += 60
    waiter.lost(error, "db")              # it had worked for a minute
    assert waiter.backoff.peek() == 0.5


def test_a_connection_lost_soon_after_it_was_made_is_not_reopened_at_once(tmp_path,
                                                                          monkeypatch):
    """A pg_recvlogical (or a server) that drops every new connection at once: the worker
    sees each loss at once, so it waits the backoff before reopening; a connection that had
    lasted is reopened at once."""
    waiter, clock, _ = make_waiter()
    error = BackendError("pg_recvlogical exited")
    waiter.connected()
    clock.now += 0.1
    assert waiter.lost(error, "db") is True
    waiter.connected()
    clock.now += 5.0
    assert waiter.lost(error, "db") is False

    class DroppingSource(Source):
        """Opens fine; every read finds the connection gone, until the loop is stopped."""

        def __init__(self, backend, state_dir, log, loop_ref):
            super().__init__(backend, state_dir, log)
            self.loop_ref, self.opened = loop_ref, 0

        def open(self, checkpoint):
            self.opened += 1

        def read(self, max_events, timeout):
            if self.opened >= 4:
                self.loop_ref[0].request_stop()
                return Batch()
            raise BackendError("pg_recvlogical exited")

        def close(self):
            pass

    factory = made_by(DroppingSource)
    loop, _ = make_loop(tmp_path, monkeypatch, factory)
    slept: List[float] = []
    loop.waiter.sleep = slept.append
    assert loop.run() == 0
    assert factory.made.opened == 4 and len(slept) >= 3, slept     # a wait before each reopen


def test_a_fatal_error_is_not_waited_for():
    waiter, _, reports = make_waiter()
    with pytest.raises(BackendError):
        waiter.wait(BackendError("wrong password", fatal=True), "db")
    assert reports == []


def test_stop_while_waiting_ends_the_wait():
    waiter, clock, _ = make_waiter()

    def sleep(seconds):
        waiter.gate.request()             # SIGTERM arrives during the sleep

    waiter.sleep = sleep
    assert waiter.wait(BackendError("down"), "db") is False
    assert waiter.gate.stopping


def test_stop_gate_interrupts_only_inside_blocking_sections():
    gate = StopGate()
    gate.request()                        # outside: only the flag
    assert gate.stopping
    gate = StopGate()
    with pytest.raises(StopRequested):
        with gate.blocking():
            gate.request()
    gate.request()                        # after the section: no exception any more
    with pytest.raises(StopRequested):    # and a new section refuses to start
        with gate.blocking():
            pass


# ----------------------------------------------------------------------------- WorkerLoop

def event(n: int, ts: str) -> Event:
    return Event(id=f"b:{n}:0", type="insert", backend="b", schema="s", table="t",
                 pk={"id": n}, item={"id": n}, before=None, position=str(n), txid=None, ts=ts)


class FakeLink:
    """The dispatcher: confirms batches when the test says so."""

    instances: List["FakeLink"] = []

    def __init__(self, path, name, config=None):
        self.sent: List[int] = []
        self.frames: List[tuple] = []          # (seq, number of records, at_boundary)
        self.confirm_up_to: Optional[int] = None
        self.held_by: List[str] = []
        FakeLink.instances.append(self)

    def send_batch(self, seq, records, at_boundary=False, routed=False):
        self.sent.append(seq)
        self.frames.append((seq, len(records), at_boundary))

    def acks(self, timeout):
        return self.confirm_up_to

    def close(self):
        pass


class FlakySource(Source):
    """Reads events 1, 2, 3 ...; the connection breaks once after ``break_after`` reads and
    the first reopen is refused (the server is still down)."""

    def __init__(self, backend, state_dir, log, loop_ref):
        super().__init__(backend, state_dir, log)
        self.opened_at: List[Any] = []
        self.position = 0
        self.reads = 0
        self.loop_ref = loop_ref
        self.refuse = 0

    def open(self, checkpoint):
        if self.refuse:
            self.refuse -= 1
            raise BackendError("cannot reach the server at db:1 (retrying)")
        self.opened_at.append(checkpoint)
        self.position = checkpoint or 0

    def read(self, max_events, timeout):
        self.reads += 1
        loop = self.loop_ref[0]
        if self.reads == 3:
            self.refuse = 1
            raise BackendError("the connection to db:1 was lost")
        if self.reads > 8:
            loop.request_stop()
            return Batch()
        self.position += 1
        return Batch([event(self.position, "2020-01-01T00:00:00.000Z")], self.position)

    def close(self):
        pass


def made_by(source_class, *args):
    """A ``source_factory`` for :func:`make_loop` that keeps the source the loop made, as
    ``factory.made``, for the test to look at afterwards."""
    def factory(b, d, log, ref):
        factory.made = source_class(b, d, log, ref, *args)
        return factory.made
    factory.made = None
    return factory


def make_loop(tmp_path: Path, monkeypatch, source_factory):
    FakeLink.instances.clear()
    monkeypatch.setattr(runner, "DispatcherLink", FakeLink)
    ref: List[Any] = []
    monkeypatch.setattr(runner, "make_source", lambda b, d, log: source_factory(b, d, log, ref))
    reports: List[tuple] = []
    status = SimpleNamespace(send=lambda message: reports.append(message))
    backend = SimpleNamespace(name="b", type="fake",
                              options={"reconnect_max_delay": 0.01, "host": "db", "port": 1})
    loop = runner.WorkerLoop(backend, tmp_path, "sock", status, LOG)
    loop.waiter.sleep = lambda seconds: None
    loop.drain_timeout = 0.05
    ref.append(loop)
    return loop, reports


def test_a_lost_connection_reopens_from_the_confirmed_checkpoint_on_the_same_link(
        tmp_path, monkeypatch):
    factory = made_by(FlakySource)
    loop, reports = make_loop(tmp_path, monkeypatch, factory)
    original = FakeLink.acks

    def acks(self, timeout):
        # the sinks confirm batch 1 only; batch 2 is still in flight when the link breaks
        return 1 if self.sent else None

    monkeypatch.setattr(FakeLink, "acks", acks)
    assert loop.run() == 0
    monkeypatch.setattr(FakeLink, "acks", original)
    assert len(FakeLink.instances) == 1                 # one link across the reconnect
    # first open from nothing, then (after one refused attempt) from the confirmed 1
    assert factory.made.opened_at == [None, 1]
    kinds = [kind for kind, _ in reports]
    assert kinds.index("waiting") < len(kinds) - 1
    assert kinds.count("ready") == 2
    assert "error" not in kinds                          # no crash reported
    waiting = [f for kind, f in reports if kind == "waiting"]
    assert all(f["target"] == "db:1" for f in waiting)
    assert loop.store.load() is not None


class ScriptedSource(Source):
    """Reads the batches of ``SCRIPT`` in turn, then asks the loop to stop."""

    SCRIPT: List[Batch] = []

    def __init__(self, backend, state_dir, log, loop_ref):
        super().__init__(backend, state_dir, log)
        self.loop_ref, self.script = loop_ref, list(self.SCRIPT)

    def open(self, checkpoint):
        pass

    def read(self, max_events, timeout):
        if not self.script:
            self.loop_ref[0].request_stop()
            return Batch()
        return self.script.pop(0)

    def close(self):
        pass


def test_a_transaction_end_read_without_events_is_sent_as_an_empty_batch(tmp_path,
                                                                        monkeypatch):
    """A batch cut before its transaction's COMMIT, then a read of just the COMMIT: an empty
    batch at the boundary follows (once), so a sink applying whole transactions need not
    wait for the next one; after a batch at a boundary, an empty read sends nothing."""
    ts = "2020-01-01T00:00:00.000Z"
    monkeypatch.setattr(ScriptedSource, "SCRIPT", [
        Batch([event(1, ts), event(2, ts)], 1, False), Batch([], 2, True), Batch([], 3, True),
        Batch([event(3, ts)], 4, True), Batch([], 5, True), Batch([event(4, ts)], 6, False),
        Batch([], 7, False), Batch([], 8, True)])
    loop, _ = make_loop(tmp_path, monkeypatch, ScriptedSource)
    monkeypatch.setattr(FakeLink, "acks", lambda self, timeout: self.sent[-1] if self.sent
                        else None)
    assert loop.run() == 0
    (link,) = FakeLink.instances
    assert link.frames == [(1, 2, False), (2, 0, True), (3, 1, True), (4, 1, False),
                           (5, 0, True)]
    assert loop.store.load() == 8


def test_lag_is_the_age_of_the_oldest_unconfirmed_event_under_steady_load(tmp_path,
                                                                        monkeypatch):
    loop, _ = make_loop(tmp_path, monkeypatch, lambda b, d, log, ref: None)
    link = FakeLink("sock", "b")
    old = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 100))
    new = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 2))
    loop.inflight.extend([(1, 1, old), (None, 2, None), (2, 3, new)])
    assert loop.oldest_unconfirmed_ts == old
    link.confirm_up_to = 1                   # batch 1 confirmed, batch 2 still in flight
    loop._take_acks(link, 0)
    assert loop.oldest_unconfirmed_ts == new  # not the first batch's time for ever
    assert 1 <= runner._age(loop.oldest_unconfirmed_ts) < 60
    link.confirm_up_to = 2
    loop._take_acks(link, 0)
    assert loop.oldest_unconfirmed_ts is None and runner._age(None) == 0.0


# ----------------------------------------------------------------------------- MongoDB

@pytest.mark.parametrize("make,fatal,needle", [
    (lambda e: e.ServerSelectionTimeoutError("127.0.0.1:27017: [Errno 111] Connection refused"),
     False, "cannot reach MongoDB at db:27017"),
    (lambda e: e.AutoReconnect("connection closed"), False, "cannot reach MongoDB"),
    (lambda e: e.NetworkTimeout("timed out"), False, "cannot reach MongoDB"),
    (lambda e: e.OperationFailure("The server is in quiesce mode and will shut down", 91),
     False, "(code 91)"),
    (lambda e: e.OperationFailure("Authentication failed.", 18), True, "rejected the credentials"),
    (lambda e: e.OperationFailure("not authorized on shop", 13), True, "grant it the role"),
])
def test_mongodb_errors_are_classified(make, fatal, needle):
    from pymongo import errors as pymongo_errors

    from lapidus.workers.mongo import errors as mongo_errors
    from lapidus.workers.mongo.settings import MongoSettings

    settings = MongoSettings.from_options("cms", {"host": "db", "user": "u", "password": "pw"})
    error = mongo_errors.describe(settings, make(pymongo_errors), "reading changes")
    assert error.fatal is fatal and needle in str(error), error


class IdleSource(Source):
    """Nothing to read: each read advances the fake clock by its whole wait; the test's
    ``script`` may change the source's status at given reads, and stops the loop."""

    def __init__(self, backend, state_dir, log, loop_ref, clock, script):
        super().__init__(backend, state_dir, log)
        self.loop_ref, self.clock, self.script = loop_ref, clock, script
        self.reads = 0
        self.spool_bytes = 0
        self.waits: List[float] = []

    def open(self, checkpoint):
        pass

    def read(self, max_events, timeout):
        self.reads += 1
        self.waits.append(timeout)
        self.clock[0] += timeout
        self.script(self, self.loop_ref[0])
        return Batch()

    def status(self):
        return {"spool_bytes": self.spool_bytes}

    def close(self):
        pass


def test_an_idle_worker_waits_a_status_interval_and_repeats_unchanged_stats_rarely(
        tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])

    def script(source, loop):
        if source.reads == 30:
            source.spool_bytes = 4096          # a figure changes: reported at the next stats
        if source.reads == 60:
            loop.request_stop()

    factory = made_by(IdleSource, clock, script)
    loop, reports = make_loop(tmp_path, monkeypatch, factory)
    loop.quiet_report_every = 10.0
    assert loop.run() == 0
    assert set(factory.made.waits) == {runner.READ_WAIT_IDLE}     # nothing in flight: no busy wake
    stats = [f for kind, f in reports if kind == "stats"]
    # 60 idle seconds: the first report, one per 10 quiet seconds, and the change at once
    assert 7 <= len(stats) <= 8, len(stats)
    assert [f["spool_bytes"] for f in stats].count(4096) >= 1
    changed_at = next(i for i, f in enumerate(stats) if f["spool_bytes"] == 4096)
    assert stats[changed_at - 1]["spool_bytes"] == 0
    # no run: said as such, so a run an earlier worker process reported does not linger in
    # the supervisor's copy of the fields
    assert all("snapshot" in f and f["snapshot"] is None for f in stats)


def test_the_quiet_report_interval_stays_well_inside_the_heartbeat_timeout(tmp_path):
    backend = SimpleNamespace(name="b", type="fake", options={})
    status = SimpleNamespace(send=lambda message: None)
    short = runner.WorkerLoop(backend, tmp_path, "sock", status, LOG, heartbeat_timeout=3.0)
    default = runner.WorkerLoop(backend, tmp_path, "sock", status, LOG)
    assert short.quiet_report_every == runner.STATUS_EVERY
    assert default.quiet_report_every == runner.QUIET_REPORT_EVERY


class SleepySource(IdleSource):
    """An idle source that watches the wake-up pipe itself (``idle_wait`` unbounded), as the
    PostgreSQL and MySQL sources do; every read returns the same position, as MySQL's do."""

    def idle_wait(self):
        return math.inf

    def read(self, max_events, timeout):
        super().read(max_events, timeout)
        return Batch([], {"file": "binlog.000001", "pos": 4})


def test_an_idle_worker_that_can_sleep_wakes_only_for_its_keep_alive(tmp_path, monkeypatch):
    """Nothing in flight, nothing read: after the first look the loop sleeps until the next
    keep-alive report, looks at nothing in between, and saves an unchanged position once."""
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    polls = []

    def script(source, loop):
        if clock[0] >= 1060.0:
            loop.request_stop()

    factory = made_by(SleepySource, clock, script)
    loop, reports = make_loop(tmp_path, monkeypatch, factory)
    monkeypatch.setattr(loop.backfills, "poll", lambda source, saved: polls.append(clock[0]))
    saves = []
    save = loop.store.save
    monkeypatch.setattr(loop.store, "save", lambda value: (saves.append(value), save(value)))
    loop.quiet_report_every = 10.0
    assert loop.run() == 0
    stats = [f for kind, f in reports if kind == "stats"]
    # 60 idle seconds: a handful of reads, not sixty; one look per keep-alive
    assert factory.made.reads <= 10, factory.made.waits
    assert max(factory.made.waits) == pytest.approx(10.0)
    assert 6 <= len(stats) <= 7 and len(polls) == len(stats), (len(stats), polls)
    assert saves == [{"file": "binlog.000001", "pos": 4}]     # once, not at every read


def test_a_signal_makes_an_idle_worker_look_at_its_backfill_requests_at_once(tmp_path,
                                                                             monkeypatch):
    """The supervisor's WAKE_SIGNAL after queueing a backfill: the pipe becomes readable, the
    source's read returns, and the loop polls the request files right away."""
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    wake = Wakeup()
    polls = []

    def script(source, loop):
        if source.reads == 3:
            os.write(wake._write_fd, b"\x0a")     # what set_wakeup_fd writes for a signal
            source.woken_at = clock[0]
        if source.reads == 6:
            loop.request_stop()

    factory = made_by(SleepySource, clock, script)
    loop, _ = make_loop(tmp_path, monkeypatch, factory)
    loop.wake = wake
    monkeypatch.setattr(loop.backfills, "poll", lambda source, saved: polls.append(clock[0]))
    loop.quiet_report_every = 10.0
    assert loop.run() == 0
    assert factory.made.wake_fd == wake.fd
    assert factory.made.woken_at in polls
    assert not wake.drain()


def test_the_wake_up_pipe_receives_the_worker_s_signals():
    """In a child process (the handlers and the wake-up fd are process-wide): the wake
    signal and SIGTERM each leave a byte, and the wake signal no longer ends the process."""
    import multiprocessing

    def child(conn):
        wake = Wakeup()
        signal.signal(signal.SIGTERM, lambda *_: None)
        wake.install()
        os.kill(os.getpid(), WAKE_SIGNAL)
        first = wake.drain()
        again = wake.drain()
        os.kill(os.getpid(), signal.SIGTERM)
        conn.send((first, again, wake.drain()))

    parent, child_end = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(target=child, args=(child_end,))
    process.start()
    assert parent.poll(10), "the child did not answer"
    assert parent.recv() == (True, False, True)
    process.join(10)
    assert process.exitcode == 0


def test_keep_alives_fall_on_a_grid_common_to_every_child():
    """Idle children report their unchanged stats together (the supervisor wakes once for
    many), and never later than the interval after their last report."""
    assert runner.next_keep_alive(1003.2, 10.0) == 1010.0
    assert runner.next_keep_alive(1010.0, 10.0) == 1020.0
    schedule = runner.StatusSchedule(10.0, 1000.0, every_second=False)
    figures = (0, None, 0)
    assert schedule.stepped(1001.0, figures, {"events": 0})          # the first report
    assert not schedule.stepped(1003.0, figures, {"events": 0})      # unchanged
    assert schedule.stepped(1003.5, figures, {"events": 1})          # changed: at once
    assert schedule.next_due(figures) == 1010.0                      # not 1013.5
    assert schedule.stepped(1010.0, figures, {"events": 1})          # the keep-alive
