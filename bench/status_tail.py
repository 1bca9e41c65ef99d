"""What the status page's tail costs the dispatcher per delivered event.

    .venv/bin/python bench/status_tail.py [--batches 20000] [--runs 5]

The dispatcher keeps the last events of a backend only while a page watches it
(lapidus/supervisor/tail_ring.py): an unwatched pipeline tests ``self.tail is not None`` once
per delivered batch, a watched one also adds the batch to its ring (``TailRing.add``: the last
20 references of the batch).  Measured here, per batch size (1, 100, 1,000 events), side by
side in the same run:

* baseline: a loop over the batches doing only what the pipeline does per batch around the
  tail (counting the delivered events);
* unwatched: the same plus the ``is not None`` test;
* watched: the same plus ``TailRing.add``.

Prints nanoseconds per batch and per event of each, and the extra of the two variants over the
baseline, medians of ``--runs`` runs.  Needs nothing but the package.
"""

from __future__ import annotations

import argparse
import statistics
import time

from lapidus.events import Record
from lapidus.supervisor.tail_ring import TailRing


class Holder:
    def __init__(self, tail):
        self.tail = tail
        self.delivered = 0


def baseline(holder, batches):
    for records in batches:
        holder.delivered += len(records)


def with_tail(holder, batches):
    for records in batches:
        holder.delivered += len(records)
        if holder.tail is not None:
            holder.tail.add(records)


def timed(fn, holder, batches) -> float:
    start = time.perf_counter_ns()
    fn(holder, batches)
    return (time.perf_counter_ns() - start) / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    record = Record("bench:0/1:0", "insert", "public", "items", ("1",), "0/1", b"{}" * 100)
    print(f"{'events/batch':>12} {'variant':>10} {'ns/batch':>9} {'ns/event':>9} "
          f"{'extra ns/event':>15}")
    for size in (1, 100, 1000):
        batches = [[record] * size for _ in range(max(1, args.batches // max(1, size // 10)))]
        results = {"baseline": [], "unwatched": [], "watched": []}
        for _ in range(args.runs):   # interleaved, so a noisy moment hits all three
            results["baseline"].append(timed(baseline, Holder(None), batches))
            results["unwatched"].append(timed(with_tail, Holder(None), batches))
            results["watched"].append(timed(with_tail, Holder(TailRing()), batches))
        base = statistics.median(results["baseline"])
        for name, values in results.items():
            per_batch = statistics.median(values)
            extra = (per_batch - base) / size
            print(f"{size:>12} {name:>10} {per_batch:>9.1f} {per_batch / size:>9.2f} "
                  f"{extra:>15.3f}")


if __name__ == "__main__":
    main()
