"""Fault-injection harness: a mixed load with an exact ledger, faults, and a checker.

    .venv/bin/python -m bench.chaos --minutes 10 --seed 1

Lapidus streams a PostgreSQL and a MariaDB table into a dedicated JetStream stream while

* :mod:`bench.chaos.load` inserts, updates and deletes rows (one writer per table, a version
  column incremented on every update) and records in a ledger every change the database
  committed, resolving commits whose answer was lost by asking the database;
* :mod:`bench.chaos.faults` kills Lapidus processes with SIGKILL, stops nats-server, restarts
  the databases and cuts connections in TCP proxies (:mod:`bench.chaos.proxy`) placed between
  Lapidus and the servers;
* :mod:`bench.chaos.checker` reads back everything the stream holds and compares it with the
  ledger: nothing lost, per-key order, duplicates only as repeated ids.

:mod:`bench.chaos.run` ties them together; docs/chaos.md describes the options and the report.
The short variant runs in CI as tests/integration/test_chaos.py.
"""

from .run import ChaosOptions, ChaosRun, run_chaos

__all__ = ["ChaosOptions", "ChaosRun", "run_chaos"]
