"""``lapidus`` streaming to stdout into a pipe whose reader pauses; the dispatcher is killed
with SIGKILL in the middle of a batch; the next dispatcher's lines must not be glued to half
an event: the consumer reads only whole JSON lines, every row among them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import psutil

from bench.chaos.lapidus import stop_group
from tests.conftest import wait_until
from tests.integration.conftest import pg_backend
from tests.unit.test_stdout_sink import blocked_writing

ROWS = 3000


def dispatcher(supervisor: int):
    for child in psutil.Process(supervisor).children(recursive=True):
        try:
            if child.name() == "lapidus:dispatc":
                return child
        except psutil.NoSuchProcess:
            pass
    return None


def test_a_dispatcher_killed_while_writing_to_a_full_pipe_leaves_no_torn_line(pg_db, tmp_path):
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    config = {"backends": [pg_backend(pg_db)], "state_dir": str(tmp_path / "state"),
              "log": {"format": "json", "level": "info"}, "plugins": {"stdout": {}}}
    (tmp_path / "lapidus.json").write_text(json.dumps(config))
    log_path = tmp_path / "lapidus.log"
    read_fd, write_fd = os.pipe()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "lapidus", "-c",
                                 str(tmp_path / "lapidus.json")],
                                stdout=write_fd, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=tmp_path)
    os.close(write_fd)
    received = bytearray()
    reader = None
    try:
        wait_until(lambda: '"streaming"' in log_path.read_text(), 60,
                   message="lapidus streaming")
        # Nobody reads yet: the dispatcher fills the pipe and blocks in mid-batch.
        pg_db.sql(f"INSERT INTO t SELECT g, repeat('x', 300) FROM generate_series(1, {ROWS}) g")
        first = wait_until(lambda: (lambda d: d if d and blocked_writing(d.pid) else None)(
            dispatcher(proc.pid)), 60, message="the dispatcher blocked on the full pipe")
        first.send_signal(signal.SIGKILL)
        first.wait(30)

        def drain():
            while True:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    return
                received.extend(chunk)
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()

        def ids_seen():
            data = bytes(received)
            whole = data[:data.rfind(b"\n") + 1]
            return {line for line in whole.split(b"\n") if b'"type":"insert"' in line}

        wait_until(lambda: len(ids_seen()) >= ROWS, 120,
                   message=f"{ROWS} rows on stdout after the dispatcher's restart; log:\n"
                           f"{log_path.read_text()[-3000:]}")
    finally:
        stop_group(proc, 15)
        if reader is not None:
            reader.join(30)
        os.close(read_fd)
    lines = bytes(received).split(b"\n")
    assert lines[-1] == b""                      # ends with a whole line
    events = []
    for number, line in enumerate(lines[:-1]):
        try:
            events.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"line {number} is not one JSON event (torn and glued?): "
                                 f"{line[:120]!r} ... {line[-120:]!r}") from None
    inserted = {tuple(e["pk"].values())[0] if isinstance(e.get("pk"), dict) else e.get("pk")
                for e in events if e["type"] == "insert"}
    assert len(inserted) == ROWS
