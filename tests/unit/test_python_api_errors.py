"""lapidus.stream's bad inputs: a ConfigError naming the thing, the reason and the fix before
any connection is tried, and a BackendError worded for one attempt (lapidus.api).  No servers."""

from __future__ import annotations

import socket

import pytest

import lapidus
from lapidus.config import ConfigError


@pytest.mark.parametrize("spec, shown", [
    ("postgresql://user:pw@db/shop", "a string (str)"), (None, "None (NoneType)"),
    (["postgresql"], "['postgresql'] (list)")])
def test_a_backend_that_is_not_a_dict_is_named_and_a_password_in_it_is_not(tmp_path, spec,
                                                                           shown):
    with pytest.raises(ConfigError) as info:
        lapidus.stream(spec, state_dir=tmp_path)
    (problem,) = info.value.problems
    assert problem.startswith(f"backend: {shown} is not a backend; give a dict in "
                              f"configuration-file form")
    assert "pw" not in problem


def test_an_invalid_backend_dict_lists_its_problems(tmp_path):
    with pytest.raises(ConfigError) as info:
        lapidus.stream({"type": "postgresql", "port": "many"}, state_dir=tmp_path)
    assert any("port" in p for p in info.value.problems), info.value.problems


def test_a_state_dir_that_is_a_file_is_named(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as info:
        lapidus.stream({"type": "postgresql", "database": "shop"}, state_dir=tmp_path / "file")
    (problem,) = info.value.problems
    assert problem == (f"state_dir: cannot use {tmp_path / 'file' / 'postgresql_shop'} as the "
                       f"backend's directory (Not a directory); give a state_dir that is a "
                       f"directory this user may write")


def test_an_unreachable_server_is_said_without_the_daemon_s_retrying(tmp_path):
    """Nothing retries in the caller's process: the message ends with its fix."""
    from lapidus.workers.base import BackendError
    with socket.socket() as probe:                   # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(BackendError) as info:
        lapidus.stream({"type": "postgresql", "database": "shop", "port": port,
                        "connect_timeout": 2}, state_dir=tmp_path)
    text = str(info.value)
    assert f"cannot reach PostgreSQL at 127.0.0.1:{port}" in text
    assert text.endswith("check that the server runs and the host and port are right")
    assert info.value.fatal is False
