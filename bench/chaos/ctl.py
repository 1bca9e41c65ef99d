"""``lapidusctl status --json`` as the harness sees it: the state of every backend.

The harness asks the running Lapidus the way an operator would, through the ``lapidusctl``
command of the same virtualenv (a process of its own, so a hung control socket cannot hang the
harness).  Every answer that is not a JSON status (a timeout, an error line, a Python
traceback) comes back as a :class:`CtlAnswer` with ``status`` None and the reason, so the
caller decides whether it is "not yet" or a finding.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import psutil

LAPIDUSCTL = Path(sys.executable).parent / "lapidusctl"


@dataclass
class CtlAnswer:
    status: Optional[dict]          # the parsed JSON status; None when there was none
    seconds: float                  # how long lapidusctl took
    returncode: Optional[int]       # None: killed after the timeout
    stderr: str = ""

    @property
    def traceback(self) -> bool:
        """lapidusctl died with a Python traceback instead of a one-line error."""
        return "Traceback (most recent call last)" in self.stderr

    def reason(self) -> str:
        if self.returncode is None:
            return f"lapidusctl status did not answer within {self.seconds:.1f} s"
        last = self.stderr.strip().splitlines()[-1:] or [""]
        return f"lapidusctl status exited {self.returncode}: {last[0][:300]}"


@dataclass
class CtlLog:
    """Every answer that was not a status, kept for the report."""
    calls: int = 0
    failures: List[str] = field(default_factory=list)
    tracebacks: int = 0

    def note(self, answer: CtlAnswer) -> None:
        self.calls += 1
        if answer.traceback:
            self.tracebacks += 1
        if answer.status is None and len(self.failures) < 20:
            self.failures.append(answer.reason())


def status(config_path: Path, timeout: float = 10.0, log: Optional[CtlLog] = None) -> CtlAnswer:
    """Run ``lapidusctl -c CONFIG status --json`` with a deadline of ``timeout`` seconds."""
    began = time.monotonic()
    try:
        done = subprocess.run([str(LAPIDUSCTL), "-c", str(config_path), "status", "--json"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) \
            else (exc.stderr or "")
        answer = CtlAnswer(None, time.monotonic() - began, None, stderr)
    else:
        parsed = None
        if done.returncode == 0:
            try:
                parsed = json.loads(done.stdout)
            except ValueError:
                parsed = None
        answer = CtlAnswer(parsed, time.monotonic() - began, done.returncode, done.stderr)
    if log is not None:
        log.note(answer)
    return answer


def backends(answer: CtlAnswer) -> Dict[str, dict]:
    """The status rows by backend name (empty without a status)."""
    if answer.status is None:
        return {}
    return {row["name"]: row for row in answer.status.get("backends", [])}


def process_runs(pid: Optional[int]) -> bool:
    """``pid`` is a live process that is neither frozen (SIGSTOP) nor a zombie."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_STOPPED,
                                                    psutil.STATUS_ZOMBIE,
                                                    psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def all_running(answer: CtlAnswer, names: List[str]) -> bool:
    """Every backend in ``names`` is RUNNING with a process that runs, exactly those are
    listed, and the dispatcher's process runs: what "recovered" means for the freezes and the
    reloads (a state that names a dead pid is not a recovery)."""
    rows = backends(answer)
    if set(rows) != set(names):
        return False
    if not all(rows[n]["state"] == "RUNNING" and process_runs(rows[n].get("pid"))
               for n in names):
        return False
    dispatcher = (answer.status or {}).get("dispatcher") or {}
    return process_runs(dispatcher.get("pid"))


def describe(answer: CtlAnswer) -> str:
    """One line for an error message: each backend's state and pid, and the dispatcher's."""
    if answer.status is None:
        return answer.reason()
    parts = [f"{n} {r['state']} pid {r.get('pid')}"
             + (f" ({str(r.get('last_error'))[:120]})" if r.get("last_error") else "")
             for n, r in backends(answer).items()]
    dispatcher = answer.status.get("dispatcher") or {}
    parts.append(f"dispatcher {dispatcher.get('state')} pid {dispatcher.get('pid')}")
    return "; ".join(parts)
