"""The workers' fork server: a lean process that forks every worker.

Runs in the fork server only (multiprocessing's ``forkserver``, a fresh interpreter the
supervisor starts at its first worker and that exits with the supervisor): the server imports
this module, and the source modules of the configured backend types
(:func:`lapidus.workers.runner.server_preload`), before it forks a worker.  A worker so shares
what every worker needs and carries nothing else: not the supervisor's configuration check,
HTTP and control servers, nor the dispatcher's sinks, which a worker forked from the
supervisor would map as its own resident memory (docs/dev/benchmarks.md, Density).

Never import it in the supervisor: importing it names the importing process.
"""

from __future__ import annotations

import gc
import os
import signal

from ..procutil import set_process_name
from . import runner  # noqa: F401  (what every worker runs: loaded once, shared by all)

#: The pid of the fork server, every worker's parent (the worker dies with it, and the server
#: exits when the supervisor is gone).
SERVER_PID = os.getpid()

set_process_name("lapidus:forker")
# A SIGTERM or SIGHUP to the process group (a terminal, a `kill -- -PGID`) is for the
# supervisor, which stops the workers in order or reloads, and must not end the server: its
# death would SIGKILL every worker (PR_SET_PDEATHSIG) in the middle of its orderly stop.  The
# server exits once the supervisor is gone.  (A worker sets its own SIGTERM handler at start
# and, as before, ignores SIGHUP.)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
# SIGTERM is also blocked, and a worker inherits it blocked: a SIGTERM sent before the worker's
# handler is in place (the supervisor stops a worker it has just started: a hand-over, a
# reload, a restart) waits as pending, where an ignored one would be dropped and the stop end
# in a SIGKILL after stop_timeout.  The worker unblocks it once its handler is set
# (runner.take_signals).
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

# Imported last (after the source modules): what is loaded now stays out of every garbage
# collection, in the server and in the workers, whose collections would otherwise write to
# these objects' pages and make each worker's copy of them its own.
gc.collect()
gc.freeze()
