"""Fault-injection harness: a mixed load with an exact ledger, faults, and a checker.

    .venv/bin/python -m bench.chaos --minutes 10 --seed 1

Lapidus streams a PostgreSQL and a MariaDB table into a dedicated JetStream stream while

* :mod:`bench.chaos.load` inserts, updates and deletes rows (one writer per table, a version
  column incremented on every update) and records in a ledger every change the database
  committed, resolving commits whose answer was lost by asking the database;
* :mod:`bench.chaos.faults` kills Lapidus processes with SIGKILL, stops nats-server, restarts
  the databases and cuts connections in TCP proxies (:mod:`bench.chaos.proxy`) placed between
  Lapidus and the servers; it also freezes Lapidus processes (:mod:`bench.chaos.freezes`),
  reloads a changed configuration (:mod:`bench.chaos.reloads`), makes the load write an event
  too large for NATS (:mod:`bench.chaos.deadletters`) and crowds the control socket and the
  HTTP listener with slow clients (:mod:`bench.chaos.slowclients`), judging recovery from
  ``lapidusctl status --json`` (:mod:`bench.chaos.ctl`);
* :mod:`bench.chaos.checker` reads back everything the stream holds (and the dead letters)
  and compares it with the ledger: nothing lost, per-key order, duplicates only as repeated
  ids.

In cluster mode (``--cluster``) several Lapidus nodes (:mod:`bench.chaos.cluster_nodes`) share
the backends through a private three-server NATS cluster (:mod:`bench.chaos.nats_cluster`); the
faults kill or freeze a node and kill a nats-server, and the nodes' logs must show no backend
streamed by two nodes at once.

:mod:`bench.chaos.run` ties them together; docs/dev/chaos.md describes the options and the report.
The short variant runs in CI as tests/integration/test_chaos.py.
"""

from .run import ChaosOptions, ChaosRun, run_chaos

__all__ = ["ChaosOptions", "ChaosRun", "run_chaos"]
