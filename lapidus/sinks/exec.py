"""The exec sink: pipe every event, as one JSON line, into the standard input of a command.

The original Lapidus's "piping line-delimited JSON to other processes".  Runs in the dispatcher
process, inside its asyncio loop; one command per backend (``shared = False``), started when
the backend's first batch comes.  Its environment holds only what the configuration names
(:mod:`.exec_env`): ``PATH``, ``HOME``, ``LANG``, ``LC_*``, the ``pass_env`` names, the ``env``
values and ``LAPIDUS_BACKEND``; never the rest of Lapidus's environment, which may hold secrets.

Contract: :meth:`ExecSink.send` returns once the batch's lines are written into the pipe
(asyncio's buffer drained to the kernel: the write buffer limit is 0, so ``drain()`` means
everything was written).  When the command exits (or cannot be started) it is started again
after a backoff (``restart_backoff`` seconds, doubling up to 30 s, reset once a run lasted
10 s) and the batch that was not written is written again, whole, to the new process.  Known
limit: lines already confirmed but still in the pipe buffer (at most 64 KiB) when the command
dies are lost to it; a consumer that must not lose any should deduplicate by ``id`` and ask for
replays from its own checkpoint (or use NATS JetStream).

The command's standard error goes to Lapidus's log line by line at info, with the backend
name; its standard output at debug (a consumer that echoes its input would otherwise copy row
data into the journal).  Neither may reach Lapidus's own standard output, the event stream of
``--stdout``.  On close, standard input is closed (end of input), then TERM, then KILL to its
process group.  :meth:`ExecSink.health` says whether the command runs, since when it does not,
and how it last ended, for ``lapidusctl status`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .. import logs
from ..backoff import Backoff
from ..events import Record
from ..procutil import die_with_parent, restore_inherited_umask
from ..settings import suggest
from . import exec_env
from .base import Sink, SinkError

OPTIONS = ("command", "restart_backoff", "pass_env", "env")
MAX_BACKOFF = 30.0
STABLE_AFTER = 10.0       # a run this long resets the backoff
STOP_GRACE = 5.0
LINE_LIMIT = 1 << 20      # longer output lines are logged in pieces


def argv_of(command: Any) -> List[str]:
    """A list is the argv itself; a string runs through ``/bin/sh -c``."""
    return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)


def describe_exit(code: Optional[int], last_stderr: str = "") -> str:
    """``exited with code 3``, ``killed by SIGKILL``, with its last line of standard error."""
    if code is None:
        text = "stopped"
    elif code < 0:
        try:
            text = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            text = f"killed by signal {-code}"
    else:
        text = f"exited with code {code}"
    return f"{text} (last stderr: {last_stderr})" if last_stderr else text


class ExecSink(Sink):
    shared = False

    def __init__(self, options: Mapping[str, Any], backend: str):
        super().__init__(options, backend)
        problems = self.validate(options)
        if problems:
            raise ValueError("invalid exec plugin options: " + "; ".join(
                f"{k}: {m}" for k, m in problems))
        self.argv = argv_of(self.options["command"])
        self.env = exec_env.command_environment(backend, list(self.options.get("pass_env", ())),
                                                dict(self.options.get("env", {})))
        initial = float(self.options.get("restart_backoff", 1.0))
        # No jitter: one command per backend, nothing to spread out; the delays stay exact.
        self.backoff = Backoff(initial, max(MAX_BACKOFF, initial), jitter=0.0)
        self.log = logs.get_logger(backend=backend, sink="exec")
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.started_at = 0.0
        self.next_start = 0.0
        self.readers: List[asyncio.Task] = []
        # for health(): None until the first start attempt; then when the command stopped
        # running (None while it runs), how it last ended, and how often it was restarted
        self.down_since: Optional[float] = None
        self.last_error: Optional[str] = None
        self.last_stderr = ""
        self.restarts = 0

    @classmethod
    def validate(cls, options: Mapping[str, Any]) -> list:
        problems = []
        for key in options:
            if key not in OPTIONS:
                near = suggest(key, OPTIONS) if isinstance(key, str) else None
                hint = f' (did you mean "{near}"?)' if near else f" (expected {', '.join(OPTIONS)})"
                problems.append((key, f"unknown option for the exec plugin{hint}"))
        command = options.get("command")
        if command is None:
            problems.append(("command", "missing: the command to run, as a list of arguments "
                                        '(["/usr/local/bin/consume", "--flag"]) or a shell '
                                        'command string ("consume | tee log")'))
        elif isinstance(command, str):
            if not command.strip():
                problems.append(("command", "is empty"))
        elif not (isinstance(command, list) and command
                  and all(isinstance(a, str) for a in command)):
            problems.append(("command", "expected a non-empty list of strings or a string"))
        elif shutil.which(command[0]) is None:
            problems.append(("command[0]", f'"{command[0]}" is not an executable file (nor found '
                                           f"on PATH); give its full path"))
        backoff = options.get("restart_backoff")
        if backoff is not None and (isinstance(backoff, bool)
                                    or not isinstance(backoff, (int, float)) or backoff <= 0):
            problems.append(("restart_backoff", "expected a number of seconds greater than 0"))
        problems += exec_env.problems(options)
        return problems

    # -- the process -------------------------------------------------------------------------

    async def start(self) -> None:
        """Nothing yet: the command starts with the first batch (see :meth:`send`)."""

    async def _spawn(self) -> None:
        wait = self.next_start - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        parent = os.getpid()
        if self.down_since is None:
            self.down_since = time.monotonic()      # the first attempt: down until it runs
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.env, limit=LINE_LIMIT,
                start_new_session=True,
                # The command dies with the dispatcher, even under kill -9.
                preexec_fn=lambda: _in_child(parent))
        except OSError as exc:
            self._schedule_restart()
            self.last_error = f"cannot start {self.argv[0]!r}: {exc.strerror or exc}"
            raise SinkError(f"exec: {self.last_error}; check the command option "
                            f"(retrying)") from None
        self.down_since = None
        self.last_stderr = ""       # this run's, for describing how it ends
        # Limit 0: drain() returns only when asyncio has handed everything to the kernel.
        self.proc.stdin.transport.set_write_buffer_limits(high=0)
        self.started_at = time.monotonic()
        self.readers = [asyncio.create_task(self._log_lines(self.proc.stderr, "stderr")),
                        asyncio.create_task(self._log_lines(self.proc.stdout, "stdout"))]
        self.log.info("exec command started", pid=self.proc.pid, argv0=self.argv[0])

    def _schedule_restart(self) -> None:
        """The next start waits for the backoff: doubling per failed run, from
        ``restart_backoff`` up to 30 s, and from the start again after a run of 10 s."""
        ran = time.monotonic() - self.started_at if self.started_at else 0.0
        if ran >= STABLE_AFTER:
            self.backoff.reset()
        self.next_start = time.monotonic() + self.backoff.next()

    async def _log_lines(self, stream: asyncio.StreamReader, name: str) -> None:
        # stderr is the command's voice (info); stdout may echo row data (debug only)
        emit = self.log.info if name == "stderr" else self.log.debug
        while True:
            try:
                line = await stream.readline()
            except ValueError:
                # Longer than LINE_LIMIT: take what is buffered as one piece.
                line = await stream.read(LINE_LIMIT)
            if not line:
                return
            text = line.rstrip(b"\n").decode("utf-8", "replace")
            if name == "stderr" and text.strip():
                self.last_stderr = text[:200]
            emit("exec output", stream=name, line=text)

    async def _reap(self, reason: str) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        # asyncio's wait() returns only once every pipe of the process is closed; a stdin whose
        # reader died is not closed by itself, so without this wait() would hang.
        try:
            proc.stdin.close()
        except (OSError, RuntimeError):
            pass
        try:
            code = await asyncio.wait_for(proc.wait(), STOP_GRACE)
        except asyncio.TimeoutError:
            # stdin is broken but the process lingers: it cannot receive events any more.
            self._kill_group(proc, signal.SIGKILL)
            code = await proc.wait()
        await asyncio.gather(*self.readers, return_exceptions=True)
        self._schedule_restart()
        self.restarts += 1
        self.last_error = describe_exit(code, self.last_stderr)
        self.log.warning("exec command exited; restarting it and sending the unconfirmed "
                         "batch again", reason=reason, exit_code=code,
                         restart_in=round(max(0.0, self.next_start - time.monotonic()), 2))

    def _note_exit(self) -> None:
        """The command is seen to have ended (health() or the next batch): down from now.
        The description is renewed at each call: its last stderr line may still be on the
        way through the reader task when the exit is first seen."""
        if self.down_since is None:
            self.down_since = time.monotonic()
        self.last_error = describe_exit(self.proc.returncode, self.last_stderr)

    def health(self) -> Optional[Dict[str, Any]]:
        """``connected``: the command runs; ``down_seconds``: since when it does not;
        ``last_error``: how it last ended (or could not start); ``restarts``.  None before
        the first batch (the command has not been started yet)."""
        if self.proc is not None and self.proc.returncode is not None:
            self._note_exit()
        if self.proc is None and self.down_since is None and not self.restarts:
            return None
        running = self.proc is not None and self.proc.returncode is None
        down = None if running or self.down_since is None else time.monotonic() - self.down_since
        return {"connected": running,
                "down_seconds": None if down is None else round(down, 1),
                "last_error": self.last_error, "restarts": self.restarts,
                "pid": self.proc.pid if running else None}

    @staticmethod
    def _kill_group(proc: asyncio.subprocess.Process, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    # -- the sink contract -------------------------------------------------------------------

    async def send(self, records: Sequence[Record]) -> None:
        data = b"\n".join([r.data for r in records]) + b"\n"
        while True:
            if self.proc is not None and self.proc.returncode is not None:
                self._note_exit()
                await self._reap("the command exited")
            if self.proc is None:
                await self._spawn()
            stdin = self.proc.stdin
            try:
                stdin.write(data)
                await stdin.drain()
                if stdin.transport.is_closing():
                    # asyncio drops a write to a pipe it already saw closing without a word,
                    # and drain() can return before the loss reaches it (a subprocess pipe
                    # reports it through two loop callbacks).  Nothing yields between write()
                    # and here unless the pipe was closing at write(): the batch was not
                    # written, so it is not confirmed.
                    raise BrokenPipeError("its standard input is closed")
                return
            except (BrokenPipeError, ConnectionResetError) as exc:
                if self.down_since is None:
                    self.down_since = time.monotonic()
                await self._reap(f"writing to its standard input failed: {exc}")

    async def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), STOP_GRACE)
        except (asyncio.TimeoutError, BrokenPipeError, ConnectionResetError):
            self._kill_group(proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE)
            except asyncio.TimeoutError:
                self._kill_group(proc, signal.SIGKILL)
                await proc.wait()
        await asyncio.gather(*self.readers, return_exceptions=True)


def _in_child(parent: int) -> None:
    """Between fork and exec of the command: it dies with the dispatcher, even under kill -9,
    and creates files with the umask Lapidus was started with, not Lapidus's private one."""
    die_with_parent(signal.SIGTERM, parent)
    restore_inherited_umask()
