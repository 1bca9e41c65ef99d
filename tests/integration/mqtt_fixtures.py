"""A private Mosquitto per test, and a subscriber that records what it delivers.

* :class:`Broker` runs ``/usr/sbin/mosquitto -c FILE`` on a free loopback port with a config
  of its own (persistence in the test's directory, no queue limit for a subscriber that falls
  behind, optionally a password file); ``stop()`` and ``start()`` again on the same port make
  an outage.  With ``tls=`` a :class:`tests.integration.tls_fixtures.Pki` it also listens
  with TLS (its server certificate) on ``tls_port`` (``tls_url``), the plain listener staying
  for the test's subscriber.  Always stopped, by its pid, at the end.  The shared Mosquitto on
  1883 is never touched.
* :class:`Subscriber` is paho-mqtt in a process of its own: MQTT 5, QoS 1, a persistent session
  (so what the broker acknowledged to Lapidus reaches it across a broker restart), recording
  topic, payload and user properties.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import paho.mqtt.client as mqtt
import pytest

from bench.chaos.servers import free_ports
from tests.conftest import wait_until

MOSQUITTO = "/usr/sbin/mosquitto"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Broker:
    def __init__(self, directory: Path, users: Optional[Dict[str, str]] = None,
                 acl: Optional[str] = None, tls=None):
        self.directory = directory
        # both at once: a second free_port() may return the first one again
        self.port, tls_port = free_ports(2)
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        directory.mkdir(parents=True, exist_ok=True)
        lines = [f"listener {self.port} 127.0.0.1", "persistence true",
                 f"persistence_location {directory}/", "max_queued_messages 0",
                 "max_inflight_messages 0",
                 "log_dest none",
                 # started as root, mosquitto would switch to the user mosquitto, who may not
                 # read the test's directory (persistence, password file)
                 "user root"]
        if users:
            passwords = directory / "passwords"
            passwords.write_text("")
            for user, password in users.items():
                subprocess.run(["mosquitto_passwd", "-b", str(passwords), user, password],
                               check=True, capture_output=True)
            lines += ["allow_anonymous false", f"password_file {passwords}"]
            if acl is not None:          # mosquitto acl_file lines ("user x", "topic write t")
                (directory / "acl").write_text(acl)
                lines.append(f"acl_file {directory / 'acl'}")
        else:
            lines.append("allow_anonymous true")
        if tls is not None:
            # after the plain listener's settings: cafile/certfile/keyfile belong to the
            # listener above them
            self.tls_port = tls_port
            self.tls_url = f"mqtts://127.0.0.1:{self.tls_port}"
            lines += [f"listener {self.tls_port} 127.0.0.1", f"cafile {tls.ca}",
                      f"certfile {tls.server_cert}", f"keyfile {tls.server_key}"]
        self.config = directory / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ports = [self.port] + ([self.tls_port] if hasattr(self, "tls_port") else [])
        wait_until(lambda: all(map(port_open, ports)) or self.proc.poll() is not None, 20,
                   message=f"private mosquitto on {ports}")
        assert self.proc.poll() is None, "mosquitto exited at start"

    def stop(self) -> None:
        """TERM (it saves its persistence file), KILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def broker(tmp_path):
    """``broker(users=None)`` -> a started :class:`Broker`, stopped after the test."""
    started: List[Broker] = []

    def start(**options) -> Broker:
        b = Broker(tmp_path / f"mosquitto-{len(started)}", **options)
        b.start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


class Seen(NamedTuple):
    topic: str
    event: dict
    properties: Dict[str, str]


class Subscriber:
    """The subscriber runs in a process of its own (``python -m tests.integration.mqtt_fixtures
    PORT TOPIC FILE``): in the test process it would share the GIL with the test's threads and
    fall far behind a QoS 1 stream.  It appends one JSON line per message to FILE."""

    def __init__(self, port: int, topic: str, out: Path, username=None, password=None):
        self.out = out
        self._parsed: List[Seen] = []
        self._offset = 0
        argv = [sys.executable, "-m", "tests.integration.mqtt_fixtures", str(port), topic,
                str(out)]
        if username:
            argv += [username, password]
        self.proc = subprocess.Popen(argv, cwd=str(Path(__file__).resolve().parents[2]))
        wait_until(lambda: out.exists() or self.proc.poll() is not None, 15,
                   message="the test subscriber connected and subscribed")
        assert self.proc.poll() is None, "the test subscriber exited"

    def seen(self) -> List[Seen]:
        with open(self.out, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            item = json.loads(line)
            self._parsed.append(Seen(item["topic"], json.loads(item["payload"]),
                                     dict(item["properties"])))
        return list(self._parsed)

    def events(self) -> List[dict]:
        return [m.event for m in self.seen()]

    def wait_distinct(self, count: int, timeout: float = 60.0) -> List[Seen]:
        return wait_until(lambda: (lambda m: m if len({s.event["id"] for s in m}) >= count
                                   else None)(self.seen()), timeout,
                          message=f"{count} distinct events at the subscriber")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def run_subscriber(port: int, topic: str, out: str, username=None, password=None) -> None:
    """The subscriber process: MQTT 5, QoS 1, a persistent session (what the broker holds
    for it survives the broker's restart), reconnecting; writes ``out`` once subscribed."""
    lines = open(out + ".part", "w", buffering=1 << 16)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2,
                         client_id=f"test-sub-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5)
    if username:
        client.username_pw_set(username, password)
    client.reconnect_delay_set(0.1, 0.5)

    def on_message(c, userdata, message):
        props = getattr(message.properties, "UserProperty", None) or []
        lines.write(json.dumps({"topic": message.topic,
                                "payload": message.payload.decode(),
                                "properties": props}) + "\n")

    def on_subscribe(c, userdata, mid, codes, properties=None):
        if not os.path.exists(out):
            os.rename(out + ".part", out)

    client.on_message = on_message
    client.on_connect = lambda c, u, f, rc, p=None: c.subscribe(topic, qos=1)
    client.on_subscribe = on_subscribe
    client.on_socket_open = lambda c, u, sock: sock.setsockopt(
        socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.connect("127.0.0.1", port, clean_start=False, properties=_session_forever())
    client.loop_start()
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    try:
        while True:
            time.sleep(0.05)
            lines.flush()        # whole lines only: the test reads up to the last newline
    finally:
        lines.flush()


def _session_forever():
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    return props


@pytest.fixture
def subscribe(tmp_path):
    """``subscribe(port, topic)`` -> a connected :class:`Subscriber`, closed after the test."""
    made: List[Subscriber] = []

    def make(port: int, topic: str, **options) -> Subscriber:
        s = Subscriber(port, topic, tmp_path / f"subscriber-{len(made)}.jsonl", **options)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


if __name__ == "__main__":
    run_subscriber(int(sys.argv[1]), sys.argv[2], sys.argv[3], *sys.argv[4:6])
