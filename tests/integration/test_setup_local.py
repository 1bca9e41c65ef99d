"""Integration: scripts/setup-local leaves no server holding its lock.

`make test` runs setup-local before pytest; when it starts or restarts PostgreSQL, MariaDB or
NATS, the server must not inherit the lock's file descriptor, or it holds the lock for as long
as it runs and every later setup-local (the next `make test`, CI) waits five minutes and fails.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

LOCK = Path("/run/lock/lapidus-setup-local.lock")


def holders(path: Path) -> list:
    out = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if any(f.path == str(path) for f in proc.open_files()):
                out.append(f"{proc.info['name']} (pid {proc.info['pid']})")
        except psutil.Error:
            continue
    return out


def test_no_process_keeps_the_setup_lock_after_setup_local():
    if os.geteuid() != 0 or not LOCK.exists():
        pytest.skip("setup-local takes its lock only when run as root")
    free = subprocess.run(["flock", "--nonblock", str(LOCK), "true"]).returncode == 0
    assert free, f"{LOCK} is still held by {', '.join(holders(LOCK)) or 'an unknown process'}"
