"""The ``lapidus`` process under test: start, find its processes, kill them, restart it.

The supervisor runs in its own process group (``lapidus -c CONFIG``); its log (JSON lines on
standard error) is appended to one file across restarts.  After a ``kill -9`` of the supervisor
its children must die by themselves (PR_SET_PDEATHSIG); the harness checks that before it
starts Lapidus again on the same state directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import psutil

from .waiting import ChaosTimeout, wait_for



def stop_group(proc: subprocess.Popen, timeout: float) -> Optional[int]:
    """SIGTERM a Lapidus started in its own session, wait up to ``timeout`` seconds, then
    SIGKILL whatever is left of its process group; returns the exit status (None when it had
    to be killed).  Also used by the integration tests' Lapidus fixture."""
    try:
        group = os.getpgid(proc.pid)
    except ProcessLookupError:
        group = None
    code = proc.poll()
    if code is None:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
    if group is not None:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
    return code

class LapidusProcess:
    def __init__(self, config: dict, workdir: Path):
        self.workdir = workdir
        self.config = config
        self.config_path = workdir / "lapidus.json"
        self.write_config(config)
        self.log_path = workdir / "lapidus.log"
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0
        self._log_offset = 0        # where the current run's log begins

    # -- lifecycle -------------------------------------------------------------------------

    def write_config(self, config: dict) -> None:
        """Replace the configuration file whole (temp file and rename: a reload never reads
        half a file); the next start or reload uses it."""
        self.config = config
        temp = self.config_path.with_suffix(".json.new")
        temp.write_text(json.dumps(config, indent=2))
        os.replace(temp, self.config_path)

    def reload(self, config: dict) -> int:
        """Write ``config`` and send SIGHUP to the supervisor; returns the log offset before
        the signal (for :meth:`wait_logged`)."""
        self.write_config(config)
        offset = self.log_size()
        self.proc.send_signal(signal.SIGHUP)
        return offset

    def start(self) -> None:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lapidus", "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                start_new_session=True, cwd=self.workdir)
        self.starts += 1

    def wait_streaming(self, backends: List[str], timeout: float = 60.0) -> None:
        """Every backend logged "streaming" in this run of the supervisor."""
        def ready():
            if self.proc.poll() is not None:
                return "exited"         # not an exception: wait_for would take it for "not yet"
            seen = {r.get("backend") for r in self.records(current=True)
                    if r.get("event") == "streaming"}
            return set(backends) <= seen
        try:
            outcome = wait_for(ready, timeout, f"backends {backends} streaming")
        except ChaosTimeout as exc:
            raise ChaosTimeout(f"{exc}\n{self.log_tail()}") from None
        if outcome == "exited":
            raise ChaosTimeout(f"lapidus exited with {self.proc.returncode} before backends "
                               f"{backends} streamed; log:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_supervisor(self) -> List[int]:
        """SIGKILL the supervisor; returns the pids of children that outlived it (should be
        none) after a grace period, killing them so the run can go on."""
        children = self.children()
        self.proc.kill()
        self.proc.wait(10)
        _, alive = psutil.wait_procs(children, timeout=10)
        left = [p.pid for p in alive]
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        return left

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        """TERM, wait, then KILL the whole process group; returns the exit status."""
        if self.proc is None:
            return None
        return stop_group(self.proc, timeout)

    # -- processes ---------------------------------------------------------------------------

    def wait_children_gone(self, name: str, timeout: float = 60.0) -> None:
        """No child named ``name`` is left (a removed backend's worker has exited)."""
        wait_for(lambda: self.find(name) is None, timeout, f"process {name} to exit")

    def children(self) -> List[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def find(self, name: str) -> Optional[int]:
        """The pid of the child named ``name`` (kernel names are cut to 15 bytes)."""
        for child in self.children():
            try:
                if child.name() == name[:15]:
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        return None

    def wait_child(self, name: str, other_than: Optional[int] = None,
                   timeout: float = 60.0) -> int:
        return wait_for(lambda: (lambda pid: pid if pid and pid != other_than else None)(
            self.find(name)), timeout, f"process {name} (other than {other_than})")

    # -- the log -------------------------------------------------------------------------------

    def log_text(self, current: bool = False) -> str:
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            if current:
                log.seek(self._log_offset)
            return log.read().decode("utf-8", "replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def records_since(self, offset: int) -> List[dict]:
        """The JSON log records written after byte ``offset`` of the log file."""
        if not self.log_path.exists():
            return []
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return _parse(log.read().decode("utf-8", "replace"))

    def wait_logged(self, event: str, offset: int, timeout: float = 60.0) -> dict:
        """The first record with ``event`` logged after ``offset``."""
        def logged():
            return next((r for r in self.records_since(offset) if r.get("event") == event),
                        None)
        return wait_for(logged, timeout, f"lapidus to log {event!r}", interval=0.1)

    def records(self, current: bool = False) -> List[dict]:
        return _parse(self.log_text(current))

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_text()[-chars:]


def _parse(text: str) -> List[dict]:
    """The JSON records of a log text (other lines, a torn last one, are skipped)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out
