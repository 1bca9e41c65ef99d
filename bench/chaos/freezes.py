"""Freezing a process: ``kill -STOP``, a while, ``kill -CONT``; frozen, not dead.

A frozen process keeps its sockets, pipes and locks; it only stops answering.  That is what a
wedged worker looks like to the supervisor (no heartbeat), or a supervisor to its children and
to ``lapidusctl``.  The length is drawn around the supervisor's ``heartbeat_timeout``: half of
the freezes end before it (the process must simply go on), half after it (a frozen worker must
be killed and replaced; a frozen dispatcher or supervisor must not leave anything stuck).
"""

from __future__ import annotations

import os
import random
import signal

import psutil

from .waiting import hold, wait_for


def freeze_length(rng: random.Random, heartbeat_timeout: float) -> float:
    """Seconds to stay frozen: shorter than ``heartbeat_timeout`` or up to twice as long,
    each half of the time."""
    if rng.random() < 0.5:
        return rng.uniform(0.3, 0.7) * heartbeat_timeout
    return rng.uniform(1.3, 2.0) * heartbeat_timeout


def is_frozen(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def freeze(pid: int, seconds: float) -> bool:
    """SIGSTOP ``pid``, wait until the kernel shows it stopped, hold ``seconds``, SIGCONT (in
    ``finally``: a failed harness never leaves a process frozen).  Returns whether the process
    still existed when it was continued (False: someone killed it meanwhile)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: is_frozen(pid) or not psutil.pid_exists(pid), 5,
                 f"process {pid} to be stopped")
        hold(seconds)                     # the freeze's length
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
            existed = True
        except ProcessLookupError:
            existed = False
    if existed:
        try:
            existed = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            existed = False
    return existed
