"""The dispatcher's own CPU per batch: ``Pipeline.run`` with sinks that confirm at once, beside
a bare loop doing the least the same job needs, in one process and one run.

    .venv/bin/python bench/pipeline_overhead.py [--batches 20000] [--sinks 1,2] [--runs 5]

Each batch is one event (a one-row transaction), put on the pipeline's queue; the next is put
once the previous one was acknowledged, so every batch pays the loop's turns as it would in the
dispatcher at a low rate. The bare loop takes the same items from an ``asyncio.Queue``, awaits
each sink's ``send`` in turn and writes the same acknowledgement frame. No servers, no worker,
no sockets: what is measured is Python's and asyncio's work per batch, CPU time of this
process. Printed: microseconds per batch of each, and their ratio, per run and the median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lapidus import logs  # noqa: E402
from lapidus.events import Record  # noqa: E402
from lapidus.sinks.base import Delivery  # noqa: E402
from lapidus.supervisor.dispatcher import Pipeline  # noqa: E402
from lapidus.transport import ACK, pack  # noqa: E402

RECORD = Record("bench:1", "insert", "public", "items", ("1",), "0/16B3748", b'{"id":1}')


class ConfirmingSink:
    """A sink that confirms every delivery at once."""
    wants_transaction_ends = False
    merge_batches = False

    def health(self):
        return None

    async def send(self, records) -> None:
        return None


class NullWriter:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False


async def per_batch(consumer, put, delivered, batches: int) -> float:
    """CPU µs per batch of the ``consumer`` coroutine: ``put(seq)`` a one-event batch, then
    let the loop turn until ``delivered()`` counts it, ``batches`` times."""
    task = asyncio.ensure_future(consumer)
    started = time.process_time()
    for seq in range(batches):
        put(seq)
        while delivered() <= seq:
            await asyncio.sleep(0)
    spent = time.process_time() - started
    task.cancel()
    return spent / batches * 1e6


async def through_pipeline(sinks: int, batches: int) -> float:
    pipeline = Pipeline("bench", [ConfirmingSink() for _ in range(sinks)], logs.get_logger())
    generation = pipeline.attach(NullWriter())
    return await per_batch(
        pipeline.run(),
        lambda seq: pipeline.queue.put_nowait((generation, seq, Delivery([RECORD], True))),
        lambda: pipeline.delivered, batches)


async def bare(sinks: int, batches: int) -> float:
    queue: asyncio.Queue = asyncio.Queue()
    targets = [ConfirmingSink() for _ in range(sinks)]
    writer = NullWriter()
    delivered = 0

    async def loop() -> None:
        nonlocal delivered
        while True:
            seq, records = await queue.get()
            for sink in targets:
                await sink.send(records)
            delivered += len(records)
            writer.write(pack(ACK, seq))

    return await per_batch(loop(), lambda seq: queue.put_nowait((seq, [RECORD])),
                           lambda: delivered, batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20000)
    parser.add_argument("--sinks", default="1,2")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for sinks in [int(n) for n in args.sinks.split(",")]:
        ratios = []
        for run in range(args.runs):
            base = asyncio.run(bare(sinks, args.batches))
            ours = asyncio.run(through_pipeline(sinks, args.batches))
            ratios.append(ours / base)
            print(f"{sinks} sink(s), run {run + 1}: pipeline {ours:.1f} us per batch, bare loop "
                  f"{base:.1f} us, ratio {ours / base:.2f}", flush=True)
        print(f"{sinks} sink(s): median ratio {statistics.median(ratios):.2f}", flush=True)


if __name__ == "__main__":
    main()
