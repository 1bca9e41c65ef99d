"""A worker forked by the real fork server (lapidus/workers/forkserver.py) gets a SIGTERM sent
before its handlers are set: the supervisor stops a worker it has just started (a hand-over in
cluster mode, a reload, a restart).  The stop must reach the worker's handler once it is set,
not be dropped and end in a SIGKILL at ``stop_timeout``.

The real supervisor meets it in cluster mode when a node hands a backend over as its worker
starts (a node that took every lease before the other node's record was seen); there it cannot
be timed from outside, so this test makes the window wide with the real fork server.
"""

from __future__ import annotations

import os
import signal
import time

from lapidus import logs
from lapidus.supervisor.worker_forks import WorkerForks, _main_module_hidden
from lapidus.workers import runner
from lapidus.workers.wakeup import Wakeup

REACHED = 0
DROPPED = 3


def stopped_before_its_handlers(channel) -> None:
    """Runs in a worker forked by the fork server: says its pid, waits until the test has sent
    it SIGTERM, sets its handlers as worker_main does, and exits REACHED when the stop came
    to the handler."""
    channel.send(os.getpid())
    channel.recv()
    stops = []
    runner.take_signals(lambda *_: stops.append(True), Wakeup())
    deadline = time.monotonic() + 5
    while not stops and time.monotonic() < deadline:
        time.sleep(0.001)       # Python runs a handler between two bytecodes of the main thread
    os._exit(REACHED if stops else DROPPED)


def test_a_sigterm_before_the_workers_handlers_reaches_them_once_they_are_set():
    forks = WorkerForks(["mysql"], logs.get_logger())
    ours, theirs = forks.ctx.Pipe()
    with _main_module_hidden():
        worker = forks.ctx.Process(target=stopped_before_its_handlers, args=(theirs,))
        worker.start()
    theirs.close()
    try:
        pid = ours.recv()
        os.kill(pid, signal.SIGTERM)
        ours.send("sent")
        worker.join(20)
        assert worker.exitcode == REACHED, {DROPPED: "the SIGTERM was dropped",
                                            -signal.SIGTERM: "the SIGTERM killed the worker "
                                            "before its handler was set"}.get(worker.exitcode,
                                                                              worker.exitcode)
    finally:
        if worker.exitcode is None:
            worker.kill()
            worker.join(5)
