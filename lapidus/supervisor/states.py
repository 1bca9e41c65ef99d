"""Process states of a supervised backend worker (after supervisord's model).

Stdlib only.  Edges, each written where it happens with a comment naming it:

    STOPPED  -> STARTING   spawn
    STARTING -> RUNNING    the worker reported READY (connected, position known)
    STARTING -> WAITING    the worker reported that its database is unreachable (it retries)
    RUNNING  -> WAITING    the same, after the connection was lost while streaming
    WAITING  -> RUNNING    the worker reported READY again
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
    WAITING = "WAITING"     # alive, retrying an unreachable database by itself; not a crash
    BACKOFF = "BACKOFF"
    STOPPING = "STOPPING"
    FATAL = "FATAL"


ALIVE = frozenset({State.STARTING, State.RUNNING, State.WAITING, State.STOPPING})
