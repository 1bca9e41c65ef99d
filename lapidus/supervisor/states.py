"""Process states of a supervised backend worker (after supervisord's model).

Stdlib only.  Edges, each written where it happens with a comment naming it:

    STOPPED  -> STARTING   spawn
    STARTING -> RUNNING    the worker reported READY (connected, position known)
    STARTING -> BACKOFF    died before READY
    RUNNING  -> BACKOFF    died
    BACKOFF  -> STARTING   backoff delay elapsed
    BACKOFF  -> FATAL      too many restarts inside the window, or a fatal error
    *        -> STOPPING   stop requested
    STOPPING -> STOPPED    exited
"""

from __future__ import annotations

import enum


class State(str, enum.Enum):
    STOPPED = "STOPPED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    BACKOFF = "BACKOFF"
    STOPPING = "STOPPING"
    FATAL = "FATAL"


ALIVE = frozenset({State.STARTING, State.RUNNING, State.STOPPING})

# Worker exit codes (set in lapidus.workers.runner)
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_FATAL = 3
