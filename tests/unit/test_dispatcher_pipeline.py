"""Unit tests: a backend's Pipeline delivers queued batches in order, merged up to its limit,
and acknowledges each delivery with the last batch's sequence number."""

from __future__ import annotations

import asyncio

import structlog

from lapidus.config import parse_config
from lapidus.sinks.base import Delivery
from lapidus.supervisor.dispatcher import Dispatcher, Pipeline
from lapidus.transport import ACK, HELD, unpack_from


class RecordingSink:
    shared = False

    def __init__(self, wants_transaction_ends=False):
        self.wants_transaction_ends = wants_transaction_ends
        self.deliveries = []
        self.boundaries = []

    async def send(self, records):
        self.deliveries.append(list(records))
        self.boundaries.append(records.at_boundary)


class RecordingWriter:
    def __init__(self):
        self.data = bytearray()

    def write(self, data):
        self.data += data

    def is_closing(self):
        return False

    def acks(self):
        frames, _ = unpack_from(self.data)
        return [payload for kind, payload in frames if kind == ACK]

    def frames(self):
        return unpack_from(self.data)[0]


def deliver(merge_up_to, batches, stale=(), sinks=None):
    """Queue ``batches`` (seq, records[, at_boundary]) before the pipeline runs; ``stale``
    seqs come from an older connection of the worker.  The deliveries of the first of
    ``sinks`` (default: one RecordingSink) and the acks, once the last batch is acked."""
    async def run():
        recorders, writer = sinks or [RecordingSink()], RecordingWriter()
        pipeline = Pipeline("crm", recorders, structlog.get_logger(), merge_up_to=merge_up_to)
        generation = pipeline.attach(writer)
        for seq, records, *boundary in batches:
            pipeline.queue.put_nowait((generation - 1 if seq in stale else generation, seq,
                                       Delivery(records, *boundary)))
        task = asyncio.create_task(pipeline.run())
        last = max(seq for seq, *_ in batches if seq not in stale)
        while last not in writer.acks():
            await asyncio.sleep(0)
        task.cancel()
        return recorders[0].deliveries, writer.acks()
    return asyncio.run(run())


def test_queued_batches_are_merged_up_to_the_limit_in_order():
    batches = [(1, ["a", "b"]), (2, ["c"]), (3, ["d"]), (4, ["e", "f"]), (5, ["g"])]
    deliveries, acks = deliver(2, batches)
    assert deliveries == [["a", "b", "c"], ["d", "e", "f"], ["g"]]
    assert acks == [2, 4, 5]


def test_without_merging_every_batch_is_its_own_delivery():
    deliveries, acks = deliver(1, [(1, ["a"]), (2, ["b"])])
    assert deliveries == [["a"], ["b"]] and acks == [1, 2]


def test_batches_of_an_older_connection_are_not_merged_in():
    deliveries, acks = deliver(3, [(1, ["a"]), (2, ["old"]), (3, ["c"])], stale={2})
    assert deliveries == [["a", "c"]] and acks == [3]


def test_a_merged_delivery_ends_where_its_last_batch_ends():
    sink = RecordingSink()
    deliver(2, [(1, ["a"], True), (2, ["b"], False), (3, ["c"], False), (4, ["d"], True),
                (5, ["e"], True)], sinks=[sink])
    assert sink.deliveries == [["a", "b"], ["c", "d"], ["e"]]
    assert sink.boundaries == [False, True, True]


def test_an_empty_batch_gives_the_last_record_again_at_the_boundary_to_who_wants_it():
    """The worker read the COMMIT of the last batch's transaction without events: the sinks
    that apply whole transactions get its last record again, marked; the others nothing."""
    whole, plain = RecordingSink(wants_transaction_ends=True), RecordingSink()
    deliveries, acks = deliver(1, [(1, ["a", "b"], False), (2, [], True)],
                               sinks=[whole, plain])
    assert whole.deliveries == [["a", "b"], ["b"]] and whole.boundaries == [False, True]
    assert plain.deliveries == [["a", "b"]]
    assert acks == [1, 2]


def test_an_empty_batch_merged_behind_another_marks_its_end():
    sink = RecordingSink(wants_transaction_ends=True)
    deliver(2, [(1, ["a"], False), (2, [], True)], sinks=[sink])
    assert sink.deliveries == [["a"]] and sink.boundaries == [True]


def test_an_empty_batch_with_nothing_before_it_on_the_connection_delivers_nothing():
    """What it would mark was of an older connection (or is unknown): acked, not sent."""
    sink = RecordingSink(wants_transaction_ends=True)
    deliveries, acks = deliver(1, [(1, ["old"], False), (2, [], True)], stale={1},
                               sinks=[sink])
    assert deliveries == [] and acks == [2]


def test_a_shared_sink_with_a_backends_own_options_gets_its_own_instance(tmp_path):
    """stdout serves every backend from one instance per file descriptor: a backend whose own
    plugins send it to fd 2 must not get the global fd 1 instance (or the other way round)."""
    config = parse_config({
        "state_dir": str(tmp_path),
        "backends": [{"name": "a", "type": "postgresql", "database": "a"},
                     {"name": "b", "type": "postgresql", "database": "b",
                      "plugins": {"stdout": {"fd": 2}}},
                     {"name": "c", "type": "postgresql", "database": "c",
                      "plugins": {"stdout": {"fd": 1}}}],
        "plugins": {"stdout": {}}}, source=str(tmp_path / "lapidus.toml"), env={})

    async def run():
        dispatcher = Dispatcher(config, str(tmp_path / "d.sock"), structlog.get_logger())
        pipelines = [await dispatcher.pipeline_for(name) for name in ("a", "b", "c")]
        for task in dispatcher.tasks:
            task.cancel()
        return [pipeline.sinks[0] for pipeline in pipelines]

    a, b, c = asyncio.run(run())
    assert (a.fd, b.fd, c.fd) == (1, 2, 1)
    assert a is c and a is not b          # one writer (and lock) per descriptor


def test_pipeline_health_names_sinks_by_plugin_and_survives_a_failing_health():
    class Connected(RecordingSink):
        def health(self):
            return {"connected": True, "down_seconds": None}

    class Broken(RecordingSink):
        def health(self):
            raise RuntimeError("boom")

    class Plain(RecordingSink):
        def health(self):
            return None

    pipeline = Pipeline("shop", [Connected(), Broken(), Plain()], structlog.get_logger(),
                        names=["nats", "webhook", "stdout"])
    health = pipeline.health()
    assert health["nats"] == {"connected": True, "down_seconds": None}
    assert "boom" in health["webhook"]["error"]
    assert "stdout" not in health


def test_a_pipeline_asked_for_twice_at_once_is_made_once(tmp_path, monkeypatch):
    """The start's pipeline and the one a worker's HELLO asks for meanwhile: one set of sinks,
    not two (a second sync sink would find the first one's lock on the target taken)."""
    made = []

    class SlowSink:
        shared = merge_batches = False

        def __init__(self, options, backend):
            made.append(self)

        async def start(self):
            await asyncio.sleep(0.01)       # a connection being made

        async def send(self, records):
            pass

    monkeypatch.setattr("lapidus.supervisor.dispatcher.registry.load", lambda name: SlowSink)
    config = parse_config({
        "state_dir": str(tmp_path),
        "backends": [{"name": "a", "type": "postgresql", "database": "a"}],
        "plugins": {"stdout": {}}}, source=str(tmp_path / "lapidus.toml"), env={})

    async def run():
        dispatcher = Dispatcher(config, str(tmp_path / "d.sock"), structlog.get_logger())
        first, second = await asyncio.gather(dispatcher.pipeline_for("a"),
                                             dispatcher.pipeline_for("a"))
        for task in dispatcher.tasks:
            task.cancel()
        return first, second

    first, second = asyncio.run(run())
    assert first is second and len(made) == 1


def test_a_worker_whose_sinks_cannot_start_is_told_they_hold_it(tmp_path, monkeypatch):
    """While a backend's sinks cannot be made, each failed attempt tells its worker (HELD)."""
    attempts = []

    class NotStarting(RecordingSink):
        merge_batches = False

        def __init__(self, options, backend):
            super().__init__()

        async def start(self):
            attempts.append(1)
            if len(attempts) == 1:
                raise ConnectionError("the server refused")

    monkeypatch.setattr("lapidus.supervisor.dispatcher.registry.load", lambda name: NotStarting)
    monkeypatch.setattr("lapidus.supervisor.dispatcher.Backoff.next", lambda self: 0.0)
    config = parse_config({
        "state_dir": str(tmp_path),
        "backends": [{"name": "a", "type": "postgresql", "database": "a"}],
        "plugins": {"redis": {}}}, source=str(tmp_path / "lapidus.toml"), env={})

    async def run():
        dispatcher, writer = Dispatcher(config, str(tmp_path / "d.sock"),
                                        structlog.get_logger()), RecordingWriter()
        pipeline = await asyncio.wait_for(
            dispatcher._pipeline_when_ready({"backend": "a"}, writer), 10)
        for task in dispatcher.tasks:
            task.cancel()
        return pipeline, writer.frames()

    pipeline, frames = asyncio.run(run())
    assert len(attempts) == 2 and pipeline.names == ["redis"]
    assert frames == [(HELD, ["redis"])]


def test_a_failing_batch_is_not_retried_once_its_worker_is_gone():
    """The worker's restart sends it again from its checkpoint; in cluster mode another node
    may stream the backend by then, so a late retry here must not happen."""
    class Failing(RecordingSink):
        async def send(self, records):
            self.deliveries.append(list(records))
            raise ConnectionError("sink down")

    async def run():
        sink, writer = Failing(), RecordingWriter()
        pipeline = Pipeline("crm", [sink], structlog.get_logger())
        generation = pipeline.attach(writer)
        pipeline.queue.put_nowait((generation, 1, Delivery(["a"])))
        task = asyncio.create_task(pipeline.run())
        while not sink.deliveries:
            await asyncio.sleep(0.01)
        pipeline.attach(None)                 # the worker's connection closed
        await asyncio.sleep(0.5)              # longer than the first retry delay (0.2 s)
        tries = len(sink.deliveries)
        await asyncio.sleep(0.5)
        task.cancel()
        return tries, len(sink.deliveries), writer.acks(), pipeline.delivered

    tries, later, acks, delivered = asyncio.run(run())
    assert tries == later <= 2 and acks == [] and delivered == 0


def test_the_worker_is_told_which_sinks_hold_its_batch_while_they_are_down():
    """HELD names the sinks that report no connection, whose last delivery failed or that
    hold at a refused event, only while a batch waits; after the ack there is nothing to
    tell."""
    class Disconnected(RecordingSink):
        def __init__(self):
            super().__init__()
            self.up = asyncio.Event()

        async def send(self, records):
            await self.up.wait()          # as a sink waiting for its server does
            await super().send(records)

        def health(self):
            return {"connected": self.up.is_set(), "down_seconds": None}

    class Refusing(Disconnected):
        def health(self):
            return {"connected": True, "down_seconds": None}

    class FailingOnce(RecordingSink):
        async def send(self, records):
            await super().send(records)
            if len(self.deliveries) == 1:
                raise ConnectionError("refused")

        def health(self):
            return {"connected": True, "down_seconds": None}

    async def run():
        waiting, failing, writer = Disconnected(), FailingOnce(), RecordingWriter()
        refusing = Refusing()
        pipeline = Pipeline("crm", [waiting, failing, RecordingSink(), refusing],
                            structlog.get_logger(), names=["nats", "redis", "stdout", "mqtt"])
        # held at a refused event, as RefusedEvents.refused leaves it, until it takes one
        pipeline.refusals.held["mqtt"] = {"error": "payload too large"}
        generation = pipeline.attach(writer)
        pipeline.tell_held()
        idle = writer.frames()
        pipeline.queue.put_nowait((generation, 1, Delivery(["a"])))
        task = asyncio.create_task(pipeline.run())
        while not failing.deliveries:
            await asyncio.sleep(0.01)
        pipeline.tell_held()
        held = writer.frames()
        waiting.up.set()
        refusing.up.set()
        while not writer.acks():
            await asyncio.sleep(0.01)
        pipeline.tell_held()
        task.cancel()
        return idle, held, writer.frames()

    idle, held, after = asyncio.run(run())
    assert idle == []
    assert held == [(HELD, ["nats", "redis", "mqtt"])]
    assert after == [(HELD, ["nats", "redis", "mqtt"]), (ACK, 1)]


def test_the_dispatcher_repeats_unchanged_stats_only_as_a_keep_alive(tmp_path, monkeypatch):
    """Stats looked at every second: sent when they change, else at most a quarter of the
    supervisor's heartbeat_timeout (10 s at most) after the last report, on the grid the
    workers' keep-alives share, so an idle dispatcher does not wake the supervisor every
    second.  A fake clock: each one-second sleep moves it by a second."""
    from lapidus.supervisor import dispatcher as dispatcher_module

    config = parse_config({"state_dir": str(tmp_path), "plugins": {"stdout": {}},
                           "backends": [{"name": "a", "type": "postgresql", "database": "a"}]},
                          source=str(tmp_path / "lapidus.toml"), env={})
    clock = [1000.0]
    sent = []

    class Status:
        def send(self, message):
            sent.append((clock[0], message[1]["delivered"]))

    dispatcher = Dispatcher(config, str(tmp_path / "d.sock"), structlog.get_logger(), Status())
    dispatcher.stats = lambda: {"delivered": {"a": 7 if clock[0] >= 1033.0 else 0}}

    async def sleep(seconds):
        clock[0] += seconds
        if clock[0] >= 1060.0:
            dispatcher.status = None

    monkeypatch.setattr(dispatcher_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(dispatcher_module.asyncio, "sleep", sleep)
    asyncio.run(dispatcher.report_forever())
    assert [t for t, _ in sent] == [1000.0, 1010.0, 1020.0, 1030.0, 1033.0, 1040.0, 1050.0]
    assert [d for _, d in sent][3:5] == [{"a": 0}, {"a": 7}]     # the change at once
