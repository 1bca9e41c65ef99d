"""Process helpers shared by the supervisor and the workers (no imports from either).

* :func:`die_with_parent` makes the kernel kill a child when its parent dies, so a
  ``kill -9`` of the supervisor never leaves a worker or a ``pg_recvlogical`` holding a slot.
* :func:`signal_tree` signals a process and all its descendants, without reaping any.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import stat
from typing import Optional

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def set_process_name(name: str) -> None:
    """Name this process for ps/top/psutil (the kernel keeps the first 15 bytes)."""
    _c().prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def die_with_parent(sig: int = signal.SIGKILL, expected_parent: Optional[int] = None) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits.

    Call it in the child right after fork.  If the parent already died between fork and this
    call (the classic race), exit at once.
    """
    _c().prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def tune_gc_for_throughput() -> None:
    """Collect garbage less often in the event pipeline (children, after fork).

    Events are short-lived dicts without reference cycles; the default threshold (700
    allocations) runs a collection every few events.  Objects alive at fork time (modules,
    configuration) are frozen out of every collection.
    """
    import gc
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def signal_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid`` and all its descendants, children first; never waits.

    Waiting is left to whoever reaps ``pid`` (for the supervisor's children, multiprocessing's
    own poll in :meth:`ChildHandle.exited`): a ``waitpid`` here would take the exit status
    that the handle needs to learn that its child died.
    """
    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


PRIVATE_UMASK = 0o077
inherited_umask = None   # the umask Lapidus was started with, for the commands it runs


def keep_files_private(state_dir) -> None:
    """Make what Lapidus writes readable by its own user only: umask 077 for this process and
    everything it forks (checkpoints, spool segments written by pg_recvlogical, dead letters,
    logs of children: files 0600, folders 0700), and the same modes for what an earlier version
    left under ``state_dir``.  Runs in the supervisor before it forks anything; the exec sink
    gives its command back :data:`inherited_umask` (the command's files are its own business).
    """
    global inherited_umask
    previous = os.umask(PRIVATE_UMASK)
    if inherited_umask is None:
        inherited_umask = previous
    for root, dirs, files in os.walk(state_dir):
        for name, mode in [(d, 0o700) for d in dirs] + [(f, 0o600) for f in files]:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            # symlinks (the spool's "active") have no mode of their own; sockets keep theirs
            if stat.S_ISLNK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                continue
            if stat.S_IMODE(st.st_mode) & 0o077:
                try:
                    os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
                except OSError:
                    pass
    try:
        os.chmod(state_dir, stat.S_IMODE(os.stat(state_dir).st_mode) & 0o700)
    except OSError:
        pass


def restore_inherited_umask() -> None:
    """In a command Lapidus starts for the user (exec sink), between fork and exec."""
    if inherited_umask is not None:
        os.umask(inherited_umask)


def run_profiled(name: str, function, *args):
    """``function(*args)``; with ``LAPIDUS_PROFILE_DIR`` set, under cProfile, the statistics
    written to ``<dir>/<name>-<pid>.prof`` when it returns (for ``python -m pstats``).

    A developer's switch, for finding where a worker or the dispatcher spends its time in a
    benchmark (docs/dev/benchmarks.md); cProfile roughly doubles the cost of Python calls.
    """
    directory = os.environ.get("LAPIDUS_PROFILE_DIR")
    if not directory:
        return function(*args)
    import cProfile
    profile = cProfile.Profile()
    try:
        return profile.runcall(function, *args)
    finally:
        profile.dump_stats(os.path.join(directory, f"{name}-{os.getpid()}.prof"))
