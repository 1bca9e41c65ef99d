"""The supervisor loop's sleep: it wakes when something falls due, not on a fixed tick, and
looks at every child only after a SIGCHLD.  An Arbiter without processes (fake ones)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from lapidus.config import parse_config
from lapidus.supervisor import arbiter as arbiter_module
from lapidus.supervisor.arbiter import Arbiter
from lapidus.supervisor.notify import Notifier
from lapidus.supervisor.states import State


class FakeProcess:
    """Alive until told otherwise; counts the looks at it (each one a waitpid)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.looks = 0
        self.exitcode = None

    def is_alive(self) -> bool:
        self.looks += 1
        return self.exitcode is None


@pytest.fixture
def arbiter(tmp_path):
    config = parse_config({
        "state_dir": str(tmp_path / "state"), "control": {"socket": str(tmp_path / "ctl")},
        "supervisor": {"heartbeat_timeout": 60},
        "backends": [{"type": "postgresql", "name": f"pg{i}", "database": "db"}
                     for i in range(3)]}, source=str(tmp_path / "lapidus.toml"), env={})
    arb = Arbiter(config)
    now = time.monotonic()
    for i, handle in enumerate(arb._children()):
        handle.process = FakeProcess(100000 + i)
        handle.state = State.RUNNING
        handle.last_report = now
    arb.reap_at = now + arbiter_module.REAP_EVERY
    yield arb
    os.rmdir(arb.socket_dir)


def test_an_idle_supervisor_sleeps_until_the_next_deadline_not_a_tick(arbiter):
    """Every child reported just now: nothing is due before the last-resort bound."""
    assert arbiter._timeout() == pytest.approx(arbiter_module.LONGEST_SLEEP, abs=0.1)


def test_a_child_about_to_miss_its_heartbeat_wakes_the_loop_in_time(arbiter):
    quiet = arbiter.workers["pg1"]
    quiet.last_report = time.monotonic() - 59.0       # heartbeat_timeout 60
    assert 0.5 < arbiter._timeout() <= 1.0


def test_the_systemd_watchdog_is_pinged_in_time():
    notifier = Notifier({"NOTIFY_SOCKET": "/nonexistent", "WATCHDOG_USEC": "4000000"})
    assert notifier.next_ping() == 2.0               # never pinged: at once
    notifier.watchdog()
    assert notifier.next_ping() == pytest.approx(time.monotonic() + 2.0, abs=0.1)
    assert Notifier({}).next_ping() is None


def test_children_are_looked_at_after_a_sigchld_not_at_every_wake_up(arbiter):
    processes = [h.process for h in arbiter._children()]
    for _ in range(5):
        arbiter._handle_signals()
        arbiter._reap_due()
    assert [p.looks for p in processes] == [0] * len(processes)
    gone = arbiter.workers["pg0"]
    gone.process.exitcode = 1
    arbiter.signals.append(signal.SIGCHLD)
    arbiter._handle_signals()
    arbiter._reap_due()
    assert all(p.looks == 1 for p in processes)
    assert gone.process is None and gone.state == State.BACKOFF


def test_a_state_dir_that_cannot_be_made_at_start_is_a_clear_start_failure(tmp_path):
    """What lapidus -t could not foresee (the disk changed since): no traceback, the reason
    and the fix (the CLI prints StartFailed and exits 1)."""
    config = parse_config({
        "state_dir": "/proc/lapidus-state", "control": {"socket": str(tmp_path / "ctl")},
        "backends": [{"type": "postgresql", "name": "pg", "database": "db"}]},
        source=str(tmp_path / "lapidus.toml"), env={})
    arb = Arbiter(config)
    try:
        with pytest.raises(arbiter_module.StartFailed,
                           match=r"state_dir = '/proc/lapidus-state': cannot create it or its "
                                 r"lock file \(.+\); set state_dir to a directory this user "
                                 r"may write"):
            arb._lock_state_dir()
    finally:
        os.rmdir(arb.socket_dir)
