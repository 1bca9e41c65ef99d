"""Helpers for tests against Redis: the shared server (127.0.0.1:6379) and private ones.

* :func:`redis_prefix` gives a test its own key prefix on the shared server and deletes every
  key under it afterwards.
* :class:`PrivateRedis` runs a redis-server of the test's own on a free loopback port (no
  automatic snapshots, no AOF), which the test may stop and start again; ``stop(save=True)``
  shuts it down with ``SHUTDOWN SAVE`` into the test's directory, so that the restarted server
  still holds what it had acknowledged (an outage, not a data loss of Redis's own).  It is
  always stopped at the end, by its pid.
* :func:`entries` reads a stream back whole, oldest first, as dicts of str.
"""

from __future__ import annotations

import socket
import subprocess
import uuid
from typing import Dict, List, Optional

import pytest
import redis

from tests.conftest import wait_until

REDIS_SERVER = "/usr/bin/redis-server"
URL = "redis://127.0.0.1:6379/0"


def client(url: str = URL) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10)


@pytest.fixture
def redis_prefix():
    prefix = f"it{uuid.uuid4().hex[:10]}"
    yield prefix
    shared = client()
    for key in shared.scan_iter(match=f"{prefix}*", count=1000):
        shared.delete(key)
    shared.close()


def entries(stream: str, url: str = URL) -> List[Dict[str, str]]:
    """Every entry of ``stream``, oldest first: its fields (str) plus ``_id``, the entry id."""
    conn = client(url)
    out: List[Dict[str, str]] = []
    start = "-"
    while True:
        chunk = conn.xrange(stream, min=start, max="+", count=5000)
        if start != "-":
            chunk = chunk[1:]           # the first is the last of the previous chunk
        if not chunk:
            break
        for entry_id, fields in chunk:
            item = {k.decode(): v.decode() for k, v in fields.items()}
            item["_id"] = entry_id.decode()
            out.append(item)
        start = chunk[-1][0].decode()
    conn.close()
    return out


def stream_length(stream: str, url: str = URL) -> int:
    try:
        conn = client(url)
        try:
            return conn.xlen(stream)
        finally:
            conn.close()
    except redis.exceptions.ConnectionError:
        return -1


def wait_length(stream: str, count: int, timeout: float = 60.0, url: str = URL) -> int:
    return wait_until(lambda: (lambda n: n if n >= count else None)(stream_length(stream, url)),
                      timeout, message=f"{count} entries in {stream} "
                                       f"(has {stream_length(stream, url)})")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class PrivateRedis:
    def __init__(self, directory):
        self.port = free_port()
        self.directory = directory
        self.proc: Optional[subprocess.Popen] = None
        self.password: Optional[str] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, password: Optional[str] = None) -> None:
        self.password = password
        extra = ["--requirepass", password] if password else []
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory), "--dbfilename", "dump.rdb",
             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: port_open(self.port), 20, message=f"redis-server on {self.port}")

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                           socket_timeout=10)

    def stop(self, save: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if save:
            try:
                self.client().shutdown(save=True)
            except redis.exceptions.ConnectionError:
                pass           # the server closes the connection as it goes
        else:
            self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        wait_until(lambda: not port_open(self.port), 10, message="redis-server stopped")


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path / "redis")
    yield server
    server.stop()
