"""The stdout sink: whole lines into a pipe, even when its writer is killed mid-batch."""

from __future__ import annotations

import array
import asyncio
import fcntl
import glob
import os
import signal
import subprocess
import sys
import termios
import textwrap

import pytest

from lapidus.events import Record
from lapidus.sinks.stdout import PIPE_BUF, StdoutSink, is_pipe, line_pieces
from tests.conftest import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lines_data(*sizes: int) -> bytes:
    return b"".join(b"x" * (size - 1) + b"\n" for size in sizes)


@pytest.mark.parametrize("sizes", [
    [300] * 100,                      # many pieces of whole lines
    [PIPE_BUF] * 3,                   # lines exactly the limit: one each
    [100, PIPE_BUF * 3, 100, 100],    # a line over the limit is a piece of its own
    [10],
])
def test_pieces_are_whole_lines_within_the_limit(sizes):
    data = lines_data(*sizes)
    pieces = list(line_pieces(data, PIPE_BUF))
    assert b"".join(data[a:b] for a, b in pieces) == data
    for start, end in pieces:
        piece = data[start:end]
        assert piece.endswith(b"\n")
        assert len(piece) <= PIPE_BUF or piece.count(b"\n") == 1
    # greedy: no two neighbouring pieces would have fitted into one
    for (a, b), (_, d) in zip(pieces, pieces[1:]):
        assert d - a > PIPE_BUF


def test_a_pipe_is_told_from_a_file(tmp_path):
    read, write = os.pipe()
    try:
        assert is_pipe(write)
        with open(tmp_path / "f", "wb") as f:
            assert not is_pipe(f.fileno())
    finally:
        os.close(read)
        os.close(write)


def test_a_file_gets_every_line(tmp_path):
    path = tmp_path / "out"
    recs = [Record(f"pg:0/1:{n}", "insert", "public", "t", (str(n),), "0/1",
                   b'{"n":%d}' % n) for n in range(3)]

    async def run():
        with open(path, "wb") as f:
            sink = StdoutSink({"fd": f.fileno()}, "*")
            await sink.send(recs)
    asyncio.run(run())
    assert path.read_bytes() == b'{"n":0}\n{"n":1}\n{"n":2}\n'


def test_a_non_blocking_pipe_gets_every_line_too():
    """A descriptor another process made non-blocking: a full pipe is waited on, not an
    error."""
    import threading
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    recs = [Record(f"pg:0/1:{n}", "insert", "public", "t", (str(n),), "0/1",
                   b'{"n":%06d,"p":"%s"}' % (n, b"x" * 280)) for n in range(1000)]
    received = []

    def reader():
        while True:
            chunk = os.read(read_fd, 1000)
            if not chunk:
                return
            received.append(chunk)
    thread = threading.Thread(target=reader)
    thread.start()
    try:
        asyncio.run(StdoutSink({"fd": write_fd}, "*").send(recs))
    finally:
        os.close(write_fd)
        thread.join(30)
        os.close(read_fd)
    assert b"".join(received) == b"".join(r.data + b"\n" for r in recs)


# A "dispatcher": writes one batch of BATCH lines of LINE bytes (newline included) through the
# sink into a pipe whose reader is paused.  LINE does not divide the pipe's 64 KiB, so
# one large write would stop in the middle of a line when the pipe fills.
LINE = 301
BATCH = 2000
WRITER = textwrap.dedent("""
    import asyncio, sys
    from lapidus.events import Record
    from lapidus.sinks.stdout import StdoutSink
    fd, tag, line, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    pad = "x" * (line - 1 - len('{"w":"","n":00000,"p":""}') - len(tag))
    recs = [Record(f"{tag}:{n}", "insert", "s", "t", (str(n),), "0/1",
                   ('{"w":"%s","n":%05d,"p":"%s"}' % (tag, n, pad)).encode())
            for n in range(count)]
    asyncio.run(StdoutSink({"fd": fd}, "*").send(recs))
""")


def start_writer(write_fd: int, tag: str, count: int = BATCH) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(write_fd), tag, str(LINE),
                             str(count)], cwd=ROOT, pass_fds=(write_fd,),
                            stdin=subprocess.DEVNULL)


def in_pipe(read_fd: int) -> int:
    buf = array.array("i", [0])
    fcntl.ioctl(read_fd, termios.FIONREAD, buf)
    return buf[0]


def read_some(read_fd: int, size: int) -> bytes:
    out = b""
    while len(out) < size:
        out += os.read(read_fd, size - len(out))
    return out


def blocked_writing(pid: int) -> bool:
    """Whether a thread of ``pid`` waits inside the kernel's pipe write (the pipe is full)."""
    for wchan in glob.glob(f"/proc/{pid}/task/*/wchan"):
        try:
            with open(wchan) as f:
                if "pipe_write" in f.read():
                    return True
        except OSError:
            pass
    return False


def test_a_writer_killed_mid_batch_leaves_only_whole_lines_in_the_pipe():
    """The reader pauses, the pipe fills in the middle of a batch, the writer gets SIGKILL:
    what it leaves must end with a whole line, so the next writer's first line is its own.
    Done at several points of the batch (the reader takes some bytes in between)."""
    read_fd, write_fd = os.pipe()
    received = b""
    try:
        for round_, take in enumerate([0, 10_000, 33_333]):
            writer = start_writer(write_fd, f"w{round_}")
            wait_until(lambda: in_pipe(read_fd) > 32768 and blocked_writing(writer.pid), 30,
                       message="the writer to fill the pipe")
            if take:
                # a slow reader: takes a little, the writer goes on and fills the pipe again
                # (what is left is counted before the read: the writer may refill the pipe
                # before a count after it)
                left = in_pipe(read_fd) - take
                received += read_some(read_fd, take)
                wait_until(lambda: in_pipe(read_fd) > left and blocked_writing(writer.pid), 30,
                           message="the writer to go on")
            assert writer.poll() is None, "the writer finished: the batch must exceed the pipe"
            writer.send_signal(signal.SIGKILL)
            writer.wait(30)
            received += read_some(read_fd, in_pipe(read_fd))
        # the next dispatcher writes a short batch after the killed ones
        last = start_writer(write_fd, "end", count=3)
        assert last.wait(30) == 0
        os.close(write_fd)
        write_fd = -1
        while True:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            received += chunk
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    assert received.endswith(b"\n")
    lines = received.split(b"\n")[:-1]
    assert all(len(line) == LINE - 1 and line.startswith(b'{"w":"') for line in lines), \
        [line[:60] for line in lines if len(line) != LINE - 1]
    assert lines[-3:] == [line for line in lines if line.startswith(b'{"w":"end"')]
