"""The dispatcher process: receives encoded batches from the workers and delivers them to sinks.

Runs in its own process (forked by the supervisor) around one asyncio loop.  Per backend there is
one pipeline task that takes that backend's batches in order, hands each batch to every sink of
the backend, and acknowledges the batch to the worker only when all of them confirmed it.  A sink
that fails is retried with backoff, without dropping or reordering anything; it holds back its
own backend only, never the others.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from .. import deadletters, exitcodes, logs
from ..backoff import Backoff
from ..events import Record
from ..procutil import die_with_parent, run_profiled, set_process_name, tune_gc_for_throughput
from ..sink_runs import run_of, split
from ..sinks import registry
from ..sinks.base import Delivery, OutputClosed, Sink, UndeliverableError
from ..transport import ACK, BATCH, HELD, HELLO, frames_in, pack
from ..workers.runner import next_keep_alive, quiet_report_every
from .refusals import RefusedEvents
from .sink_snapshots import SnapshotRequests
from .tail_ring import TailRing, TailWatch

RETRY_MAX = 10.0         # seconds between retries of a failing sink, at most
HOLD_RETRY_MAX = 60.0    # ... of an event a sink refused for good (on_undeliverable = "hold")
RESEND = "resend"        # a queue item: send the backend's dead letters again
TAIL_EVERY = 0.2         # seconds between the tails sent to the status page, while watched
HELD_EVERY = 1.0         # seconds between the HELD frames to a worker a sink holds back
new_record = tuple.__new__


class Pipeline:
    """One backend's ordered delivery: batches in, acks out."""

    def __init__(self, backend: str, sinks: List[Sink], log, merge_up_to: int = 1,
                 names: Optional[List[str]] = None, on_undeliverable: str = "hold",
                 dead_letters: Optional[Path] = None, plugins: Optional[dict] = None):
        self.backend = backend
        self.sinks = sinks
        # the plugin names of the configuration, for logs, metrics and lapidusctl
        self.names = names or [type(sink).__name__ for sink in sinks]
        self.plugins = plugins                # the configuration the sinks were made from
        self.log = log
        self.merge_up_to = merge_up_to       # most queued batches delivered as one
        self.errors: Dict[str, int] = {}     # plugin name -> failed deliveries
        self.failing: Dict[str, str] = {}    # plugin name -> its last error, while failing
        self.refusals = RefusedEvents(backend, on_undeliverable, dead_letters, log)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.writer: Optional[asyncio.WriteTransport] = None   # the worker's connection
        self.generation = 0
        self.delivered = 0
        self.delivering = False               # a worker's batch taken from the queue, until
                                              # the loop comes back for the next one
        self.task: Optional[asyncio.Task] = None
        self.resend_queued = False            # a RESEND item is in the queue
        self.resend_after = False             # one was taken out while merging batches
        self.setup: tuple = ()                # Dispatcher._setup_of what made it
        self.tail: Optional[TailRing] = None  # while the status page watches (tail_ring)
        # per sink, the last record it confirmed from the attached worker (None: it set
        # them all aside): what an empty batch at a boundary says the end of (_mark_boundary)
        self.last_records: List[Optional[Record]] = []

    def attach(self, writer: Optional[asyncio.WriteTransport]) -> int:
        """A (re)connected worker, or none: batches of older connections are no longer wanted."""
        self.generation += 1
        self.writer = writer
        self.last_records = []
        kept = []
        while not self.queue.empty():
            item = self.queue.get_nowait()
            if item[0] == RESEND:
                kept.append(item)   # not the worker's: stays wanted
        for item in kept:
            self.queue.put_nowait(item)
        return self.generation

    def request_resend(self) -> None:
        """Send the dead letters again (from their resend file), after the batches queued
        now; see :mod:`lapidus.deadletters`."""
        if not self.resend_queued:
            self.resend_queued = True
            self.queue.put_nowait((RESEND, 0, None))

    async def run(self) -> None:
        while True:
            self.delivering = False
            generation, seq, records = await self.queue.get()
            if generation == RESEND:
                await self._resend()
                continue
            if generation != self.generation:
                continue  # its worker died; the restarted worker sends it again
            self.resend_after = False
            self.delivering = True
            seq, records = self._merge_queued(seq, records)
            if records:
                if records.routed:
                    confirmed = await self._deliver_routed(records, generation)
                elif len(self.sinks) == 1:
                    # in this task: gather's task per sink costs more than a one-event batch's
                    # delivery, and a turn of the loop before the sink starts
                    confirmed = [await self._deliver(self.sinks[0], self.names[0], records,
                                                     generation)]
                else:
                    confirmed = await asyncio.gather(*(
                        self._deliver(sink, name, records, generation)
                        for sink, name in zip(self.sinks, self.names)))
                if generation != self.generation:
                    continue  # its worker went away while a sink was being retried
                self.last_records = confirmed
                self.delivered += len(records)
                if self.tail is not None:
                    self.tail.add(records if not records.routed else
                                  [r for r in records if run_of(r, self.backend) is None])
            else:
                await self._mark_boundary(generation)
            if generation == self.generation and self.writer and not self.writer.is_closing():
                self.writer.write(pack(ACK, seq))
            if self.resend_after:
                await self._resend()

    async def _deliver_routed(self, records: Delivery, generation: int) -> list:
        """A batch that may hold events of a run made for one sink (lapidus.sink_runs):
        each sink gets its share; one whose share is empty confirms nothing new."""
        shares = split(records, self.backend, self.names)
        last = self.last_records or [None] * len(self.sinks)

        async def unchanged(record: Optional[Record]) -> Optional[Record]:
            return record
        return list(await asyncio.gather(*(
            self._deliver(sink, name, Delivery(share, records.at_boundary, True), generation)
            if share else unchanged(previous)
            for sink, name, share, previous in zip(self.sinks, self.names, shares, last))))

    async def _mark_boundary(self, generation: int) -> None:
        """An empty batch: the transaction of the last record delivered ended after it (the
        worker read its COMMIT in a batch without events).  The sinks that apply whole
        transactions get the last record they confirmed again, at the boundary
        (``Sink.wants_transaction_ends``); the others nothing.  Without one (the batch it
        follows was of an earlier connection, or all its records were set aside as dead
        letters) there is nothing to say it of."""
        await asyncio.gather(*(self._deliver(sink, name, Delivery((last,), True), generation)
                               for sink, name, last in zip(self.sinks, self.names,
                                                           self.last_records)
                               if sink.wants_transaction_ends and last is not None))

    def _merge_queued(self, seq: int, records: list) -> tuple:
        """Append the batches queued behind this one (up to ``merge_up_to`` in all).

        Batches queue up when the sinks are the slower side; delivering them together pays a
        sink's per-delivery wait once (the last JetStream acks, the flush's round trip)
        instead of once per batch.  Only for sinks that allow it (``Sink.merge_batches``).
        They come from one worker connection, in order, so the merged records keep that
        order, and the ack of the last one confirms all (acks are cumulative).  Only half the
        worker's in-flight window is merged: the worker keeps reading into the other half
        meanwhile.
        """
        queue = self.queue
        merged = None
        for _ in range(self.merge_up_to - 1):
            if queue.empty():
                break
            generation, next_seq, more = queue.get_nowait()
            if generation == RESEND:
                self.resend_after = True   # merged batches end at a resend: it comes next
                break
            if generation != self.generation:
                continue
            if merged is None:
                merged = Delivery(records, routed=records.routed)
            merged.extend(more)
            merged.at_boundary = more.at_boundary
            merged.routed = merged.routed or more.routed
            seq = next_seq
        return seq, (records if merged is None else merged)

    def tell_held(self) -> None:
        """Tell the worker which sinks hold its batches (HELD): the sinks whose last delivery
        failed, that report no connection, or that refuse an event for good (held at it,
        ``on_undeliverable = "hold"``).  Only while a batch waits for them; an ACK ends it.
        A worker told to stop then does not wait for acks that cannot come."""
        if not (self.delivering or self.queue.qsize()) or self.writer is None \
                or self.writer.is_closing():
            return
        health = self.health()
        down = [name for name in self.names if name in self.failing
                or name in self.refusals.held
                or (health.get(name) or {}).get("connected") is False]
        if down:
            self.writer.write(pack(HELD, down))

    def health(self) -> Dict[str, dict]:
        """``{plugin name: Sink.health()}`` for the sinks that report one; a sink whose
        ``health`` fails is reported as such rather than stopping the reports."""
        out = {}
        for sink, name in zip(self.sinks, self.names):
            try:
                state = sink.health()
            except Exception as exc:
                state = {"error": f"health() failed: {type(exc).__name__}: {exc}"}
            if state is not None:
                out[name] = state
        return out

    async def _deliver(self, sink: Sink, name: str, records: Delivery,
                       generation: Optional[int] = None) -> Optional[Record]:
        """Send ``records`` to one sink until it confirms them all: failures are retried
        with backoff (same records, same order); an event the sink refuses for good is held
        or moved to the dead letters (``on_undeliverable``, :mod:`.refusals`).

        A batch of a worker connection (``generation``) is no longer retried once that worker
        is gone: its restart sends it again from the checkpoint, and in cluster mode the
        backend may stream on another node by then, which a late retry here would
        interleave with (docs/cluster.md)."""
        retry, hold = Backoff(0.2, RETRY_MAX), Backoff(min(1.0, HOLD_RETRY_MAX), HOLD_RETRY_MAX)
        while True:
            if generation is not None and generation != self.generation:
                self.log.info("the batch's worker is gone; not retrying it", sink=name,
                              events=len(records))
                return None
            try:
                await sink.send(records)
                self.failing.pop(name, None)
                self.refusals.delivered(name)
                return records[-1] if records else None
            except OutputClosed:
                raise
            except UndeliverableError as exc:
                self.errors[name] = self.errors.get(name, 0) + 1
                rest = self.refusals.refused(name, records, exc)
                if rest is not None:
                    if not rest:
                        return None
                    # what is left ends where the delivery ends
                    records = Delivery(rest, records.at_boundary)
                    continue
                delay = hold.next()
            except Exception as exc:
                self.errors[name] = self.errors.get(name, 0) + 1
                self.failing[name] = str(exc)
                delay = retry.next()
                self.log.warning("sink failed; retrying the same batch", sink=name,
                                 error=str(exc), retry_in=round(delay, 2))
            await asyncio.sleep(delay)

    async def _resend(self) -> None:
        """Deliver the records of the resend file to every sink (refused ones go to the dead
        letters again), then delete it."""
        self.resend_queued = self.resend_after = False
        records = Delivery(self.refusals.to_resend())
        if records:
            self.log.info("sending the dead letters again", events=len(records))
            await asyncio.gather(*(self._deliver(sink, name, records)
                                   for sink, name in zip(self.sinks, self.names)))
        self.refusals.resent()
        self.log.info("dead letters sent again", events=len(records))


class Dispatcher:
    def __init__(self, config, socket_path: str, log, status=None):
        self.config = config
        self.status = status    # pipe to the supervisor: stats when they change, keep-alives
        self.socket_path = socket_path
        self.log = log
        self.pipelines: Dict[str, Pipeline] = {}
        self.shared: Dict[str, Sink] = {}
        self.making: Dict[str, asyncio.Lock] = {}     # per backend: one pipeline made at a time
        self.tasks: List[asyncio.Task] = []
        self.connections: set = set()           # WorkerConnection: one per worker
        self.failed: Optional[BaseException] = None
        self.stopping = asyncio.Event()
        self.tail_watch = TailWatch()
        self.watch_arrived = asyncio.Event()    # wakes tail_forever from its idle wait

    async def _sink(self, name: str, options: dict, backend: str) -> Sink:
        cls = registry.load(name)
        if cls.shared:
            # A backend that gives a shared plugin options of its own (stdout to fd 2) gets
            # the instance for those options, not whichever was made first.
            key = f"{name} {cls.share_key(options)}"
            if key not in self.shared:
                sink = cls(options, "*")
                await sink.start()
                self.shared[key] = sink
            return self.shared[key]
        sink = cls(options, backend)
        if getattr(cls, "asks_for_snapshots", False):   # plugins need not subclass Sink
            sink.snapshot_requests = SnapshotRequests(
                self.config.state_dir, backend, name, self.wake_worker,
                unavailable=None if self.config.cluster is None else
                "snapshot runs are not available in cluster mode yet (a run would stay on "
                "this node while another may stream the backend)")
        await sink.start()
        return sink

    def wake_worker(self, backend: str) -> None:
        """Ask the supervisor to make ``backend``'s worker look at its backfill requests now
        (by itself it looks at its next keep-alive).  From the loop's thread only: the status
        pipe has other writers there."""
        if self.status is not None:
            try:
                self.status.send(("wake", {"backend": backend}))
            except (OSError, ValueError):
                pass        # the supervisor is gone; the worker looks by itself

    async def pipeline_for(self, backend_name: str, backend=None) -> Pipeline:
        """The pipeline of a backend.  ``backend`` is the configuration its worker sent with
        HELLO (plugins resolved); when its plugins differ from the pipeline's (a reload
        changed them), the pipeline is made anew.  Without it (at start) the dispatcher's
        own configuration is used.

        Made under a lock per backend: the start's pipeline and the one a HELLO asks for
        meanwhile must not both be made (two instances of a sink, the first one orphaned:
        a sync sink's lock on its target then held for good)."""
        async with self.making.setdefault(backend_name, asyncio.Lock()):
            return await self._pipeline_for(backend_name, backend)

    def _plugins_of(self, backend_name: str, backend=None) -> tuple:
        """(the backend's configuration, {plugin name: options}): the worker's ``backend``
        when it sent one, else the dispatcher's own configuration (at start)."""
        if backend is None:
            backend = next(b for b in self.config.backends if b.name == backend_name)
            return backend, self.config.plugins_for(backend)
        return backend, {name: dict(options) for name, options in (backend.plugins or {}).items()}

    async def _pipeline_for(self, backend_name: str, backend=None) -> Pipeline:
        backend, plugins = self._plugins_of(backend_name, backend)
        pipeline = self.pipelines.get(backend_name)
        setup = self._setup_of(backend, plugins)
        if pipeline is not None and pipeline.setup == setup:
            return pipeline
        if pipeline is not None:
            self.log.info("the sinks of a backend changed; making them anew",
                          backend=backend_name)
            self._retire(pipeline)
        sinks = [await self._sink(n, o, backend_name) for n, o in plugins.items()]
        merge_up_to = 1
        if sinks and all(sink.merge_batches for sink in sinks):
            merge_up_to = max(1, int(backend.options.get("max_inflight_batches", 8)) // 2)
        pipeline = Pipeline(backend_name, sinks, self.log.bind(backend=backend_name),
                            merge_up_to=merge_up_to, names=list(plugins),
                            on_undeliverable=(backend.options.get("on_undeliverable")
                                              or "hold"),
                            dead_letters=deadletters.path_for(self.config.state_dir,
                                                              backend_name),
                            plugins=plugins)
        pipeline.setup = setup
        self.pipelines[backend_name] = pipeline
        self.tail_watch.apply({backend_name: pipeline}, send=False)   # watched from the start
        pipeline.task = asyncio.create_task(pipeline.run())
        pipeline.task.add_done_callback(self._pipeline_done)
        self.tasks.append(pipeline.task)
        if pipeline.refusals.resend_path.exists():
            pipeline.request_resend()   # a resend the previous dispatcher did not finish
        return pipeline

    @staticmethod
    def _setup_of(backend, plugins: dict) -> tuple:
        """What a pipeline is made from: a pipeline with another setup is made anew."""
        return (plugins, backend.options.get("on_undeliverable") or "hold",
                int(backend.options.get("max_inflight_batches", 8)))

    def _retire(self, pipeline: Pipeline) -> None:
        """Stop an outdated pipeline: its batches come again from the restarted worker; its
        own sinks are closed in the background (a shared sink stays: others use it)."""
        pipeline.task.cancel()
        pipeline.attach(None)

        async def close_sinks():
            for sink in pipeline.sinks:
                if not sink.shared:
                    try:
                        await sink.close()
                    except Exception as exc:
                        self.log.warning("error while closing a sink", error=str(exc))
        self.tasks.append(asyncio.create_task(close_sinks()))

    def resend_requested(self) -> None:
        """SIGUSR1 from the supervisor: a backend's dead letters were moved to its resend file
        (``lapidusctl dead-letters BACKEND --resend``)."""
        for pipeline in self.pipelines.values():
            if pipeline.refusals.resend_path.exists():
                pipeline.request_resend()

    async def _start_sinks(self) -> None:
        """Start every enabled backend's sinks now, not at its worker's first connection: a
        sink's connection (NATS, a command) is then made while the workers start, and the
        first events do not wait for it.  A sink that cannot be set up here is logged, and
        tried again when its worker connects (where a failure stops the dispatcher, as
        before)."""
        for backend in self.config.backends:
            if not backend.options.get("enabled", True):
                continue
            try:
                await self.pipeline_for(backend.name)
            except Exception as exc:
                self.log.warning("could not start the sinks of a backend yet; trying again "
                                 "when its worker connects", backend=backend.name,
                                 error=str(exc))

    def _pipeline_done(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.failed = exc
            self.stopping.set()

    async def _pipeline_when_ready(self, hello: dict,
                                   writer: asyncio.WriteTransport) -> Pipeline:
        """The pipeline of a connecting worker; while its sinks cannot be made (a sink's
        start fails), try again with backoff, and tell the worker its sinks are down (HELD).
        Meanwhile nothing of the worker is read, so it stops at its in-flight limit
        (backpressure) and nothing is lost or counted as a crash."""
        retry = Backoff(0.5, RETRY_MAX)
        while True:
            try:
                return await self.pipeline_for(hello["backend"], hello.get("config"))
            except Exception as exc:
                delay = retry.next()
                self.log.error("cannot start the sinks of a backend; retrying",
                               backend=hello["backend"], error=str(exc),
                               retry_in=round(delay, 2))
                if not writer.is_closing():
                    _, plugins = self._plugins_of(hello["backend"], hello.get("config"))
                    writer.write(pack(HELD, list(plugins)))
                await asyncio.sleep(delay)

    def stats(self) -> dict:
        """What ``lapidusctl status`` shows of the dispatcher, per backend."""
        return {
            "sink_errors": {n: dict(p.errors) for n, p in self.pipelines.items()},
            "queued_batches": {n: p.queue.qsize() for n, p in self.pipelines.items()},
            "delivered": {n: p.delivered for n, p in self.pipelines.items()},
            "sink_health": {n: p.health() for n, p in self.pipelines.items()},
            "sink_failing": {n: dict(p.failing) for n, p in self.pipelines.items()
                             if p.failing},
            "undeliverable": {n: dict(p.refusals.held)
                              for n, p in self.pipelines.items() if p.refusals.held},
            "dead_letters": {n: p.refusals.count for n, p in self.pipelines.items()},
        }

    async def tell_held_forever(self) -> None:
        """Every HELD_EVERY seconds, each worker whose batches a sink holds is told which
        (:meth:`Pipeline.tell_held`)."""
        while True:
            for pipeline in list(self.pipelines.values()):
                pipeline.tell_held()
            await asyncio.sleep(HELD_EVERY)

    async def report_forever(self) -> None:
        """Stats to the supervisor: looked at every second, sent when they changed, and
        unchanged only as often as the supervisor's heartbeat needs (as workers do)."""
        quiet = quiet_report_every(float(self.config.supervisor.heartbeat_timeout))
        reported, keep_alive_at = None, -math.inf
        while self.status is not None:
            stats, now = self.stats(), time.monotonic()
            if stats != reported or now >= keep_alive_at:
                try:
                    self.status.send(("stats", stats))
                except (OSError, ValueError):
                    return
                reported, keep_alive_at = stats, next_keep_alive(now, quiet)
            await asyncio.sleep(1.0)

    def read_requests(self) -> None:
        """The supervisor's requests on the status pipe (readable): ``watch`` (tail_ring)."""
        try:
            while self.status.poll():
                kind, fields = self.status.recv()
                if kind == "watch":
                    # the rings start now, so nothing delivered after the request is missed
                    self.tail_watch.watch(fields)
                    self.tail_watch.apply(self.pipelines, send=False)
                    self.watch_arrived.set()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self.status.fileno())

    async def tail_forever(self) -> None:
        """Send the watched backends' new events to the supervisor (status page's tail);
        while no page watches (and no ring is left to take back), sleep until a watch."""
        while self.status is not None:
            if self.tail_watch.idle(self.pipelines):
                self.watch_arrived.clear()
                await self.watch_arrived.wait()
            for backend, events in self.tail_watch.apply(self.pipelines):
                try:
                    self.status.send(("tail", {"backend": backend, "events": events}))
                except (OSError, ValueError):
                    return
            await asyncio.sleep(TAIL_EVERY)

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        if self.status is not None:
            # first: a watch the supervisor sent at our start is read before any batch
            loop.add_reader(self.status.fileno(), self.read_requests)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        server = await loop.create_unix_server(lambda: WorkerConnection(self),
                                               path=self.socket_path)
        os.chmod(self.socket_path, 0o600)
        await self._start_sinks()
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        loop.add_signal_handler(signal.SIGINT, lambda: None)  # the supervisor decides
        loop.add_signal_handler(signal.SIGUSR1, self.resend_requested)
        self.log.info("dispatcher listening")
        reporter = asyncio.create_task(self.report_forever())
        tails = asyncio.create_task(self.tail_forever())
        held = asyncio.create_task(self.tell_held_forever())
        await self.stopping.wait()
        reporter.cancel()
        tails.cancel()
        held.cancel()
        server.close()
        for connection in list(self.connections):
            connection.close()
        for task in self.tasks:
            task.cancel()
        for sink in list(self.shared.values()) + [s for p in self.pipelines.values()
                                                  for s in p.sinks if not s.shared]:
            try:
                await sink.close()
            except Exception as exc:
                self.log.warning("error while closing a sink", error=str(exc))
        if isinstance(self.failed, OutputClosed):
            self.log.info("output closed; stopping")
            return exitcodes.OUTPUT_CLOSED
        if self.failed is not None:
            self.log.error("dispatcher failed", error=repr(self.failed))
            return exitcodes.CHILD_ERROR
        return exitcodes.CHILD_OK


class WorkerConnection(asyncio.BufferedProtocol):
    """One worker's connection: its frames in, parsed as the bytes arrive.

    A protocol rather than a stream reader and a task: a batch is put on its pipeline's queue
    in the loop's callback that received it, not one more turn of the loop later.  Buffered:
    the socket is read into one buffer of this connection's instead of a new 256 KiB bytes
    object per read (an mmap and munmap each).  Until the HELLO's pipeline exists (its sinks
    may take retries to start) nothing more of the worker is read, so it stops at its
    in-flight limit (backpressure).
    """

    READ_SIZE = 1 << 16

    def __init__(self, dispatcher: "Dispatcher"):
        self.dispatcher = dispatcher
        self.transport: Optional[asyncio.Transport] = None
        self.buffer = bytearray()                  # received, not yet a whole frame
        self.incoming = bytearray(self.READ_SIZE)  # what the socket is read into
        self.pipeline: Optional[Pipeline] = None
        self.generation = 0
        self.hello: Optional[asyncio.Task] = None    # making the pipeline of the HELLO

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.dispatcher.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.incoming)

    def buffer_updated(self, nbytes: int) -> None:
        self.buffer += memoryview(self.incoming)[:nbytes]
        if self.hello is None:
            self._take_frames()

    def eof_received(self) -> None:
        return None         # close: the worker is gone (connection_lost follows)

    def _take_frames(self) -> None:
        used = 0
        for kind, payload, used in frames_in(self.buffer):
            if kind == BATCH and self.pipeline is not None:
                seq, fields, at_boundary, routed = payload
                # tuple.__new__ rather than Record._make: half the cost (a classmethod call
                # and a length check per event, as much as unpickling the batch); the fields
                # come from a worker of this same build, in Record order
                records = Delivery([new_record(Record, f) for f in fields], at_boundary,
                                   routed)
                self.pipeline.queue.put_nowait((self.generation, seq, records))
            elif kind == HELLO:
                # what follows waits in the buffer for the pipeline
                self.transport.pause_reading()
                self.hello = asyncio.create_task(self._attach(payload))
                break
        del self.buffer[:used]

    async def _attach(self, hello: dict) -> None:
        self.pipeline = await self.dispatcher._pipeline_when_ready(hello, self.transport)
        self.generation = self.pipeline.attach(self.transport)
        self.hello = None
        if not self.transport.is_closing():
            self._take_frames()
            self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self.dispatcher.connections.discard(self)
        if self.hello is not None:
            self.hello.cancel()
        if self.pipeline is not None and self.pipeline.generation == self.generation:
            # Its worker is gone: what it queued will come again from its restart, so
            # delivering it now would only make duplicates.
            self.pipeline.attach(None)

    def close(self) -> None:
        """Shutting down: the worker sees the connection close and stops or retries."""
        if self.transport is not None:
            self.transport.close()


def dispatcher_main(config, socket_path: str, parent_pid: int, status=None) -> None:
    """Entry point of the dispatcher process (target of multiprocessing.Process).

    ``status`` is the write end of the pipe to the supervisor (appended by ChildHandle.spawn).
    """
    die_with_parent(signal.SIGKILL, parent_pid)
    set_process_name("lapidus:dispatch")
    tune_gc_for_throughput()
    logs.configure(config.log.format, config.log.level, process="dispatcher")
    dispatcher = Dispatcher(config, socket_path, logs.get_logger(), status)
    code = run_profiled("dispatcher", asyncio.run, dispatcher.serve())
    sys.stdout.flush()
    os._exit(code)
