"""One chaos run: set up, load + faults, fence, check, report, clean up.

Set-up: a PostgreSQL database and a MariaDB database (``lapidus_chaos_<hex>``), a JetStream
stream ``CHAOS_<HEX>`` capturing ``chaos<hex>.>`` with a duplicate window of a few minutes, TCP
proxies to PostgreSQL, MariaDB and NATS, and ``lapidus`` with both backends and the nats plugin
in JetStream mode (its connections all go through the proxies).

Cluster mode (``cluster``): a private three-server NATS cluster instead of the nats-server, the
stream with three replicas, and ``nodes`` Lapidus nodes (:mod:`bench.chaos.cluster_nodes`) with
the same backends and a ``[cluster]`` table; the nats sink connects to the cluster's servers
directly (only the database connections go through the proxies).  Besides the checker, no
backend may have been streamed by two nodes at once (from the nodes' logs).

Clean-up (always, in ``finally``): Lapidus stopped, every server running again, proxies closed,
slot, databases and stream dropped, a private nats-server (or cluster) stopped.  The work
directory (config, Lapidus log, ledger, report) is kept when the run failed or ``keep`` is set.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import nats

from . import checker, ctl, deadletters, load, servers
from .cluster_nodes import ClusterNode, node_config, overlaps
from .faults import (CI_KINDS, CLUSTER_KINDS, KINDS, NEW_KINDS, RECOVERY, STOP_KINDS,
                     FaultInjector)
from .lapidus import LapidusProcess
from .nats_cluster import NatsCluster
from .proxy import TcpProxy
from .reloads import ConfigPlan
from .waiting import ChaosTimeout, wait_for


@dataclass
class ChaosOptions:
    seconds: float = 600.0              # how long the load runs (per_kind: at least this long)
    seed: int = 1
    rate: float = 60.0                  # transactions per second per backend
    kinds: List[str] = field(default_factory=lambda: list(KINDS))
    per_kind: Optional[int] = None      # stop after this many faults of each kind
    interval: float = 4.0               # mean seconds between faults
    settle: bool = False                # wait for the stream to catch up after each fault
    recovery_timeout: float = 120.0
    final_timeout: float = 300.0        # for the fences after the load
    duplicate_window: float = 300.0     # seconds, of the stream the harness creates
    nats: str = "private"               # private nats-server of the run, or the shared one
    workdir: Optional[str] = None
    keep: bool = False
    big_tx_share: float = 0.03
    bystander: bool = True              # a MariaDB writer in another database (see load.py)
    # with a stop_* kind: short, so that half of the freezes outlast it
    heartbeat_timeout: float = 3.0
    # with dead_letter: the private nats-server's max_payload, and the padding of an
    # oversized row (a MariaDB TEXT holds at most 65,535 bytes)
    max_payload: int = 32 * 1024
    oversized_pad: int = 40_000
    extra_rate_share: float = 0.25      # the extra backend's writer, of ``rate``
    cluster: bool = False               # several nodes and a three-server NATS cluster
    nodes: int = 2                      # cluster mode: how many Lapidus nodes
    lease_ttl: float = 5.0              # cluster mode: [cluster] lease_ttl, seconds

    def uses(self, *kinds: str) -> bool:
        return any(kind in self.kinds for kind in kinds)


class ChaosRun:
    PG_BACKEND = "pg"
    MYSQL_BACKEND = "maria"
    EXTRA_BACKEND = "extra"     # MariaDB, its own database; with reload_backends only
    BUCKET = "lapidus"          # cluster mode: the bucket of leases and checkpoints

    def __init__(self, options: ChaosOptions, log: Callable[[str], None] = print):
        self.options = options
        self.log = log
        token = uuid.uuid4().hex[:8]
        self.name = f"lapidus_chaos_{token}"
        self.stream = f"CHAOS_{token.upper()}"
        self.prefix = f"chaos{token}"
        self.workdir = Path(options.workdir or tempfile.mkdtemp(prefix="lapidus-chaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ledger = load.Ledger(self.workdir / "ledger.jsonl")
        self.findings: List[str] = []
        self.proxies: Dict[str, TcpProxy] = {}
        self.nats_server: Optional[servers.NatsServer] = None
        self.nats_cluster: Optional[NatsCluster] = None      # cluster mode
        self.lapidus: Optional[LapidusProcess] = None
        self.nodes: List[ClusterNode] = []                    # cluster mode
        self.loads: List[load.TableLoad] = []
        self.injector: Optional[FaultInjector] = None
        self.bystander: Optional[load.Bystander] = None
        self._created = set()
        self.report: Optional[checker.CheckReport] = None
        self.result: dict = {}
        self.plan: Optional[ConfigPlan] = None
        self.ctl_log = ctl.CtlLog()
        self.http_address = None if not options.uses("slow_clients") \
            else (servers.HOST, servers.free_port())
        self.heartbeat_timeout = options.heartbeat_timeout if options.uses(*STOP_KINDS) \
            else None
        self.has_extra = options.uses("reload_backends")

    @property
    def backend_names(self) -> List[str]:
        """The backends of the configuration as it is now (reloads change it)."""
        if self.plan is None:
            return [self.PG_BACKEND, self.MYSQL_BACKEND]
        return self.plan.backend_names()

    @property
    def processes(self) -> List[LapidusProcess]:
        """Every Lapidus of the run: the one process, or the cluster's nodes."""
        return list(self.nodes) or ([self.lapidus] if self.lapidus is not None else [])

    @property
    def nats_url(self):
        """Where the harness reaches NATS: the nats-server, or the cluster's live servers."""
        if self.nats_cluster is not None:
            return self.nats_cluster.live_urls()
        return self.nats_server.url

    @property
    def replicated_streams(self) -> List[str]:
        """Cluster mode: the streams whose replicas must be current (the bucket's too)."""
        return [self.stream, f"KV_{self.BUCKET}"]

    def owners(self) -> Dict[str, List[str]]:
        """Cluster mode: the nodes whose worker streams each backend now (from their logs)."""
        streaming = {node.name: node.streaming() for node in self.nodes}
        return {backend: [name for name, backends in streaming.items() if backend in backends]
                for backend in self.backend_names}

    def balanced(self) -> bool:
        """Cluster mode: every backend streamed by exactly one node, and no running node
        streams more than its share (so a node that came back took its part)."""
        owners = self.owners()
        live = [node.name for node in self.nodes if node.alive()]
        share = math.ceil(len(owners) / max(1, len(live)))
        return all(len(names) == 1 for names in owners.values()) and all(
            sum(name in names for names in owners.values()) <= share for name in live)

    @property
    def extra_db(self) -> str:
        return f"{self.name}_extra"

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def control_socket(self) -> Path:
        return self.state_dir / "lapidus.sock"

    @property
    def bystander_db(self) -> str:
        return f"{self.name}_bystander"

    @property
    def slot(self) -> str:
        return f"{self.name}_{self.PG_BACKEND}"

    # -- set-up ------------------------------------------------------------------------------

    def setup(self) -> None:
        opts = self.options
        max_payload = opts.max_payload if opts.uses("dead_letter") else None
        if max_payload is not None and opts.nats != "private":
            raise ValueError("the dead_letter fault needs the private nats-server (its "
                             "max_payload is set small)")
        self._created.add("nats")
        if opts.cluster:
            self.nats_cluster = NatsCluster(self.workdir / "nats-cluster")
            self.nats_cluster.start()
        else:
            self.nats_server = (servers.NatsServer.private(self.workdir, max_payload)
                                if opts.nats == "private" else servers.NatsServer.shared())
            self.nats_server.ensure()
        self._create_stream()
        self._created.add("stream")
        self._created.add("pg")
        load.create_pg_database(self.name)
        self._created.add("mysql")
        load.create_mysql_database(self.name)
        if opts.bystander:
            self._created.add("bystander")
            load.create_mysql_database(self.bystander_db, fence=False)
        if self.has_extra:
            self._created.add("extra")
            load.create_mysql_database(self.extra_db)
        self.proxies = {
            "postgresql": TcpProxy("postgresql", servers.PG_PORT).start(),
            "mysql": TcpProxy("mysql", servers.MYSQL_PORT).start(),
        }
        if self.nats_server is not None:
            self.proxies["nats"] = TcpProxy("nats", self.nats_server.port).start()
        self.plan = ConfigPlan(*self._config())
        if opts.cluster:
            self.nodes = [self._node(chr(ord("a") + i)) for i in range(opts.nodes)]
            for node in self.nodes:
                node.start()
            wait_for(self.balanced, RECOVERY, "every backend streamed by one node",
                     interval=0.2)
            return
        self.lapidus = LapidusProcess(self.plan.render(), self.workdir)
        self.lapidus.start()
        self.lapidus.wait_streaming(self.backend_names)

    def _node(self, name: str) -> ClusterNode:
        """Cluster mode: node ``name`` with the run's configuration, a ``[cluster]`` table and
        its own state directory and control socket (under ``<workdir>/<name>``)."""
        config = self.plan.render()
        config = dict(node_config(name, self.workdir / name, self.nats_cluster.urls,
                                  config["backends"], config["plugins"],
                                  lease_ttl=self.options.lease_ttl, replicas=3,
                                  bucket=self.BUCKET),
                      supervisor=config["supervisor"])
        return ClusterNode(name, config, self.workdir / name)

    def _config(self):
        """The base configuration and the extra backend's entry (None without one)."""
        opts = self.options
        server_id = 200_000_000 + (os.getpid() % 1_000_000) * 10 + int(time.time()) % 10
        supervisor = {"backoff_initial": 0.1, "backoff_max": 2.0, "max_restarts": 10_000,
                      "restart_window": 60}
        if self.heartbeat_timeout is not None:
            supervisor["heartbeat_timeout"] = self.heartbeat_timeout
        config = {
            "state_dir": str(self.state_dir),
            "log": {"format": "json", "level": "info"},
            "supervisor": supervisor,
            "backends": [
                {"name": self.PG_BACKEND, "type": "postgresql", "host": servers.HOST,
                 "port": self.proxies["postgresql"].port, "user": servers.PG_USER,
                 "database": self.name, "slot": self.slot, "connect_timeout": 2},
                {"name": self.MYSQL_BACKEND, "type": "mysql", "host": servers.HOST,
                 "port": self.proxies["mysql"].port, "user": servers.MYSQL_USER,
                 "password": "", "database": self.name, "server_id": server_id,
                 "heartbeat_seconds": 1, "connect_timeout": 2},
            ],
            "plugins": {"nats": {
                "servers": (self.nats_cluster.urls if self.nats_cluster is not None else
                            [f"nats://{servers.HOST}:{self.proxies['nats'].port}"]),
                "jetstream": True, "subject_prefix": self.prefix,
                "reconnect_time_wait": 0.25, "connect_timeout": 1, "ack_timeout": 2}},
        }
        extra = None
        if self.has_extra:
            extra = dict(config["backends"][1], name=self.EXTRA_BACKEND,
                         database=self.extra_db, server_id=server_id + 1)
        if self.http_address is not None:
            config["http"] = {"listen": f"{self.http_address[0]}:{self.http_address[1]}"}
        if opts.uses("dead_letter"):
            for backend in config["backends"] + ([extra] if extra else []):
                backend["on_undeliverable"] = "dead_letter"
        return config, extra

    def _create_stream(self) -> None:
        async def create():
            nc = await nats.connect(self.nats_url)
            try:
                await nc.jetstream().add_stream(
                    name=self.stream, subjects=[f"{self.prefix}.>"],
                    duplicate_window=self.options.duplicate_window,
                    num_replicas=3 if self.options.cluster else 1)
            finally:
                await nc.close()
        asyncio.run(create())

    def _delete_stream(self) -> None:
        async def delete():
            nc = await nats.connect(self.nats_url)
            try:
                await nc.jetstream().delete_stream(self.stream)
            except nats.js.errors.NotFoundError:
                pass
            finally:
                await nc.close()
        asyncio.run(delete())

    # -- progress ------------------------------------------------------------------------------

    def subject_of(self, backend: str, table: str, key: int) -> str:
        schema = {self.PG_BACKEND: "public", self.MYSQL_BACKEND: self.name,
                  self.EXTRA_BACKEND: self.extra_db}[backend]
        return f"{self.prefix}.{schema}.{table}.{key}"

    def _stored(self, backend: str, change: load.Change) -> bool:
        data = checker.last_on_subject(self.nats_url, self.stream,
                                       self.subject_of(backend, load.TABLE, change.key))
        if not data:
            return False
        event = json.loads(data)
        if event["type"] == "delete":
            return True
        return event["item"]["version"] >= change.version

    def wait_caught_up(self, timeout: float) -> None:
        """The stream holds the newest change each configured backend had committed when
        called (a removed backend catches up once it is added again).  An oversized change
        is never in the stream: the newest other one stands for it."""
        targets = {name: self.ledger.last(name, deliverable=True)
                   for name in self.backend_names}
        for name, change in targets.items():
            if change is not None:
                wait_for(lambda: self._stored(name, change), timeout,
                         f"backend {name}: {change.type} of key {change.key} v{change.version} "
                         f"in the stream", interval=0.2)

    def _wait_fences(self, timeout: float) -> None:
        fence_id = int(time.time())
        load.write_fence("postgresql", self.name, fence_id)
        load.write_fence("mysql", self.name, fence_id)
        if self.has_extra:
            load.write_fence("mysql", self.extra_db, fence_id)
        for backend in self.backend_names:
            subject = self.subject_of(backend, load.FENCE_TABLE, fence_id)
            wait_for(lambda: checker.last_on_subject(self.nats_url, self.stream,
                                                     subject) is not None,
                     timeout, f"the fence of backend {backend} in the stream", interval=0.2)

    # -- the run -------------------------------------------------------------------------------

    def execute(self) -> dict:
        opts = self.options
        started = time.monotonic()
        self.loads = [
            load.PgLoad(self.PG_BACKEND, self.name, self.ledger, opts.seed * 1000 + 1,
                        opts.rate, big_tx_share=opts.big_tx_share),
            load.MariaLoad(self.MYSQL_BACKEND, self.name, self.ledger, opts.seed * 1000 + 2,
                           opts.rate, big_tx_share=opts.big_tx_share),
        ]
        if self.has_extra:
            self.loads.append(load.MariaLoad(
                self.EXTRA_BACKEND, self.extra_db, self.ledger, opts.seed * 1000 + 4,
                opts.rate * opts.extra_rate_share, big_tx_share=opts.big_tx_share))
        self.injector = FaultInjector(self, opts.kinds, opts.seed, opts.interval,
                                      per_kind=opts.per_kind, settle=opts.settle,
                                      recovery_timeout=opts.recovery_timeout, log=self.log)
        if opts.bystander:
            self.bystander = load.Bystander(self.bystander_db, opts.seed * 1000 + 3,
                                            opts.rate / 2)
            self.bystander.start()
        for thread in self.loads:
            thread.start()
        self.injector.start()
        try:
            deadline = started + opts.seconds
            # per_kind: the faults end the run; each of them is bounded, and so is the whole
            give_up = deadline + len(opts.kinds) * (opts.per_kind or 0) * (
                opts.recovery_timeout + 120)
            while True:
                now = time.monotonic()
                if self.injector.failure is not None or self.injector.gave_up \
                        or any(t.failure is not None for t in self.loads):
                    break       # gave up: more load would only add to what is undelivered
                if opts.per_kind is None:
                    if now >= deadline:
                        break
                elif not self.injector.is_alive() and now >= deadline:
                    break
                elif now > give_up:
                    self.findings.append("the faults did not finish in time")
                    break
                time.sleep(0.2)     # polling the threads' state, not a correctness wait
        finally:
            self.injector.stop()
            self.injector.join(300)
            for thread in self.loads:
                thread.stop()
            for thread in self.loads:
                thread.join(300)
            if self.bystander is not None:
                self.bystander.stop()
                self.bystander.join(60)
        load_seconds = time.monotonic() - started
        for thread in self.loads:
            if thread.failure is not None:
                self.findings.append(f"load {thread.backend} failed: {thread.failure!r}")
        if self.injector.failure is not None:
            self.findings.append(f"fault injector failed: {self.injector.failure!r}")
        for record in self.injector.records:
            if record.error:
                self.findings.append(f"{record.kind} at {record.at:.1f}s: {record.error}")

        # everything back up, then the fences: after them nothing can be missing
        self._restore_all()
        for process in self.processes:
            if not process.alive():
                self.findings.append(f"lapidus {getattr(process, 'name', '')} was not running "
                                     f"after the load (exit {process.proc.returncode}); "
                                     f"started again")
                process.start()
        drained_from = time.monotonic()
        try:
            self._wait_fences(opts.final_timeout)
        except ChaosTimeout as exc:
            self.findings.append(f"fences not delivered: {exc}")
        drain_seconds = time.monotonic() - drained_from

        messages = checker.read_stream(self.nats_url, self.stream, f"{self.prefix}.>")
        ledger = self.ledger.snapshot()
        self.report = checker.check(messages, ledger,
                                    deadletters.read_all(self.state_dir, ledger))
        log_records = [r for process in self.processes for r in process.records()]
        logs = {
            "tracebacks": sum(p.log_text().count("Traceback") for p in self.processes),
            "fatal": sum(1 for r in log_records if "FATAL" in str(r.get("event", ""))),
        }
        # part of passing: no FATAL and no traceback, in the log or from lapidusctl
        if logs["fatal"]:
            self.findings.append(f"{logs['fatal']} FATAL in the Lapidus log")
        if logs["tracebacks"]:
            self.findings.append(f"{logs['tracebacks']} tracebacks in the Lapidus log")
        if self.ctl_log.tracebacks:
            self.findings.append(f"lapidusctl printed {self.ctl_log.tracebacks} tracebacks")
        cluster = None
        if self.nodes:
            both = overlaps(self.nodes)
            for a, b in both[:10]:
                self.findings.append(f"backend {a[1]} streamed by {a[0]} and {b[0]} at once "
                                     f"({max(a[2], b[2]):.3f} to {min(a[3], b[3]):.3f})")
            cluster = {"nodes": len(self.nodes), "lease_ttl": opts.lease_ttl,
                       "overlaps": len(both),
                       "ownership_changes": sum(1 for r in log_records
                                                if r.get("event") == "cluster: streaming this "
                                                                     "backend here")}
        self.result = {
            "seed": opts.seed, "load_seconds": round(load_seconds, 1),
            "drain_seconds": round(drain_seconds, 1),
            "faults": self.injector.summary(),
            "fault_count": len(self.injector.records),
            "fault_log": [asdict(r) for r in self.injector.records],
            "load": {t.backend: t.stats.as_dict() for t in self.loads},
            "bystander_writes": self.bystander.writes if self.bystander is not None else None,
            "lapidus_starts": sum(p.starts for p in self.processes),
            "cluster": cluster,
            "lapidus_log": {
                **logs,
                "worker_restarts": sum(1 for r in log_records
                                       if r.get("event") == "exited; restarting after backoff"),
                "dispatcher_restarts": sum(
                    1 for r in log_records
                    if r.get("event") == "dispatcher died; restarting it after backoff"),
                "reloads": sum(1 for r in log_records
                               if r.get("event") == "configuration reloaded"),
            },
            "lapidusctl": {"calls": self.ctl_log.calls, "tracebacks": self.ctl_log.tracebacks,
                           "failures": self.ctl_log.failures},
            "check": self.report.as_dict(),
            "findings": list(self.findings),
            "ok": self.report.ok and not self.findings,
            "workdir": str(self.workdir),
            "keep": opts.keep,
        }
        (self.workdir / "report.json").write_text(json.dumps(self.result, indent=2))
        return self.result

    def _restore_all(self) -> None:
        for proxy in self.proxies.values():
            proxy.restore()
        if self.nats_cluster is not None:
            self.nats_cluster.ensure()
        else:
            self.nats_server.ensure()
        servers.ensure_mariadb()
        servers.ensure_postgresql()
        if self.plan is not None and self.has_extra and not self.plan.extra_present \
                and self.lapidus.alive():
            # its writer went on: everything it committed must arrive once it is back
            self.plan.flip_extra()
            offset = self.lapidus.reload(self.plan.render())
            try:
                self.lapidus.wait_logged("configuration reloaded", offset, timeout=RECOVERY)
            except ChaosTimeout as exc:
                self.findings.append(f"adding the extra backend back: {exc}")

    # -- clean-up ------------------------------------------------------------------------------

    def teardown(self) -> None:
        errors = []

        def attempt(what, action):
            try:
                action()
            except Exception as exc:
                errors.append(f"{what}: {exc!r}")
        if self.injector is not None:
            self.injector.stop()
        for thread in self.loads + [self.bystander]:
            if thread is not None:
                thread.stop()
        for process in self.processes:
            attempt("stop lapidus", process.stop)
        attempt("mariadb", servers.ensure_mariadb)
        attempt("postgresql", servers.ensure_postgresql)
        for proxy in self.proxies.values():
            attempt(f"proxy {proxy.name}", proxy.close)
        if "pg" in self._created:
            attempt("drop the PostgreSQL database and slot",
                    lambda: load.drop_pg_database(self.name, self.slot))
        if "mysql" in self._created:
            attempt("drop the MariaDB database", lambda: load.drop_mysql_database(self.name))
        if "bystander" in self._created:
            attempt("drop the bystander database",
                    lambda: load.drop_mysql_database(self.bystander_db))
        if "extra" in self._created:
            attempt("drop the extra backend's database",
                    lambda: load.drop_mysql_database(self.extra_db))
        if "nats" in self._created:
            nats_servers = self.nats_cluster or self.nats_server
            attempt("nats", nats_servers.ensure)
            if "stream" in self._created:
                attempt("delete the stream", self._delete_stream)
            attempt("stop nats", self.nats_cluster.stop if self.nats_cluster is not None
                    else self.nats_server.shutdown)
        self.ledger.close()
        if errors:
            self.log("clean-up problems: " + "; ".join(errors))
        ok = self.result.get("ok", False)
        if ok and not self.options.keep and not errors:
            shutil.rmtree(self.workdir, ignore_errors=True)


def format_result(result: dict, report: Optional[checker.CheckReport]) -> str:
    lines = [f"chaos run, seed {result['seed']}: load {result['load_seconds']} s, "
             f"drain after the load {result['drain_seconds']} s, "
             f"lapidus started {result['lapidus_starts']} times"]
    faults = ", ".join(f"{k} {v}" for k, v in sorted(result["faults"].items()))
    lines.append(f"faults injected: {result['fault_count']} ({faults})")
    for backend, stats in result["load"].items():
        lines.append(f"load {backend}: {stats['transactions']} transactions committed, "
                     f"{stats['resolved_committed']} committed with the answer lost, "
                     f"{stats['resolved_rolled_back']} not committed, {stats['reconnects']} "
                     f"connections, errors {stats['errors']}")
    if result.get("bystander_writes") is not None:
        lines.append(f"bystander (MariaDB, another database): {result['bystander_writes']} "
                     f"transactions")
    logs = result["lapidus_log"]
    cluster = result.get("cluster")
    if cluster:
        lines.append(f"cluster: {cluster['nodes']} nodes, lease_ttl {cluster['lease_ttl']:g}s, "
                     f"{cluster['ownership_changes']} times a node began streaming a backend, "
                     f"{cluster['overlaps']} overlaps (two nodes streaming one backend)")
    lines.append(f"lapidus log: {logs['worker_restarts']} worker restarts, "
                 f"{logs['dispatcher_restarts']} dispatcher restarts, {logs['reloads']} "
                 f"reloads, {logs['fatal']} FATAL, {logs['tracebacks']} tracebacks")
    ctl_calls = result.get("lapidusctl") or {}
    if ctl_calls.get("calls"):
        lines.append(f"lapidusctl status: {ctl_calls['calls']} calls, "
                     f"{len(ctl_calls['failures'])} without an answer, "
                     f"{ctl_calls['tracebacks']} tracebacks")
    if report is not None:
        lines.append(checker.format_report(report))
    for finding in result["findings"]:
        lines.append(f"FINDING: {finding}")
    kept = not result["ok"] or result.get("keep")
    lines.append(("OK" if result["ok"] else "FAILED") + f" (work directory {result['workdir']}"
                 + (")" if kept else ", removed)"))
    return "\n".join(lines)


def run_chaos(options: ChaosOptions, log: Callable[[str], None] = print) -> ChaosRun:
    """Set up, run, check and clean up; ``.result`` and ``.report`` hold the outcome."""
    run = ChaosRun(options, log)
    try:
        run.setup()
        run.execute()
    finally:
        run.teardown()
    return run


__all__ = ["ChaosOptions", "ChaosRun", "run_chaos", "format_result", "KINDS", "CI_KINDS",
           "NEW_KINDS", "CLUSTER_KINDS"]
