"""RestartPolicy and the ChildHandle state machine, without real processes."""

from __future__ import annotations

import multiprocessing
import random

import pytest
import structlog

from lapidus.backoff import Backoff, RestartPolicy
from lapidus.supervisor.handles import ChildHandle
from lapidus.exitcodes import CHILD_ERROR as EXIT_ERROR, CHILD_FATAL as EXIT_FATAL, CHILD_OK as EXIT_OK
from lapidus.supervisor.states import State


class FixedRandom:
    """A ``random.Random`` stand-in whose ``random()`` always returns ``value``."""

    def __init__(self, value: float):
        self.value = value

    def random(self) -> float:
        return self.value


NO_JITTER = 0.5     # 0.8 + 0.4 * 0.5 == 1.0 exactly


def crashes(policy: RestartPolicy, *times: float) -> RestartPolicy:
    for now in times:
        policy.record_crash(now)
    return policy


# -- RestartPolicy -----------------------------------------------------------------------

def test_first_restart_waits_the_initial_delay():
    policy = crashes(RestartPolicy(initial=1.5, rng=FixedRandom(NO_JITTER)), 0.0)
    assert policy.delay() == 1.5


def test_delay_doubles_with_each_recent_crash():
    policy = RestartPolicy(max_restarts=10, initial=1.0, maximum=100.0,
                           rng=FixedRandom(NO_JITTER))
    delays = []
    for now in range(5):
        policy.record_crash(float(now))
        delays.append(policy.delay())
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_delay_is_capped_at_the_maximum():
    policy = crashes(RestartPolicy(max_restarts=100, initial=1.0, maximum=30.0,
                                   rng=FixedRandom(NO_JITTER)), *range(12))
    assert policy.delay() == 30.0


def test_jitter_bounds_are_plus_minus_20_percent():
    low = crashes(RestartPolicy(initial=10.0, rng=FixedRandom(0.0)), 0.0)
    assert low.delay() == pytest.approx(8.0)
    high = crashes(RestartPolicy(initial=10.0, rng=FixedRandom(0.999999)), 0.0)
    assert 11.99 < high.delay() < 12.0


def test_jittered_delays_vary_and_stay_within_20_percent():
    policy = crashes(RestartPolicy(max_restarts=10, initial=1.0, maximum=30.0,
                                   rng=random.Random(1234)), 0.0, 1.0, 2.0)
    delays = [policy.delay() for _ in range(500)]
    assert all(3.2 <= d <= 4.8 for d in delays)
    assert max(delays) - min(delays) > 1.0          # really jittered, not constant


def test_forked_processes_draw_other_jitter_than_their_parent():
    # the default jitter source is shared in a process and seeded again in a forked child:
    # a child must not retry in step with its parent or its siblings
    import os
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(writer, repr([Backoff().next() for _ in range(5)]).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = eval(os.read(reader, 4096))
    os.close(reader)
    os.close(writer)
    assert child != [Backoff().next() for _ in range(5)]


def test_crash_window_forgets_old_crashes():
    policy = crashes(RestartPolicy(max_restarts=5, window=60.0, initial=1.0,
                                   rng=FixedRandom(NO_JITTER)), 0.0, 10.0, 20.0)
    assert policy.delay() == 4.0
    policy.record_crash(100.0)
    assert list(policy.crashes) == [100.0]
    assert policy.delay() == 1.0


def test_crashes_inside_the_window_are_all_kept():
    policy = crashes(RestartPolicy(max_restarts=10, window=60.0), 0.0, 30.0, 59.0)
    assert list(policy.crashes) == [0.0, 30.0, 59.0]


def test_exhausted_after_max_restarts_inside_the_window():
    policy = RestartPolicy(max_restarts=3, window=60.0)
    policy.record_crash(0.0)
    policy.record_crash(1.0)
    assert not policy.exhausted()
    policy.record_crash(2.0)
    assert policy.exhausted()


def test_crashes_spread_wider_than_the_window_never_exhaust():
    policy = RestartPolicy(max_restarts=3, window=60.0)
    for now in range(0, 1000, 61):
        policy.record_crash(float(now))
        assert not policy.exhausted()


def test_reset_forgets_every_crash():
    policy = crashes(RestartPolicy(max_restarts=2), 0.0, 1.0)
    assert policy.exhausted()
    policy.reset()
    assert not policy.exhausted()
    assert len(policy.crashes) == 0


# -- ChildHandle.on_exit -----------------------------------------------------------------

def make_handle(state: State, policy: RestartPolicy = None) -> ChildHandle:
    handle = ChildHandle("shop", policy or RestartPolicy(rng=FixedRandom(NO_JITTER)),
                         structlog.get_logger())
    handle.state = state
    return handle


def test_transition_running_to_backoff_on_crash():
    handle = make_handle(State.RUNNING, RestartPolicy(initial=2.0, rng=FixedRandom(NO_JITTER)))
    handle.on_exit(EXIT_ERROR, now=100.0)
    assert handle.state == State.BACKOFF
    assert handle.next_start == 102.0
    assert handle.restarts == 1
    assert list(handle.policy.crashes) == [100.0]
    assert handle.process is None


def test_transition_starting_to_backoff_on_death_before_ready():
    handle = make_handle(State.STARTING)
    handle.on_exit(EXIT_ERROR, now=5.0)
    assert handle.state == State.BACKOFF
    assert handle.restarts == 1


def test_backoff_delays_grow_over_repeated_crashes():
    handle = make_handle(State.RUNNING, RestartPolicy(max_restarts=10, initial=1.0,
                                                      rng=FixedRandom(NO_JITTER)))
    waits = []
    for now in (0.0, 10.0, 20.0):
        handle.state = State.RUNNING
        handle.on_exit(EXIT_ERROR, now=now)
        waits.append(handle.next_start - now)
    assert waits == [1.0, 2.0, 4.0]
    assert handle.restarts == 3


def test_transition_starting_to_fatal_on_exit_code_3():
    handle = make_handle(State.STARTING)
    handle.on_exit(EXIT_FATAL, now=1.0)
    assert handle.state == State.FATAL
    assert handle.restarts == 0
    assert len(handle.policy.crashes) == 0


def test_transition_running_to_fatal_on_exit_code_3():
    handle = make_handle(State.RUNNING)
    handle.on_exit(EXIT_FATAL, now=1.0)
    assert handle.state == State.FATAL


def test_transition_starting_to_fatal_on_reported_fatal_error():
    handle = make_handle(State.STARTING)
    handle.fatal_reported = True
    handle.last_error = 'backend "shop": database "shop" does not exist'
    handle.on_exit(EXIT_ERROR, now=1.0)
    assert handle.state == State.FATAL
    assert handle.last_error == 'backend "shop": database "shop" does not exist'


def test_transition_backoff_to_fatal_when_restarts_are_exhausted():
    handle = make_handle(State.RUNNING, RestartPolicy(max_restarts=3, window=60.0,
                                                      rng=FixedRandom(NO_JITTER)))
    states = []
    for now in (0.0, 5.0, 10.0):
        handle.state = State.STARTING          # the arbiter respawned it after the backoff
        handle.on_exit(EXIT_ERROR, now=now)
        states.append(handle.state)
    assert states == [State.BACKOFF, State.BACKOFF, State.FATAL]
    assert handle.restarts == 2


def test_crashes_outside_the_window_keep_restarting():
    handle = make_handle(State.RUNNING, RestartPolicy(max_restarts=2, window=60.0,
                                                      rng=FixedRandom(NO_JITTER)))
    for now in (0.0, 100.0, 200.0, 300.0):
        handle.state = State.RUNNING
        handle.on_exit(EXIT_ERROR, now=now)
        assert handle.state == State.BACKOFF


def test_transition_stopping_to_stopped():
    handle = make_handle(State.STOPPING)
    handle.on_exit(-15, now=1.0)
    assert handle.state == State.STOPPED
    assert handle.restarts == 0
    assert len(handle.policy.crashes) == 0


def test_transition_stopping_to_stopped_even_with_fatal_exit_code():
    handle = make_handle(State.STOPPING)
    handle.on_exit(EXIT_FATAL, now=1.0)
    assert handle.state == State.STOPPED


def test_death_by_signal_is_recorded_as_last_error():
    handle = make_handle(State.RUNNING)
    handle.on_exit(-9, now=1.0)
    assert handle.state == State.BACKOFF
    assert handle.last_error == "killed by signal 9"


def test_clean_exit_of_a_running_worker_counts_as_a_crash():
    handle = make_handle(State.RUNNING)
    handle.on_exit(EXIT_OK, now=1.0)
    assert handle.state == State.BACKOFF
    assert handle.last_error == "exited unexpectedly"


# -- ChildHandle.receive with a real pipe ------------------------------------------------

@pytest.fixture
def pipe():
    reader, writer = multiprocessing.Pipe(duplex=False)
    yield reader, writer
    for conn in (reader, writer):
        conn.close()


def test_transition_starting_to_running_on_ready(pipe):
    reader, writer = pipe
    handle = make_handle(State.STARTING)
    handle.conn = reader
    writer.send(("ready", {"position": "0/21C6768"}))
    handle.receive()
    assert handle.state == State.RUNNING
    assert handle.info["position"] == "0/21C6768"


def test_alive_without_ready_stays_starting(pipe):
    reader, writer = pipe
    handle = make_handle(State.STARTING)
    handle.conn = reader
    writer.send(("stats", {"events": 0}))
    handle.receive()
    assert handle.state == State.STARTING
    assert handle.info == {"events": 0}


@pytest.mark.parametrize("state", [State.STOPPING, State.RUNNING])
def test_ready_does_not_change_other_states(pipe, state):
    reader, writer = pipe
    handle = make_handle(state)
    handle.conn = reader
    writer.send(("ready", {"position": "0/1"}))
    handle.receive()
    assert handle.state == state


def test_stats_update_the_status_info(pipe):
    reader, writer = pipe
    handle = make_handle(State.RUNNING)
    handle.conn = reader
    writer.send(("stats", {"events": 10, "inflight": 1}))
    writer.send(("stats", {"events": 25}))
    handle.receive()
    assert handle.info == {"events": 25, "inflight": 1}
    assert handle.snapshot()["events"] == 25


def test_fatal_error_then_exit_code_1_is_fatal(pipe):
    reader, writer = pipe
    handle = make_handle(State.STARTING)
    handle.conn = reader
    writer.send(("error", {"message": "wrong password", "fatal": True}))
    handle.receive()
    assert handle.fatal_reported
    handle.on_exit(EXIT_ERROR, now=1.0)
    assert handle.state == State.FATAL
    assert handle.last_error == "wrong password"


def test_fatal_error_still_in_the_pipe_at_exit_is_read_first(pipe):
    reader, writer = pipe
    handle = make_handle(State.RUNNING)
    handle.conn = reader
    writer.send(("error", {"message": "slot was dropped", "fatal": True}))
    handle.on_exit(EXIT_ERROR, now=1.0)
    assert handle.state == State.FATAL
    assert handle.last_error == "slot was dropped"
    assert handle.conn is None


def test_non_fatal_error_then_exit_backs_off(pipe):
    reader, writer = pipe
    handle = make_handle(State.RUNNING)
    handle.conn = reader
    writer.send(("error", {"message": "cannot reach PostgreSQL", "fatal": False}))
    handle.on_exit(EXIT_ERROR, now=1.0)
    assert handle.state == State.BACKOFF
    assert handle.last_error == "cannot reach PostgreSQL"


def test_receive_drops_the_pipe_when_the_child_closed_it(pipe):
    reader, writer = pipe
    handle = make_handle(State.RUNNING)
    handle.conn = reader
    writer.send(("stats", {"events": 1}))
    writer.close()
    handle.receive()
    assert handle.info == {"events": 1}
    assert handle.conn is None
    assert handle.state == State.RUNNING
