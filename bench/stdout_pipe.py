"""Throughput of the stdout sink into a pipe: N records of about SIZE bytes, in batches of
BATCH, written by StdoutSink to a pipe that ``cat > /dev/null`` drains.

    .venv/bin/python bench/stdout_pipe.py [--records 200000] [--size 300] [--batch 1000]
                                          [--runs 3]

Prints records/s and MiB/s per run and the median (results: docs/dev/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import time

from lapidus.events import Record
from lapidus.sinks.stdout import StdoutSink


def records(count: int, size: int):
    body = "x" * max(0, size - 26)     # the JSON around it: 26 bytes
    return [Record(f"pg:0/1:{n}", "insert", "public", "t", (str(n),), "0/1",
                   f'{{"n":{n:>10},"pad":"{body}"}}'.encode()) for n in range(count)]


async def one_run(batches, fd: int) -> float:
    sink = StdoutSink({"fd": fd}, "*")
    await sink.start()
    started = time.perf_counter()
    for batch in batches:
        await sink.send(batch)
    elapsed = time.perf_counter() - started
    await sink.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    recs = records(args.records, args.size)
    total = sum(len(r.data) + 1 for r in recs)
    batches = [recs[i:i + args.batch] for i in range(0, len(recs), args.batch)]
    rates = []
    for run in range(args.runs):
        read, write = os.pipe()
        cat = subprocess.Popen(["cat"], stdin=read, stdout=subprocess.DEVNULL)
        os.close(read)
        elapsed = asyncio.run(one_run(batches, write))
        os.close(write)
        cat.wait()
        rates.append(args.records / elapsed)
        print(f"run {run + 1}: {args.records / elapsed:,.0f} records/s, "
              f"{total / elapsed / 2**20:,.1f} MiB/s")
    print(f"median: {statistics.median(rates):,.0f} records/s "
          f"({args.records} records of {total // args.records} bytes, batches of {args.batch})")


if __name__ == "__main__":
    main()
