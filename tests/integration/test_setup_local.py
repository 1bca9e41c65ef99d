"""Integration: scripts/setup-local leaves no server holding its lock, and its MariaDB drop-in
keeps what other option files already set right (scripts/mariadb-options).

`make test` runs setup-local before pytest; when it starts or restarts PostgreSQL, MariaDB or
NATS, the server must not inherit the lock's file descriptor, or it holds the lock for as long
as it runs and every later setup-local (the next `make test`, CI) waits five minutes and fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

# serial: runs scripts/setup-local, which may restart the shared servers
pytestmark = [pytest.mark.integration, pytest.mark.serial]

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


# --- scripts/mariadb-options: what setup-local's MariaDB drop-in sets ---------------------
#
# Judged on option trees in tmp_path read by the real my_print_defaults (what setup-local
# reads on the machine), so the machine's own MariaDB configuration is never touched.

HELPER = Path(__file__).resolve().parents[2] / "scripts" / "mariadb-options"
BASE, EXPIRE, TLS_DIR = "/var/lib/mysql/mariadb-bin", "604800", "/etc/mysql/lapidus-tls"


def option_tree(tmp_path: Path, before: str = "", after: str = "") -> Path:
    """my.cnf with ``before`` in it, then the drop-in directory (``60-lapidus.cnf`` goes
    there), then ``99-later.cnf`` holding ``after`` (a file read after the drop-in)."""
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    if after:
        (conf_d / "99-later.cnf").write_text("[mysqld]\n" + after)
    main = tmp_path / "my.cnf"
    main.write_text(f"[mysqld]\ndatadir = /var/lib/mysql\n{before}\n!includedir {conf_d}/\n")
    return main


def print_defaults(cnf: Path) -> str:
    if not shutil.which("my_print_defaults"):
        pytest.skip("my_print_defaults (MariaDB) is not installed")
    return subprocess.run(["my_print_defaults", f"--defaults-file={cnf}", "--mysqld"],
                          check=True, capture_output=True, text=True).stdout


def helper(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HELPER), *args], capture_output=True, text=True)


def write_dropin(tmp_path: Path, main: Path) -> dict:
    """Run the helper as setup-local does and install its drop-in; its settings by name."""
    dropin = tmp_path / "conf.d" / "60-lapidus.cnf"
    (tmp_path / "merged").write_text(print_defaults(main))
    (tmp_path / "ours").write_text(print_defaults(dropin) if dropin.exists() else "")
    out = helper("dropin", str(tmp_path / "merged"), str(tmp_path / "ours"), BASE, EXPIRE,
                 TLS_DIR)
    assert out.returncode == 0, out.stderr
    dropin.write_text("[mysqld]\n" + out.stdout)
    (tmp_path / "merged").write_text(print_defaults(main))
    return settings_of(out.stdout)


def settings_of(text: str) -> dict:
    return {k.strip(): v.strip() for k, v in
            (line.split("=", 1) for line in text.splitlines() if "=" in line)}


def test_a_binlog_already_on_under_another_path_is_kept(tmp_path):
    """The original README's option file: setup-local must neither move the binlog nor
    refuse; it adds only what is missing."""
    main = option_tree(tmp_path, before="log_bin = /var/log/mysql/mysql-bin.log\n"
                                        "binlog_format = ROW\nserver_id = 7\n"
                                        "expire_logs_days = 10\n")
    write_dropin(tmp_path, main)
    wrote = settings_of((tmp_path / "conf.d" / "60-lapidus.cnf").read_text())
    assert "log_bin" not in wrote and "server_id" not in wrote and "binlog_format" not in wrote
    assert "binlog_expire_logs_seconds" not in wrote
    assert wrote["binlog_row_image"] == "FULL" and wrote["binlog_row_metadata"] == "FULL"
    assert wrote["ssl_cert"] == f"{TLS_DIR}/server-cert.pem"
    check = helper("check", str(tmp_path / "merged"))
    assert check.returncode == 0, check.stdout
    running = dict(line.split("\t") for line in
                   helper("running", str(tmp_path / "merged")).stdout.splitlines())
    assert running["log_bin"] == "1" and running["server_id"] == "7"
    assert "log_bin_basename" not in running      # wherever it is, an enabled binlog is fine
    where = helper("binlog-dir", str(tmp_path / "merged"), "/var/lib/mysql")
    assert where.stdout.strip() == "/var/log/mysql"     # setup-local creates it if missing


def test_the_dropin_is_stable_once_written(tmp_path):
    """A second run, with the drop-in in place, asks for the same drop-in (no rewrite, no
    restart), although its own lines now show in the merged options."""
    main = option_tree(tmp_path, before="log-bin\nbinlog_row_image = MINIMAL\n")
    write_dropin(tmp_path, main)
    first = (tmp_path / "conf.d" / "60-lapidus.cnf").read_text()
    write_dropin(tmp_path, main)
    assert (tmp_path / "conf.d" / "60-lapidus.cnf").read_text() == first
    wrote = settings_of(first)
    assert "log_bin" not in wrote and wrote["binlog_row_image"] == "FULL"
    assert wrote["server_id"] == "1" and wrote["binlog_expire_logs_seconds"] == EXPIRE


def test_no_binlog_and_a_disabled_one_get_ours(tmp_path):
    main = option_tree(tmp_path, before="skip-log-bin\nlog_bin_compress = ON\n")
    write_dropin(tmp_path, main)
    wrote = settings_of((tmp_path / "conf.d" / "60-lapidus.cnf").read_text())
    assert wrote["log_bin"] == BASE and wrote["log_bin_compress"] == "OFF"
    where = helper("binlog-dir", str(tmp_path / "merged"), "/var/lib/mysql")
    assert where.stdout.strip() == "/var/lib/mysql"
    assert helper("check", str(tmp_path / "merged")).returncode == 0


def test_a_file_read_later_that_breaks_a_requirement_is_named(tmp_path):
    main = option_tree(tmp_path, after="binlog_format = MIXED\n")
    write_dropin(tmp_path, main)
    check = helper("check", str(tmp_path / "merged"))
    assert check.returncode == 1
    assert "binlog_format is 'MIXED', not 'ROW'" in check.stdout


def test_tls_configured_by_another_file_is_left_alone(tmp_path):
    main = option_tree(tmp_path, before="ssl_cert = /etc/ssl/db.pem\nssl_key = /etc/ssl/db.key\n")
    write_dropin(tmp_path, main)
    wrote = settings_of((tmp_path / "conf.d" / "60-lapidus.cnf").read_text())
    assert not any(name.startswith("ssl_") for name in wrote)
