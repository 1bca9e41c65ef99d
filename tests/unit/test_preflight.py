"""lapidus.config.preflight: a valid configuration against this machine (state_dir, the HTTP
listen address), as ``lapidus -t`` and the supervisor's start check it.  No servers needed."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from lapidus import config as config_module
from lapidus.config import ConfigError, bind_problem, check_preflight, parse_config
from lapidus.config import preflight


@pytest.fixture(autouse=True)
def not_root(monkeypatch):
    monkeypatch.setattr(config_module, "_running_as_root", lambda: False)


def config(state_dir, *names, listen=None, **top):
    backends = [{"type": "postgresql", "database": "d", "name": n} for n in names or ("shop",)]
    data = {"state_dir": str(state_dir), "backends": backends, **top}
    if listen is not None:
        data["http"] = {"listen": listen}
    return parse_config(data, source="/etc/lapidus/lapidus.toml", env={})


def problems(cfg, **kwargs):
    with pytest.raises(ConfigError) as info:
        check_preflight(cfg, **kwargs)
    assert info.value.source == "/etc/lapidus/lapidus.toml"
    return info.value.problems


def user():
    return preflight._user()


def deny(monkeypatch, *paths):
    """Play a user who may not write ``paths`` (the suite runs as root, who may write all)."""
    denied = {Path(p) for p in paths}
    monkeypatch.setattr(preflight, "_may_write", lambda path: Path(path) not in denied)


# --------------------------------------------------------------------------------------------
# state_dir


def test_an_existing_writable_state_dir_passes(tmp_path):
    (tmp_path / "shop").mkdir()
    check_preflight(config(tmp_path, "shop", "crm"))


def test_a_missing_state_dir_under_a_writable_parent_passes_and_is_not_created(tmp_path):
    check_preflight(config(tmp_path / "a" / "b" / "state"))
    assert not (tmp_path / "a").exists()


def test_state_dir_that_is_a_file(tmp_path):
    path = tmp_path / "state"
    path.write_text("")
    assert problems(config(path)) == [
        f"state_dir: {path} is a file, not a directory; remove it or set state_dir to a "
        f"directory"]


def test_state_dir_under_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "x" / "state"
    assert problems(config(path)) == [
        f"state_dir: {path} cannot be created: {tmp_path / 'file'} is a file, not a directory; "
        f"set state_dir to a directory that does not lie under a file"]


def test_state_dir_that_is_a_dangling_symbolic_link(tmp_path):
    path = tmp_path / "state"
    path.symlink_to(tmp_path / "gone")
    assert problems(config(path)) == [
        f"state_dir: {path} is a symbolic link to {tmp_path / 'gone'}, which does not exist, "
        f"not a directory; remove it or set state_dir to a directory"]


def test_state_dir_not_writable(tmp_path, monkeypatch):
    deny(monkeypatch, tmp_path)
    assert problems(config(tmp_path)) == [
        f"state_dir: {tmp_path} is not writable by user {user()}; give it to that user (chown "
        f"{user()} {tmp_path}), or set state_dir to a directory this user may write"]


def test_state_dir_that_cannot_be_created(tmp_path, monkeypatch):
    deny(monkeypatch, tmp_path)
    path = tmp_path / "lib" / "lapidus"
    assert problems(config(path)) == [
        f"state_dir: {path} does not exist and user {user()} cannot create it ({tmp_path} is "
        f"not writable); create it as root (install -d -o {user()} -m 0700 {path}) or set "
        f"state_dir to a directory this user may write"]


def test_real_permissions_are_read_with_access(tmp_path):
    # What _may_write asks; as root only a read-only mount says no, so just check the call.
    assert preflight._may_write(tmp_path)
    assert not preflight._may_write(tmp_path / "missing")


def test_a_file_where_a_backends_directory_belongs(tmp_path):
    (tmp_path / "crm").write_text("")
    assert problems(config(tmp_path, "shop", "crm")) == [
        f'state_dir: {tmp_path / "crm"} is a file, but backend "crm" (backends[1]) keeps its '
        f"checkpoint there; move it away or rename the backend"]


def test_a_backends_directory_not_writable(tmp_path, monkeypatch):
    (tmp_path / "shop").mkdir()
    deny(monkeypatch, tmp_path / "shop")
    assert problems(config(tmp_path)) == [
        f'state_dir: {tmp_path / "shop"} is not writable by user {user()}, but backend "shop" '
        f"(backends[0]) keeps its checkpoint there; give it to that user (chown {user()} "
        f"{tmp_path / 'shop'})"]


def test_a_directory_where_the_lock_file_belongs(tmp_path):
    (tmp_path / "lapidus.lock").mkdir()
    assert problems(config(tmp_path)) == [
        f"state_dir: {tmp_path / 'lapidus.lock'} is a directory; lapidus keeps its lock file "
        f"there, move it away"]


def test_control_socket_outside_state_dir_is_checked_too(tmp_path):
    (tmp_path / "run").write_text("")
    sock = tmp_path / "run" / "lapidus" / "ctl.sock"
    assert problems(config(tmp_path / "state", control={"socket": str(sock)})) == [
        f"control.socket: {sock.parent} cannot be created: {tmp_path / 'run'} is a file, not a "
        f"directory; put control.socket in a directory that does not lie under a file"]


def test_every_problem_at_once(tmp_path):
    (tmp_path / "a").write_text("")
    (tmp_path / "b").write_text("")
    cfg = config(tmp_path, "a", "b")
    assert [p.split(",")[0] for p in problems(cfg)] == [
        f'state_dir: {tmp_path / "a"} is a file', f'state_dir: {tmp_path / "b"} is a file']


# --------------------------------------------------------------------------------------------
# [http] listen


@pytest.fixture
def taken_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


def test_a_free_listen_address_passes(tmp_path):
    check_preflight(config(tmp_path, listen="127.0.0.1:0"))
    check_preflight(config(tmp_path, listen="[::1]:0") if socket.has_ipv6 else
                    config(tmp_path, listen="127.0.0.1:0"))


def test_listen_address_in_use(tmp_path, taken_port):
    assert problems(config(tmp_path, listen=f"127.0.0.1:{taken_port}")) == [
        f"http.listen: address in use: another program already listens on "
        f"127.0.0.1:{taken_port}; stop it (ss -ltnp 'sport = :{taken_port}' shows which), or "
        f"choose another port in [http] listen"]
    check_preflight(config(tmp_path, listen=f"127.0.0.1:{taken_port}"), try_bind=False)


def test_listen_address_held_by_this_configurations_running_lapidus(tmp_path, taken_port):
    # The running supervisor's pid is in the lock file and it listens there: -t before a
    # reload must not call the configuration broken.  (Here this test process plays it.)
    (tmp_path / "lapidus.lock").write_text(f"{os.getpid()}\n")
    check_preflight(config(tmp_path, listen=f"127.0.0.1:{taken_port}"))
    (tmp_path / "lapidus.lock").write_text("999999999\n")                 # a dead pid
    assert problems(config(tmp_path, listen=f"127.0.0.1:{taken_port}"))


def test_listen_address_not_of_this_machine(tmp_path):
    # 192.0.2.0/24 is TEST-NET-1: never assigned to a host.
    assert problems(config(tmp_path, listen="192.0.2.1:9187")) == [
        "http.listen: 192.0.2.1 is not an address of this machine; use one of its addresses, "
        "127.0.0.1 for this machine only or 0.0.0.0 for every interface"]


@pytest.mark.parametrize("exc, text", [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
     "http.listen: cannot resolve the host db.example of db.example:9187: Name or service not "
     "known; give an IP address (127.0.0.1, [::1]) or a name that resolves"),
    (OSError(errno.EACCES, "Permission denied"),
     "http.listen: permission denied binding db.example:9187 (ports below 1024 need root or "
     "CAP_NET_BIND_SERVICE); choose a port from 1024 up"),
    (OSError(errno.ENOBUFS, "No buffer space available"),
     "http.listen: cannot listen on db.example:9187: No buffer space available"),
])
def test_bind_problem_wording(exc, text):
    assert bind_problem("db.example:9187", exc) == text


def test_state_dir_and_listen_problems_together(tmp_path, taken_port):
    (tmp_path / "shop").write_text("")
    msgs = problems(config(tmp_path, listen=f"127.0.0.1:{taken_port}"))
    assert [m.split(":")[0] for m in msgs] == ["state_dir", "http.listen"]


def test_a_port_held_by_another_users_lapidus_is_recognised_by_its_command_line(
        tmp_path, taken_port, monkeypatch):
    import psutil

    class Foreign:
        def __init__(self, pid):
            pass

        def net_connections(self, kind):
            raise psutil.AccessDenied()

        def cmdline(self):
            return ["/usr/bin/python3", "/usr/bin/lapidus", "-c", "/etc/lapidus/lapidus.toml"]

    monkeypatch.setattr(psutil, "Process", Foreign)
    (tmp_path / "lapidus.lock").write_text("4242\n")
    check_preflight(config(tmp_path, listen=f"127.0.0.1:{taken_port}"))


def test_a_state_dir_behind_an_unsearchable_directory(tmp_path, monkeypatch):
    # As a user, /root/x/state: lstat fails with EACCES whether or not it exists.
    hidden = tmp_path / "private"
    real = preflight._lookup
    monkeypatch.setattr(preflight, "_lookup", lambda p: "denied" if hidden in Path(p).parents
                        else real(p))
    path = hidden / "state"
    assert problems(config(path)) == [
        f"state_dir: {path} cannot be reached by user {user()}: a directory on the way to it is "
        f"not searchable (permission denied); give that user access, or set state_dir to a "
        f"directory this user may write"]


def test_lookup_tells_missing_from_existing(tmp_path):
    (tmp_path / "f").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert preflight._lookup(tmp_path / "f") == "exists"
    assert preflight._lookup(tmp_path / "dangling") == "exists"
    assert preflight._lookup(tmp_path / "nope") == "missing"
    assert preflight._lookup(tmp_path / "f" / "under") == "missing"        # ENOTDIR


@pytest.mark.parametrize("state_dir, kind", [("/proc/lapidus", "proc"),
                                             ("/sys/lapidus/state", "sysfs"), ("/proc", "proc")])
def test_state_dir_on_a_pseudo_filesystem_is_refused(state_dir, kind):
    """root "may write" /proc and /sys by access(2), yet nothing can be created there."""
    (problem,) = problems(config(Path(state_dir)), try_bind=False)
    assert problem.startswith(f"state_dir: {state_dir} ")
    assert f"on the kernel's {kind} pseudo-filesystem" in problem
    assert problem.endswith("set state_dir to a directory on a disk")
