"""MongoDB for the integration tests (import the fixtures into a test module).

By default every test gets its own SecantusDB server, started in-process on a free port of
127.0.0.1 with its data in the test's tmp_path, and stopped afterwards.  SecantusDB
(``pip install SecantusDB``, measured with 0.7.0b3) speaks the MongoDB wire protocol, presents
itself as a one-node replica set and implements change streams.

With ``LAPIDUS_TEST_MONGO_URI`` set (a replica set or sharded cluster, e.g.
``mongodb://127.0.0.1:27017/?replicaSet=rs0``) the ``mongo`` fixture uses that deployment
instead: each test works in its own database ``lapidus_it_<random>``, dropped afterwards, and
the tests SecantusDB cannot run are run too.  Tests that need to break a server on purpose
(standalone mode, a truncated oplog, authentication, TLS) always start their own SecantusDB
through ``secantus_factory``: that cannot be done to a shared deployment.

What SecantusDB 0.7.0b3 does and does not do, measured (docs/mongodb.md has the table):
supported: change streams on a database or the whole deployment, insert/update/replace/delete,
``fullDocument: updateLookup`` (looked up when the change is read, as in mongod), pre-images
(``changeStreamPreAndPostImages`` + ``fullDocumentBeforeChange``), multi-document transactions
with ``lsid``/``txnNumber`` on their changes, ``drop``/``rename``/``dropDatabase`` and
``invalidate``, ``resumeAfter``, ``startAfter`` (and refusing ``resumeAfter`` for an invalidate
token, code 260), ``postBatchResumeToken`` advancing on other databases' writes,
``maxAwaitTimeMS``, ``$match`` with ``$regex``/``$nor``/``$or``/``$nin``,
ChangeStreamHistoryLost (286) when resuming before the oplog's start, code 47 for a missing
``required`` image, SCRAM authentication, TLS, a standalone mode (no change streams, code 40573).
Not like mongod: post-images (``fullDocument: whenAvailable/required``) are a live lookup, not
the document as it was right after the update; ``truncatedArrays`` is never reported (a
shortened array comes as a whole new array in ``updatedFields``); an *open* cursor whose oplog
entries are pruned skips them silently instead of failing with history lost; ``txnNumber`` is
an int32 instead of a long.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List

import orjson
import pymongo
import pytest
import structlog

from lapidus.checkpoint import CheckpointStore
from lapidus.config import BackendConfig
from lapidus.events import Event, encode
from lapidus.workers.base import Batch
from lapidus.workers.mongo import MongoSource

URI_ENV = "LAPIDUS_TEST_MONGO_URI"

# Features SecantusDB lacks (tests call ``mongo.require(feature)``; skipped only on SecantusDB).
SECANTUS_LACKS: Dict[str, str] = {
    "stored_post_images": (
        "SecantusDB 0.7.0b3 does not store post-images: fullDocument whenAvailable/required is "
        "a live lookup when the change is read, not the document right after the update"),
    "truncated_arrays": (
        "SecantusDB 0.7.0b3 never reports updateDescription.truncatedArrays (a shortened array "
        "comes as a whole new array in updatedFields)"),
}

POSITION = re.compile(r"^[0-9A-Fa-f]+$")
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@dataclass
class MongoTarget:
    """The deployment a test talks to, and a client for making changes in it."""

    uri: str
    host: str
    port: int
    database: str
    client: pymongo.MongoClient
    secantus: Any = None                    # the SecantusDBServer, when it is one
    extra_databases: List[str] = field(default_factory=list)

    @property
    def db(self):
        return self.client[self.database]

    @property
    def external(self) -> bool:
        return self.secantus is None

    def require(self, feature: str) -> None:
        """Skip the test on SecantusDB when it lacks ``feature`` (never on a real server)."""
        if self.secantus is not None and feature in SECANTUS_LACKS:
            pytest.skip(SECANTUS_LACKS[feature])

    def require_version(self, major: int, what: str) -> None:
        version = self.client.server_info().get("versionArray", [0])
        if self.secantus is None and version[0] < major:
            pytest.skip(f"{what} needs MongoDB {major}.0+, the server at {URI_ENV} is "
                        f"{'.'.join(map(str, version))}")

    def other_database(self, suffix: str) -> str:
        name = f"{self.database}_{suffix}"
        self.extra_databases.append(name)
        return name


def start_secantus(directory: Path, **options):
    from secantus import SecantusDBServer

    server = SecantusDBServer(host="127.0.0.1", port=0, storage_path=str(directory), **options)
    server.start()
    return server


def stop_secantus(server) -> None:
    # stop() closes the listening socket, which does not wake the thread blocked in accept()
    # on Linux; it then waits 2 s for that thread.  shutdown() does wake it.
    sock = getattr(server, "_socket", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    server.stop()


@pytest.fixture
def mongo(tmp_path):
    """A MongoDB deployment with change streams and a fresh database for this test."""
    uri = os.environ.get(URI_ENV)
    server = None
    if uri:
        client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000)
        nodes = pymongo.uri_parser.parse_uri(uri)["nodelist"]
        host, port = nodes[0]
        database = f"lapidus_it_{uuid.uuid4().hex[:10]}"
    else:
        server = start_secantus(tmp_path / "secantus")
        host, port = server.address
        uri = f"mongodb://{host}:{port}/"
        client = pymongo.MongoClient(uri)
        database = "shop"
    target = MongoTarget(uri, host, port, database, client, server)
    try:
        yield target
    finally:
        if server is None:
            for name in [database] + target.extra_databases:
                client.drop_database(name)
        client.close()
        if server is not None:
            stop_secantus(server)


@pytest.fixture
def mongo_process(request, tmp_path):
    """Like ``mongo``, but SecantusDB runs in a process of its own: for tests whose own
    threads (a busy writer, polling) would otherwise share the server's interpreter lock and
    slow it down many times over.  With ``LAPIDUS_TEST_MONGO_URI``: the ``mongo`` fixture."""
    if os.environ.get(URI_ENV):
        yield request.getfixturevalue("mongo")
        return
    port = free_port()
    config = tmp_path / "secantusd.toml"
    config.write_text("")                     # no auto-discovered configuration file
    log = open(tmp_path / "secantus.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "secantus", "--config", str(config), "--host", "127.0.0.1",
         "--port", str(port), "--storage-path", str(tmp_path / "secantus"),
         "--log-level", "WARNING"], stdout=log, stderr=subprocess.STDOUT)
    uri = f"mongodb://127.0.0.1:{port}/"
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=500)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.admin.command("ping")
                break
            except pymongo.errors.PyMongoError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    output = (tmp_path / "secantus.log").read_text()[-2000:]
                    pytest.fail(f"SecantusDB did not start: {output}")
        yield MongoTarget(uri, "127.0.0.1", port, "shop", client, proc)
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def secantus_factory(tmp_path):
    """Start SecantusDB servers with special options; every one is stopped after the test."""
    started = []

    def start(**options):
        server = start_secantus(tmp_path / f"secantus-{len(started)}", **options)
        started.append(server)
        return server

    yield start
    for server in started:
        stop_secantus(server)


@pytest.fixture
def sources(tmp_path):
    """``sources(target_or_options, ...)`` makes MongoSources that are closed after the test."""
    made: List[MongoSource] = []

    def make(options: Dict[str, Any], *, state: str = "state", name: str = "cms",
             include=(), exclude=()) -> MongoSource:
        backend = BackendConfig(name=name, type="mongo", options=dict(options),
                                include_tables=tuple(include), exclude_tables=tuple(exclude))
        source = MongoSource(backend, tmp_path / state, structlog.get_logger(backend=name))
        made.append(source)
        return source

    yield make
    for source in made:
        source.close()


def options_for(target: MongoTarget, **extra) -> Dict[str, Any]:
    options = {"uri": target.uri, "database": target.database}
    options.update(extra)
    return options


class Pump:
    """Drives a source like the worker loop: read, deliver, save the checkpoint, commit.

    ``delivered`` holds every event in delivery order.  Waiting is on conditions with a
    deadline, never a fixed sleep.
    """

    def __init__(self, source: MongoSource, state_dir: Path):
        self.source = source
        self.store = CheckpointStore(state_dir)
        self.delivered: List[Event] = []
        self.batches: List[Batch] = []

    def open(self) -> "Pump":
        self.source.open(self.store.load())
        return self

    def step(self, max_events: int = 1000, timeout: float = 0.2) -> Batch:
        batch = self.source.read(max_events, timeout)
        if batch.events:
            self.batches.append(batch)
        self.delivered.extend(batch.events)
        if batch.checkpoint is not None:
            self.store.save(batch.checkpoint)
            self.source.commit(batch.checkpoint)
        return batch

    def until(self, predicate: Callable[[List[Event]], bool], what: str,
              timeout: float = 30.0, max_events: int = 1000) -> List[Event]:
        deadline = time.monotonic() + timeout
        while not predicate(self.delivered):
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout}s waiting for {what}; delivered "
                            f"{len(self.delivered)}: {[stable(e) for e in self.delivered[-5:]]}")
            self.step(max_events)
        return self.delivered

    def until_count(self, count: int, timeout: float = 30.0) -> List[Event]:
        return self.until(lambda d: len(d) >= count, f"{count} events", timeout)

    def quiet(self, timeout: float = 0.5) -> List[Event]:
        """Read for ``timeout`` seconds and return what arrived (expected: nothing)."""
        before = len(self.delivered)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.step(timeout=0.1)
        return self.delivered[before:]


def stable(event: Event) -> dict:
    """The encoded event without the fields that differ per run, after checking their form."""
    data = orjson.loads(encode(event))
    assert POSITION.match(data["position"]), data
    assert data["id"] == f'{data["backend"]}:{data["position"]}:0', data
    assert TIMESTAMP.match(data["ts"]), data
    for key in ("id", "position", "ts"):
        data.pop(key)
    return data


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_tls_files(directory: Path) -> Dict[str, str]:
    """A throw-away CA and a server certificate for 127.0.0.1 (needs the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "1", "-subj", "/CN=lapidus test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return {"ca": str(ca), "cert": str(cert), "key": str(key)}


__all__ = ["mongo", "mongo_process", "secantus_factory", "sources", "MongoTarget", "Pump", "options_for",
           "stable", "free_port", "make_tls_files", "SECANTUS_LACKS", "URI_ENV"]
