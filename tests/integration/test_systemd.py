"""systemd integration: unit files verify, and the notify protocol against a fake NOTIFY_SOCKET."""

from __future__ import annotations

import re
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
    text = (UNITS / unit).read_text().replace("/opt/lapidus/bin/lapidus", str(lapidus_bin))
    (tmp_path / instance).write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / instance)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


INSTALL_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_the_documented_install_gives_the_binary_the_unit_runs(tmp_path):
    """systemd/README.md's install into a system venv, done for real (into a temporary
    prefix instead of /opt/lapidus), yields the command the units' ExecStart names, and it
    runs outside the clone."""
    readme = (UNITS / "README.md").read_text()
    install = INSTALL_BLOCK.search(readme).group(1)
    assert "python3 -m venv /opt/lapidus" in install
    assert "/opt/lapidus/bin/pip install './[nats]'" in install
    for unit in ("lapidus.service", "lapidus@.service"):
        assert "ExecStart=/opt/lapidus/bin/lapidus -c " in (UNITS / unit).read_text()
    prefix = tmp_path / "opt-lapidus"
    subprocess.run([sys.executable, "-m", "venv", str(prefix)], check=True, timeout=120)
    result = subprocess.run(
        [str(prefix / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
         "./[nats]"], cwd=UNITS.parent, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (UNITS / "lapidus.service").read_text().replace("/opt/lapidus", str(prefix))
    (tmp_path / "lapidus.service").write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no",
                             str(tmp_path / "lapidus.service")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
    for command in ("lapidus", "lapidusctl"):
        ran = subprocess.run([str(prefix / "bin" / command), "--help"], cwd="/",
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0 and "usage" in ran.stdout.lower(), ran.stderr
    # the installed package, not the clone, is what runs
    where = subprocess.run([str(prefix / "bin" / "python"), "-c",
                            "import lapidus; print(lapidus.__file__)"], cwd="/",
                           capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(prefix)), where.stdout + where.stderr


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
