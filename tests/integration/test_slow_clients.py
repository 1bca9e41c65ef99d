"""Slow, silent and misbehaving clients of the control socket and the HTTP endpoint, against the
real supervisor: they must cost the loop nothing (status answers, rows stream, children are
watched), and lapidusctl says in one line what went wrong with a server that is not a Lapidus."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import ctl, pg_backend, running
from bench.chaos.servers import free_port


class Trickler(threading.Thread):
    """Clients that connect and send one byte every half second, or nothing at all."""

    def __init__(self, connect, count: int, payload: bytes):
        super().__init__(daemon=True)
        self.connect, self.count, self.payload = connect, count, payload
        self.socks = []
        self.done = threading.Event()

    def run(self):
        for _ in range(self.count):
            self.socks.append(self.connect())
        position = 0
        while not self.done.is_set():
            for sock in self.socks:
                try:
                    sock.send(self.payload[position:position + 1] or b" ")
                except OSError:
                    pass   # closed by the server at its deadline: as it should
            position += 1
            self.done.wait(0.5)
        for sock in self.socks:
            sock.close()


def test_fifty_slow_clients_do_not_stall_the_supervisor(lapidus_factory, pg_db, tmp_path):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    port = free_port()
    proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}},
                            "http": {"listen": f"127.0.0.1:{port}"}})
    path = proc.config_path
    wait_until(lambda: running(path, "pg"), 30)
    control_path = str(tmp_path / "state" / "lapidus.sock")

    def unix():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(control_path)
        return sock

    slow = [Trickler(unix, 25, b"\x00\x00\x00\x14{\"command\":\"status\"}"),
            Trickler(lambda: socket.create_connection(("127.0.0.1", port)), 25,
                     b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")]
    for client in slow:
        client.start()
    try:
        for client in slow:
            wait_until(lambda c=client: len(c.socks) == c.count, 20)
        for n in range(1, 4):
            started = time.monotonic()
            code, out, err = ctl(path, "status", "--json")
            assert code == 0, err
            assert time.monotonic() - started < 20   # answered, not timed out (10 s)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
                assert json.loads(r.read())["ok"] is True
            pg_db.sql(f"INSERT INTO t VALUES ({n})")
            assert len(proc.wait_events(n)) == n
    finally:
        for client in slow:
            client.done.set()
            client.join(10)
    assert proc.proc.poll() is None


def fake_control_socket(tmp_path, behaviour):
    """A unix socket server at the config's control path that answers ``behaviour``."""
    path = tmp_path / "state" / "lapidus.sock"
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    held = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if behaviour is not None:
                conn.recv(4096)
                conn.sendall(behaviour)
                conn.close()
    threading.Thread(target=serve, daemon=True).start()
    return server


def run_ctl(config_path, timeout=60):
    result = subprocess.run([sys.executable, "-m", "lapidus.ctl", "-c", str(config_path),
                             "status"], capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stderr


def ctl_config(tmp_path):
    config = tmp_path / "lapidus.json"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state"),
                                  "backends": [{"type": "postgresql", "database": "x"}]}))
    return config


@pytest.mark.parametrize("answer, message", [
    (b"HTTP/1.0 200 OK\r\n\r\nhello", "not a lapidus control message"),   # garbage
    (None, "did not answer within"),                                        # silence
])
def test_lapidusctl_against_a_server_that_is_not_a_lapidus_exits_3_in_one_line(
        tmp_path, answer, message):
    server = fake_control_socket(tmp_path, answer)
    try:
        code, err = run_ctl(ctl_config(tmp_path))
    finally:
        server.close()
    assert code == 3
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert message in err


def test_a_second_lapidus_on_the_same_control_socket_is_refused(lapidus_factory, pg_db,
                                                                 tmp_path):
    first = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}}})
    wait_until(lambda: running(first.config_path, "pg"), 30)
    socket_path = str(tmp_path / "state" / "lapidus.sock")
    other = tmp_path / "other"
    other.mkdir()
    second = lapidus_factory({"state_dir": str(other / "state"),
                              "control": {"socket": socket_path},
                              "backends": [pg_backend(pg_db, name="pg2")],
                              "plugins": {"stdout": {}}}, workdir=other)
    assert second.proc.wait(30) == 1
    assert "already listening on control socket" in second.log()
    assert "Traceback" not in second.log()
    assert running(first.config_path, "pg")   # the first one is still reachable


def test_an_http_port_in_use_names_the_setting_and_leaves_no_control_socket(
        lapidus_factory, pg_db, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        proc = lapidus_factory({"backends": [pg_backend(pg_db)], "plugins": {"stdout": {}},
                                "http": {"listen": f"127.0.0.1:{port}"}})
        code = proc.proc.wait(30)
    finally:
        taken.close()
    assert code != 0
    log = proc.log()
    assert "http.listen" in log and "Traceback" not in log
    assert not (tmp_path / "state" / "lapidus.sock").exists()
