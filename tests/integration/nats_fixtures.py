"""Helpers for tests against the local nats-server (127.0.0.1:4222, JetStream enabled).

* :class:`Watcher` subscribes with nats-py in a background thread and records every message
  (subject, payload, headers) so synchronous tests can wait on conditions.
* :func:`stream` creates a JetStream stream with a unique name and deletes it afterwards;
  :func:`stream_messages` reads a stream back in stored order.
* :func:`nats_outage` stops the shared nats-server and starts it again with the exact command
  it is run with here; it is running again when the block ends, even on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
import uuid
from typing import Dict, List, NamedTuple, Optional

import nats
import nats.js.errors
import psutil
import pytest

from bench.chaos import servers
from bench.chaos.servers import nats_server_on
from tests.conftest import wait_until
from tests.integration.recorder import BackgroundRecorder, recorders

URL = "nats://127.0.0.1:4222"
NATS_SERVER = "/usr/sbin/nats-server"
# The machine's command, plus a pid file of its own: with only --exec, start-stop-daemon takes
# any other nats-server on the machine (a benchmark's private one) for this one and starts
# nothing.
PID_FILE = "/run/lapidus-test-nats-4222.pid"
START_COMMAND = ["start-stop-daemon", "--start", "--oknodo", "--background",
                 "--pidfile", PID_FILE, "--make-pidfile", "--exec",
                 NATS_SERVER, "--", "-a", "127.0.0.1", "-p", "4222", "-js", "-sd",
                 "/var/lib/nats-server", "-l", "/var/log/nats-server.log"]


def unique_prefix() -> str:
    return f"it{uuid.uuid4().hex[:10]}"


class Seen(NamedTuple):
    subject: str
    data: bytes
    headers: Dict[str, str]


class Watcher(BackgroundRecorder):
    """Records messages on ``subject`` (a wildcard is fine) from a background thread."""

    what = "NATS"

    def __init__(self, subject: str, url: str = URL, **connect_options):
        self.subject = subject
        self.url = url
        self.connect_options = connect_options      # token, user/password, tls ...
        super().__init__()

    async def listen(self):
        nc = await nats.connect(self.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                                **self.connect_options)

        async def on_msg(msg) -> None:
            self.record(Seen(msg.subject, msg.data, dict(msg.headers or {})))

        await nc.subscribe(self.subject, cb=on_msg, pending_msgs_limit=1 << 20)
        await nc.flush()
        return nc.close

    def wait_count(self, count: int, timeout: float = 30.0) -> List[Seen]:
        return wait_until(lambda: (lambda m: m if len(m) >= count else None)(self.seen()),
                          timeout, message=f"{count} messages on {self.subject}")


@pytest.fixture
def watch():
    """``watch(subject)`` -> a started :class:`Watcher`; all are closed after the test."""
    yield from recorders(Watcher)


def run(coro):
    """Run a coroutine on a fresh loop (tests are synchronous)."""
    return asyncio.run(coro)


async def _with_js(action, url: str = URL):
    nc = await nats.connect(url)
    try:
        return await action(nc.jetstream())
    finally:
        await nc.close()


def create_stream(name: str, subjects: List[str], duplicate_window: float = 120,
                  url: str = URL) -> None:
    run(_with_js(lambda js: js.add_stream(name=name, subjects=subjects,
                                          duplicate_window=duplicate_window), url))


def delete_stream(name: str) -> None:
    async def delete(js):
        try:
            await js.delete_stream(name)
        except nats.js.errors.NotFoundError:
            pass
    run(_with_js(delete))


def stream_count(name: str, url: str = URL) -> int:
    async def count(js):
        try:
            return (await js.stream_info(name)).state.messages
        except nats.js.errors.NotFoundError:
            return -1
    return run(_with_js(count, url))


def stream_messages(name: str, url: str = URL) -> List[Seen]:
    """Every message of the stream in stored order."""
    async def read(js):
        info = await js.stream_info(name)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(name, seq)
            out.append(Seen(msg.subject, msg.data or b"", dict(msg.headers or {})))
        return out
    return run(_with_js(read, url))


@contextlib.contextmanager
def stream(subjects: List[str], name: Optional[str] = None):
    """A JetStream stream that exists for the block (deleted afterwards, even on failure)."""
    name = name or f"IT_{uuid.uuid4().hex[:10].upper()}"
    create_stream(name, subjects)
    try:
        yield name
    finally:
        delete_stream(name)


# -- the shared server -------------------------------------------------------------------------

def server_process() -> Optional[psutil.Process]:
    """The nats-server listening on port 4222 (however it was started)."""
    return nats_server_on(4222)


def port_open(port: int = 4222) -> bool:
    return servers.port_open(port)


def jetstream_ready() -> bool:
    async def ping(js):
        await js.account_info()
        return True
    try:
        return run(_with_js(ping))
    except Exception:
        return False


def start_server() -> None:
    subprocess.run(START_COMMAND, check=True)
    wait_until(port_open, 30, message="nats-server listening on 127.0.0.1:4222")
    wait_until(jetstream_ready, 30, message="JetStream ready")


def stop_server() -> None:
    proc = server_process()
    if proc is None:
        return
    proc.terminate()     # lame-duck free, clean shutdown: JetStream flushes its files
    proc.wait(30)
    wait_until(lambda: not port_open(), 10, message="nats-server stopped")


@contextlib.contextmanager
def nats_outage():
    """Stop the shared nats-server for the block; ``start()`` ends the outage early.  The
    server is running again (started with the standard command) when the block exits."""
    class Outage:
        started_again = False

        def start(self) -> None:
            start_server()
            self.started_again = True

    outage = Outage()
    stop_server()
    try:
        yield outage
    finally:
        if not port_open() or server_process() is None:
            start_server()


def wait_stream_count(name: str, count: int, timeout: float = 60.0) -> int:
    return wait_until(lambda: (lambda c: c if c >= count else None)(stream_count(name)),
                      timeout, message=f"{count} messages in stream {name} "
                                       f"(has {stream_count(name)})")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateServer:
    """A nats-server of this test only (own port and JetStream directory), started on demand
    and always stopped afterwards, by its pid."""

    def __init__(self, store_dir):
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.store_dir = store_dir
        self.proc: Optional[subprocess.Popen] = None

    def start(self, *options: str) -> None:
        """Start it, with nats-server ``options`` (``--auth TOKEN``, ``--tls`` ...)."""
        self.proc = subprocess.Popen([NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port),
                                      "-js", "-sd", str(self.store_dir), *options],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: port_open(self.port), 30, message=f"private nats-server on {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def private_nats(tmp_path):
    server = PrivateServer(tmp_path / "jetstream")
    yield server
    server.stop()


def sleep_until(deadline: float) -> None:
    """Wait for a moment in time (an outage's length), not for a condition."""
    while time.monotonic() < deadline:
        time.sleep(0.05)
