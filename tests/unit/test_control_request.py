"""lapidus.control.request: every way of not reaching a Lapidus says which and what to do
(lapidusctl prints it and exits 3).  No Lapidus needed: the paths are a file, a directory,
nothing, and a socket nobody listens on."""

from __future__ import annotations

import socket

import pytest

from lapidus.control import ControlUnavailable, request


def test_a_regular_file_is_named_as_such_not_as_a_lapidus_that_is_not_running(tmp_path):
    path = tmp_path / "lapidus.conf"
    path.write_text("")
    with pytest.raises(ControlUnavailable, match=(
            f"^{path} is a regular file, not a socket: give lapidus's control socket")):
        request(str(path), {"cmd": "status"})


def test_a_directory_is_named_as_such(tmp_path):
    with pytest.raises(ControlUnavailable, match=f"^{tmp_path} is a directory, not a socket"):
        request(str(tmp_path), {"cmd": "status"})


def test_a_socket_nobody_listens_on_asks_whether_lapidus_runs(tmp_path):
    path = tmp_path / "lapidus.sock"
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(path))          # bound, never listening: what a killed lapidus leaves
    try:
        with pytest.raises(ControlUnavailable, match="is it running with this configuration"):
            request(str(path), {"cmd": "status"})
    finally:
        left.close()


def test_no_socket_at_all_asks_whether_lapidus_runs(tmp_path):
    with pytest.raises(ControlUnavailable, match="No such file or directory; is it running"):
        request(str(tmp_path / "missing.sock"), {"cmd": "status"})
