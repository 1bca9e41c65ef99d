"""Starting workers through the workers' fork server (:mod:`lapidus.workers.forkserver`).

Runs in the supervisor.  A worker forked by the supervisor would carry the supervisor's whole
image (configuration check, listeners, status page); forked by a lean server it carries only
what workers need, shared with the other workers.  The supervisor keeps what it had with a
direct child: the worker's pid, its exit code (from the sentinel, which turns readable when
the worker exits: the SIGCHLD goes to the server), its status pipe.

The server is multiprocessing's ``forkserver``: started at the first worker, started again
at the next worker after it died (every worker dies with it, PR_SET_PDEATHSIG, and is
restarted like any crashed worker), and gone when the supervisor is.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import sys
import time
import types
from typing import Iterable, Optional

import psutil

from ..workers.runner import server_preload, worker_main
from .handles import ChildHandle

SERVER_NAME = "lapidus:forker"      # set by lapidus.workers.forkserver
GONE_WITHIN = 2.0                   # seconds for a killed server to be seen dead


class WorkerForks:
    """Starts each worker as a child of the fork server."""

    def __init__(self, backend_types: Iterable[str], log):
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(server_preload(backend_types))
        self.log = log
        # the server last found; looked for again (a scan of all processes) only once it is
        # gone, not at every worker start
        self._server: Optional[psutil.Process] = None

    def start(self, handle: ChildHandle, args: tuple) -> bool:
        """STOPPED/BACKOFF -> STARTING; False, the handle in BACKOFF as after a crash, when
        the server could not fork it (it died in between: the next start makes a new one)."""
        self.kill_server_if_frozen()
        try:
            with _main_module_hidden():
                handle.spawn(self.ctx, worker_main, args)
        except (OSError, EOFError) as exc:
            handle.process = None
            handle.last_error = f"the workers' fork server failed: {exc}"
            handle.on_exit(None, time.monotonic())
            return False
        return True

    def kill_server_if_frozen(self) -> None:
        """A stopped (SIGSTOP) server would block the supervisor in its next fork request,
        and can report no worker's exit (called before a start, when a worker's status pipe
        closes, and when a worker is killed): kill it (its workers die with it and are restarted
        like after a crash, not counted as one), so that a new one is started."""
        server = self._server
        if server is None or not server.is_running():
            server = self._server = _server()
        if server is None:
            return
        try:
            if server.status() != psutil.STATUS_STOPPED:
                return
            self.log.warning("the workers' fork server is stopped (SIGSTOP); killing it, a new "
                             "one starts the workers again", pid=server.pid)
            server.send_signal(signal.SIGKILL)
            # seen dead (a zombie), not reaped: multiprocessing reaps it, and starts anew
            deadline = time.monotonic() + GONE_WITHIN
            while server.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
                time.sleep(0.01)
        except psutil.NoSuchProcess:
            pass


def _server() -> Optional[psutil.Process]:
    """The fork server, among this process's children."""
    for child in psutil.Process().children():
        try:
            if child.name() == SERVER_NAME:
                return child
        except psutil.NoSuchProcess:
            continue
    return None


@contextlib.contextmanager
def _main_module_hidden():
    """While a worker is started: the fork server would otherwise run the main script (the
    ``lapidus`` command, or a program using the Python API) again in the new worker, as
    multiprocessing does to give a child the main module's functions.  A worker runs
    :func:`worker_main` and needs nothing of it."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main
