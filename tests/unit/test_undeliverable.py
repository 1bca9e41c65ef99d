"""Unit tests: an event a sink refuses for good is held (on_undeliverable = "hold") or moved to
the dead letters ("dead_letter") and the stream goes on; dead letters keep the event's exact
bytes and are sent again by a resend."""

from __future__ import annotations

import asyncio

import structlog

from lapidus import deadletters
from lapidus.events import Record
from lapidus.sinks.base import Delivery, UndeliverableError
from lapidus.supervisor import dispatcher as dispatcher_module
from lapidus.supervisor.dispatcher import Pipeline
from tests.unit.test_dispatcher_pipeline import RecordingWriter


def record(n: int, size: int = 10) -> Record:
    data = b'{"id":"b:%d","event":"x","item":{"v":"%s"}}' % (n, b"y" * size)
    return Record(f"b:{n}", "insert", "public", "t", (str(n),), f"0/{n}", data)


class RefusingSink:
    """Refuses, for good, every record larger than ``limit`` bytes (as NATS does above its
    max_payload); ``allow`` lifts the limit (the operator raised it)."""

    shared = False

    def __init__(self, limit: int):
        self.limit = limit
        self.delivered = []
        self.attempts = 0

    async def send(self, records):
        self.attempts += 1
        for index, rec in enumerate(records):
            if len(rec.data) > self.limit:
                raise UndeliverableError(index, f"{len(rec.data)} bytes is over the limit",
                                         "raise max_payload")
        self.delivered.extend(rec.id for rec in records)


async def run_until(predicate, pipeline, timeout=5.0):
    task = asyncio.create_task(pipeline.run())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)
    task.cancel()


def test_dead_letter_moves_the_refused_event_aside_and_the_stream_goes_on(tmp_path):
    path = tmp_path / "b" / deadletters.FILE

    async def main():
        sink, writer = RefusingSink(limit=100), RecordingWriter()
        pipeline = Pipeline("b", [sink], structlog.get_logger(), names=["nats"],
                            on_undeliverable="dead_letter", dead_letters=path)
        generation = pipeline.attach(writer)
        batch = Delivery([record(1), record(2, size=500), record(3)])
        pipeline.queue.put_nowait((generation, 1, batch))
        await run_until(lambda: writer.acks() == [1], pipeline)
        return sink, pipeline

    sink, pipeline = asyncio.run(asyncio.wait_for(main(), 10))
    assert sink.delivered == ["b:1", "b:3"]
    assert pipeline.refusals.count == 1
    (head, again), = list(deadletters.read(path))
    assert head["id"] == "b:2" and head["sink"] == "nats" and head["size"] == len(record(2, size=500).data)
    assert head["fix"] == "raise max_payload"
    assert again == record(2, size=500)      # the exact bytes, to be sent again


def test_a_boundary_after_a_dead_lettered_last_record_marks_the_one_before(tmp_path):
    """The last record of a batch went to the dead letters; the end of its transaction (an
    empty batch) gives the sink the last record it took, never the refused one again."""
    path = tmp_path / "b" / deadletters.FILE

    async def main():
        sink, writer = RefusingSink(limit=100), RecordingWriter()
        sink.wants_transaction_ends = True
        pipeline = Pipeline("b", [sink], structlog.get_logger(), names=["sync"],
                            on_undeliverable="dead_letter", dead_letters=path)
        generation = pipeline.attach(writer)
        pipeline.queue.put_nowait((generation, 1, Delivery([record(1), record(2, size=500)])))
        pipeline.queue.put_nowait((generation, 2, Delivery([], True)))
        await run_until(lambda: writer.acks() == [1, 2], pipeline)
        return sink

    sink = asyncio.run(asyncio.wait_for(main(), 10))
    assert sink.delivered == ["b:1", "b:1"]         # the mark: b:1 again, b:2 not
    assert [head["id"] for head, _ in deadletters.read(path)] == ["b:2"]


def test_hold_keeps_the_backend_at_the_event_until_the_sink_takes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(dispatcher_module, "HOLD_RETRY_MAX", 0.05)

    async def main():
        sink, writer = RefusingSink(limit=100), RecordingWriter()
        pipeline = Pipeline("b", [sink], structlog.get_logger(), names=["nats"],
                            dead_letters=tmp_path / "b" / deadletters.FILE)
        pipeline.queue.put_nowait((pipeline.attach(writer), 1, Delivery([record(1), record(2, 500)])))
        task = asyncio.create_task(pipeline.run())
        while sink.attempts < 3:
            await asyncio.sleep(0.01)
        held = dict(pipeline.refusals.held)
        assert writer.acks() == []            # nothing confirmed: the position stays
        sink.limit = 10_000                   # the operator fixed the cause
        while writer.acks() != [1]:
            await asyncio.sleep(0.01)
        task.cancel()
        return held, pipeline

    held, pipeline = asyncio.run(asyncio.wait_for(main(), 10))
    assert held["nats"]["id"] == "b:2" and held["nats"]["table"] == "public.t"
    assert held["nats"]["size"] == len(record(2, 500).data) and held["nats"]["fix"] == "raise max_payload"
    assert pipeline.refusals.held == {}
    assert not (tmp_path / "b" / deadletters.FILE).exists()   # nothing skipped


def test_a_resend_delivers_the_dead_letters_again_and_removes_the_file(tmp_path):
    path = tmp_path / "b" / deadletters.FILE
    for n in (7, 8):
        deadletters.append(path, record(n), backend="b", sink="nats", error="e", fix="f")
    path.rename(path.with_name(deadletters.RESEND_FILE))

    async def main():
        sink, writer = RefusingSink(limit=10_000), RecordingWriter()
        pipeline = Pipeline("b", [sink], structlog.get_logger(), names=["nats"],
                            on_undeliverable="dead_letter", dead_letters=path)
        pipeline.attach(writer)
        pipeline.request_resend()
        pipeline.request_resend()            # asked twice: sent once
        await run_until(lambda: not path.with_name(deadletters.RESEND_FILE).exists(), pipeline)
        return sink

    assert asyncio.run(asyncio.wait_for(main(), 10)).delivered == ["b:7", "b:8"]
    assert deadletters.count(path) == 0


def test_a_line_cut_off_by_a_crash_is_skipped(tmp_path):
    path = tmp_path / deadletters.FILE
    deadletters.append(path, record(1), backend="b", sink="nats", error="e", fix="")
    with open(path, "ab") as fh:
        fh.write(b'{"at": "2026", "id": "b:2", "ev')
    assert [head["id"] for head in deadletters.entries(path)] == ["b:1"]
