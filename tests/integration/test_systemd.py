"""systemd integration: unit files verify, and the notify protocol against a fake NOTIFY_SOCKET."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import pg_backend

UNITS = Path(__file__).resolve().parents[2] / "systemd"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("unit, instance", [("lapidus.service", "lapidus.service"),
                                            ("lapidus@.service", "lapidus@acme.service")])
def test_unit_files_verify(tmp_path, unit, instance):
    lapidus_bin = Path(sys.executable).with_name("lapidus")
    assert lapidus_bin.exists()
    text = (UNITS / unit).read_text().replace("/usr/local/bin/lapidus", str(lapidus_bin))
    (tmp_path / instance).write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / instance)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_ready_status_watchdog_and_stopping_reach_the_notify_socket(
        lapidus_factory, pg_db, tmp_path):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify.sock")
    listener.bind(address)
    listener.settimeout(0.1)
    received = []

    def collect():
        try:
            while True:
                received.extend(listener.recv(4096).decode().splitlines())
        except socket.timeout:
            pass
        return received

    try:
        proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}},
                               env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"})
        wait_until(lambda: "READY=1" in collect(), 30, message="READY=1")
        assert "STATUS=1 running" in received
        # READY only after the backend reported ready, i.e. after it started streaming
        assert '"streaming"' in proc.log()
        wait_until(lambda: collect().count("WATCHDOG=1") >= 2, 10, message="watchdog pings")
        assert proc.terminate() == 0
        wait_until(lambda: "STOPPING=1" in collect(), 5, message="STOPPING=1")
    finally:
        listener.close()
