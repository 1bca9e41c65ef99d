"""Unit tests: snapshot runs made for one sink (lapidus.sink_runs): their ids and end event,
the request files that name the sink, the dispatcher's split of a routed batch, and the
websocket subscription that alone matches a client's run."""

from __future__ import annotations

import asyncio

import orjson
import pytest
import structlog

from lapidus.events import Record, batch_fields
from lapidus.sink_runs import END, end_event, run_label, run_of, split
from lapidus.sinks.base import Delivery
from lapidus.sinks.websocket.clients import Subscription
from lapidus.sinks.websocket.patterns import matcher
from lapidus.sinks.websocket.snapshots import RunSubject, tables_of
from lapidus.supervisor.dispatcher import Pipeline
from lapidus.workers.snapshot.events import read_events
from lapidus.workers.snapshot.progress import SnapshotProgress
from lapidus.workers.snapshot.requests import BackfillQueue
from lapidus.workers.snapshot.run import SnapshotRun
from tests.unit.test_dispatcher_pipeline import RecordingWriter


def records_of(events):
    return [Record(*fields) for fields in batch_fields(events)]


def reads(n, sink, keys, backend="shop"):
    rows = [(f"[{k}]", ({"id": k}, {"id": k, "v": "x"})) for k in keys]
    return records_of(read_events(backend, run_label(n, sink), "public", "items", rows,
                                  "0/16B3748", "2026-12-06T00:00:00Z"))


def change(k, backend="shop"):
    return Record(f"{backend}:0/16B3750:{k}", "update", "public", "items", (str(k),),
                  "0/16B3750", b"{}")


def test_a_sinks_run_has_ids_of_its_own_and_an_end_event():
    assert run_label(7, None) == "7" and run_label(7, "websocket") == "7@websocket"
    own, plain = reads(7, "websocket", [42]), reads(7, None, [42])
    assert own[0].id == "shop:read:7@websocket:public.items:[42]"
    assert plain[0].id == "shop:read:7:public.items:[42]"
    assert run_of(own[0], "shop") == "7@websocket"
    assert run_of(plain[0], "shop") is None and run_of(change(1), "shop") is None
    (end,) = records_of([end_event("shop", 7, "websocket", "public", "items", 3, "0/1",
                                   None)])
    assert (end.id, end.type) == ("shop:snapshot:7@websocket", END)
    assert run_of(end, "shop") == "7@websocket"
    assert orjson.loads(end.data)["item"] == {"rows": 3}
    # a backend whose name has the separator in it
    assert run_of(reads(2, "websocket", [1], backend="a:b")[0], "a:b") == "2@websocket"


def test_split_gives_a_runs_events_to_its_sink_only_and_keeps_order():
    batch = [change(1)] + reads(7, "websocket", [1, 2]) + reads(3, None, [5]) + [change(2)]
    for_all = [change(1)] + reads(3, None, [5]) + [change(2)]
    shares = split(batch, "shop", ["stdout", "websocket", "nats"])
    assert shares[0] == for_all and shares[2] == for_all
    assert shares[1] == batch
    # the run of a sink that is not there goes nowhere
    assert split(batch, "shop", ["stdout"]) == [for_all]


def test_a_routed_batch_reaches_each_sink_with_its_share_and_is_acked():
    class Recorder:
        shared = False
        wants_transaction_ends = False

        def __init__(self):
            self.deliveries = []

        async def send(self, records):
            self.deliveries.append((list(records), records.routed))

    async def run():
        stdout, websocket = Recorder(), Recorder()
        pipeline = Pipeline("shop", [stdout, websocket], structlog.get_logger(),
                            names=["stdout", "websocket"])
        writer = RecordingWriter()
        generation = pipeline.attach(writer)
        only_runs = reads(7, "websocket", [1, 2])
        pipeline.queue.put_nowait((generation, 1, Delivery(only_runs, routed=True)))
        pipeline.queue.put_nowait((generation, 2, Delivery([change(1)], routed=True)))
        task = asyncio.create_task(pipeline.run())
        while len(websocket.deliveries) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        return stdout.deliveries, websocket.deliveries, pipeline
    stdout, websocket, pipeline = asyncio.run(run())
    # stdout had nothing in the first batch: it is not called with an empty delivery
    assert stdout == [([change(1)], True)]
    assert websocket == [(reads(7, "websocket", [1, 2]), True), ([change(1)], True)]
    assert pipeline.last_records == [change(1), change(1)]


def test_requests_that_name_a_sink_survive_the_file_and_cancel_by_number(tmp_path):
    queue = BackfillQueue(tmp_path)
    first = queue.add("public.items", None, sink="websocket")
    second = queue.add("public.items", None)
    third = queue.add("orders", None, sink="websocket")
    assert [r.sink for r in queue.pending()] == ["websocket", None, "websocket"]
    assert queue.pending()[0].fields()["sink"] == "websocket"
    assert "sink" not in queue.pending()[1].fields()
    gone = queue.cancel(runs=[first.n, third.n])
    assert [r.n for r in gone] == [first.n, third.n]
    assert [r.n for r in queue.pending()] == [second.n]


def test_the_progress_of_a_sinks_run_keeps_its_sink_across_a_checkpoint():
    progress = SnapshotProgress(4, [("public", "items")], sink="websocket")
    again = SnapshotProgress.from_state(orjson.loads(orjson.dumps(progress.state())))
    assert again.sink == "websocket" and again.status()["sink"] == "websocket"
    progress.cancel()
    assert SnapshotProgress.from_state(progress.state()).sink == "websocket"
    assert "sink" not in SnapshotProgress(5, [("public", "t")]).state()


class _Run(SnapshotRun):
    def start_chunk(self):
        window = self.open_window("public", "items", ["id"])
        window.hold([({"id": k}, {"id": k}) for k in (1, 2)], [2])


@pytest.mark.parametrize("sink", [None, "websocket"])
def test_the_last_chunk_of_a_sinks_run_is_followed_by_its_end_event(sink):
    run = _Run("shop", {"snapshot_chunk_rows": 5}, SnapshotProgress(
        9, [("public", "items")], sink=sink), structlog.get_logger())
    run.start_chunk()
    events = []
    run.emit_window(events, "0/1", None)
    assert run.progress.done
    assert [e.id for e in events][:2] == [f"shop:read:{run_label(9, sink)}:public.items:[1]",
                                          f"shop:read:{run_label(9, sink)}:public.items:[2]"]
    if sink is None:
        assert len(events) == 2
    else:
        assert events[-1].id == "shop:snapshot:9@websocket" and events[-1].item == {"rows": 2}


def test_only_the_clients_of_a_run_match_its_events():
    entries = [("public.items.1", b"change"),
               (RunSubject("public.items.1", "7@websocket"), b"read-7"),
               (RunSubject("public.items.2", "8@websocket"), b"read-8"),
               (RunSubject("", "7@websocket", end=True), b"done-7"),
               (RunSubject("public.orders.1", "7@websocket"), b"read-7-orders")]
    plain = Subscription((("public.items.>",), None), matcher(["public.items.>"]))
    mine = plain.with_runs(frozenset({"7@websocket"}))
    assert plain.frames(entries) == (b"change", 1)
    assert mine.frames(entries) == (b"changeread-7done-7", 3)
    assert mine.key != plain.key        # no sharing of matched frames with other clients


def test_snapshot_tables_come_from_patterns_that_name_one_table():
    assert tables_of(["public.items.>", "public.items.4", "crm%2Ex.orders.*"]) == \
        ["public.items", "crm.x.orders"]
    for patterns in (None, ["public.>"], ["public.*.>"], ["*.items.>"], ["public.items"],
                     ["_message.x.>"]):
        with pytest.raises(ValueError, match="snapshot=1"):
            tables_of(patterns)


class FakeRequests:
    """SnapshotRequests' interface over a dict of pending runs (no files)."""

    def __init__(self, pending=()):
        self.sink = "websocket"
        self.unavailable = None
        self.pending = {n: None for n in pending}       # n -> refusal reason or None
        self.refusals = {}
        self.cancelled = []
        self.woken = 0

    def request(self, table):
        n = max([0, *self.pending, *self.refusals, *self.cancelled]) + 1
        self.pending[n] = table
        return n

    def wake(self):
        self.woken += 1

    def cancel(self, numbers):
        for n in numbers:
            self.pending.pop(n, None)
            self.cancelled.append(n)

    def settled(self, numbers):
        return {n: self.refusals.get(n) for n in numbers if n not in self.pending}

    def not_started(self, numbers):
        return [n for n in numbers if n in self.pending and min(self.pending) < n]

    def leftovers(self, keep=()):
        return [n for n in self.pending if n not in set(keep)]


class FakeClient:
    def __init__(self):
        self.written = []

    def write(self, data, count):
        self.written.append(orjson.loads(data[2:]))


def test_runs_of_clients_gone_are_cancelled_and_refused_or_cancelled_ones_are_told():
    from lapidus.sinks.websocket.snapshots import SnapshotRuns
    runs = SnapshotRuns(structlog.get_logger())
    requests = FakeRequests(pending=[1, 2])          # an earlier listener's clients' runs
    runs.attach("shop", requests)
    assert requests.cancelled == [1, 2]
    a, b = FakeClient(), FakeClient()
    labels, queued = runs.start(a, ["shop"], ["public.items", "public.orders"])
    assert labels == ["3@websocket", "4@websocket"] and requests.woken == 1
    assert b"public.orders" in queued
    runs.start(b, ["shop"], ["public.items"])                  # run 5
    assert runs.wanted("shop", "3@websocket") and not runs.wanted("shop", "1@websocket")
    # the worker refused 4; an operator cancelled 5
    requests.refusals[4] = "no such table"
    del requests.pending[4]
    del requests.pending[5]
    runs.check_settled()
    assert [(f["state"], f["n"]) for f in a.written] == [("refused", 4)]
    assert a.written[0]["reason"] == "no such table"
    assert [(f["state"], f["n"]) for f in b.written] == [("cancelled", 5)]
    runs.gone(a)
    assert requests.cancelled[-1:] == [3] and not runs.queued()


def test_the_dispatchers_requests_are_the_backends_queue_files(tmp_path):
    from lapidus.supervisor.sink_snapshots import SnapshotRequests
    woken = []
    requests = SnapshotRequests(str(tmp_path), "shop", "websocket", woken.append)
    first, second = requests.request("public.items"), requests.request("nosuch")
    queue = BackfillQueue(tmp_path / "shop")
    assert [(r.n, r.table, r.sink) for r in queue.pending()] == [
        (first, "public.items", "websocket"), (second, "nosuch", "websocket")]
    operators = queue.add("public.items", None)
    assert requests.leftovers(keep=[first]) == [second]      # not the operator's
    assert requests.settled([first, second]) == {}
    assert requests.not_started([first, second]) == [second]    # behind first
    queue.refuse(queue.pending()[1], "no such table", keep=5)
    queue.cancel(runs=[first])
    assert requests.settled([first, second]) == {first: None, second: "no such table"}
    requests.wake()
    assert woken == ["shop"] and [r.n for r in queue.pending()] == [operators.n]


def test_clients_that_ask_for_a_table_whose_run_has_not_started_share_it():
    from lapidus.sinks.websocket.snapshots import SnapshotRuns
    runs = SnapshotRuns(structlog.get_logger())
    requests = FakeRequests()
    runs.attach("shop", requests)
    requests.pending[1] = "an operator's backfill, running"
    a, b, c = FakeClient(), FakeClient(), FakeClient()
    assert runs.start(a, ["shop"], ["public.items"])[0] == ["2@websocket"]
    assert runs.start(b, ["shop"], ["public.items", "public.orders"])[0] == \
        ["2@websocket", "3@websocket"]
    del requests.pending[1]                   # run 2 may start now: no one joins it any more
    assert runs.start(c, ["shop"], ["public.items"])[0] == ["4@websocket"]
    runs.gone(a)
    assert requests.cancelled == []           # b still waits for run 2
    runs.gone(b)
    assert sorted(requests.cancelled) == [2, 3]
