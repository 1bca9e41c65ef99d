"""Prometheus text exposition of the supervisor's view of every backend.

Runs in the supervisor process.  Workers and the dispatcher report counters to the supervisor
once a second over their status pipes; the supervisor renders them on request, so there are no
per-process metric files and nothing to clean up after a crash.  Counters from a restarted
worker process restart at zero; the supervisor carries the previous process's totals forward so
the exported counters only ever grow.

The text is written by the official client library, prometheus_client, from a collector made
for each request (:class:`StatusCollector`): the supervisor's status is the one source of
truth, so nothing is kept in the library's metric objects between requests, and the global
default registry (with its process and Python metrics) is not used.  prometheus_client is
imported on the first request only: this module is loaded by the supervisor before it forks
its children, and the library brings in ``ssl``, ``threading`` and ``http.server``
(tests/unit/test_lean_imports.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Tuple

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

# The Prometheus text format 0.0.4, what prometheus_client's generate_latest() writes (its
# CONTENT_TYPE_LATEST names version 1.0.0 in recent releases).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

STATE_VALUES = ("STOPPED", "STARTING", "RUNNING", "WAITING", "BACKOFF", "STOPPING", "FATAL")

# Every family, in the order of the text: name, type, help text, label names (each sample's
# labels, in this order).  docs/monitoring.md lists the same names (tests/unit/test_docs.py).
FAMILIES: Tuple[Tuple[str, str, str, Tuple[str, ...]], ...] = (
    ("lapidus_events_total", "counter", "Events read from the source and sent to the sinks.",
     ("backend", "table", "type")),
    ("lapidus_backend_state", "gauge", "1 for the backend's current state.",
     ("backend", "state")),
    ("lapidus_backend_up", "gauge", "1 when the backend is streaming.", ("backend",)),
    ("lapidus_restarts_total", "counter", "Worker restarts after a crash.", ("backend",)),
    ("lapidus_delivery_lag_seconds", "gauge",
     "Age (commit time) of the oldest event not yet confirmed by every sink; 0 when idle.",
     ("backend",)),
    ("lapidus_source_lag_bytes", "gauge",
     "Bytes read from the source but not yet processed (PostgreSQL: unread spool).",
     ("backend",)),
    ("lapidus_queue_depth_batches", "gauge", "Batches sent to the sinks, not yet confirmed.",
     ("backend",)),
    ("lapidus_spool_bytes", "gauge", "Size of the PostgreSQL spool on local disk.",
     ("backend",)),
    ("lapidus_pg_slot_retained_wal_bytes", "gauge",
     "WAL the server keeps for the replication slot (pg_current_wal_lsn - restart_lsn).",
     ("backend", "slot")),
    ("lapidus_sink_errors_total", "counter", "Failed deliveries (each one retried).",
     ("backend", "sink")),
    ("lapidus_sink_up", "gauge",
     "1 while the sink is connected (sinks with a connection: nats).", ("backend", "sink")),
    ("lapidus_sink_down_seconds", "gauge",
     "How long the sink has been without a connection; 0 while connected.",
     ("backend", "sink")),
    ("lapidus_worker_rss_bytes", "gauge", "Resident memory of the worker process.",
     ("backend",)),
    ("lapidus_backend_waiting_seconds", "gauge",
     "How long the backend has been waiting for its unreachable database; 0 otherwise.",
     ("backend",)),
    ("lapidus_sink_failing", "gauge",
     "1 while the sink's last delivery failed (it is being retried).", ("backend", "sink")),
    ("lapidus_undeliverable", "gauge",
     "1 while the backend is held at an event the sink refuses for good.",
     ("backend", "sink")),
    ("lapidus_dead_letters", "gauge",
     "Events in the backend's dead-letter file (refused for good, not sent again yet).",
     ("backend",)),
    ("lapidus_snapshot_running", "gauge",
     "1 while the backend's snapshot or backfill runs.", ("backend",)),
    ("lapidus_snapshot_number", "gauge",
     "Number of the current or last run: 0 the initial snapshot, 1, 2, ... backfills.",
     ("backend",)),
    ("lapidus_backfills_queued", "gauge", "Backfills waiting for the current run to end.",
     ("backend",)),
    ("lapidus_snapshot_rows", "gauge", "Rows the snapshot emitted as read events so far.",
     ("backend",)),
    ("lapidus_snapshot_table_rows", "gauge",
     "Rows the snapshot emitted of the table it reads now.", ("backend", "table")),
    ("lapidus_snapshot_table_rows_estimated", "gauge",
     "The server's row estimate of the table the snapshot reads (PostgreSQL: "
     "pg_class.reltuples).", ("backend", "table")),
    ("lapidus_snapshot_rows_per_second", "gauge", "The snapshot's rate since it (re)started.",
     ("backend",)),
    ("lapidus_websocket_clients", "gauge",
     "Clients connected to the websocket sink's listener.", ("backend", "sink")),
    ("lapidus_websocket_frames_total", "counter",
     "Event frames the websocket sink wrote to its clients.", ("backend", "sink")),
    ("lapidus_websocket_slow_clients_total", "counter",
     "Websocket clients closed (1008) for falling behind.", ("backend", "sink")),
    ("lapidus_websocket_refused_total", "counter",
     "Websocket connections refused at the handshake (token, origin, query, max_clients).",
     ("backend", "sink")),
    ("lapidus_websocket_replay_events", "gauge",
     "Events in the backend's websocket replay window.", ("backend", "sink")),
    ("lapidus_websocket_snapshot_runs", "gauge",
     "Snapshot runs queued or running for websocket clients (snapshot=1).",
     ("backend", "sink")),
    ("lapidus_cluster_owned", "gauge",
     "Cluster mode: 1 while this node holds the backend's lease, else 0.", ("backend",)),
    ("lapidus_cluster_owner", "gauge",
     "Cluster mode: 1 for the node that holds the backend's lease, as this node sees it.",
     ("backend", "node")),
    ("lapidus_cluster_lease_renewal_seconds", "gauge",
     "Cluster mode: how long this node's last round of lease renewals took.", ("node",)),
    ("lapidus_cluster_lease_renewal_failures_total", "counter",
     "Cluster mode: rounds of lease renewals in which one failed.", ("node",)),
    ("lapidus_cluster_connected", "gauge",
     "Cluster mode: 1 while the lease child is connected to NATS with the bucket open.",
     ("node",)),
    ("lapidus_cluster_nodes_live", "gauge",
     "Cluster mode: nodes whose record this node saw renewed within lease_ttl.", ("node",)),
)

# name -> (the prometheus_client family being filled, its label names)
Families = Dict[str, Tuple["Metric", Tuple[str, ...]]]


def _add(f: Families, name: str, value, **labels) -> None:
    """One sample of family ``name``; none when the status lacks the figure (``value`` None)."""
    if value is None:
        return
    family, names = f[name]
    if tuple(labels) != names:
        raise ValueError(f"{name}: labels {tuple(labels)}, declared {names}")
    family.add_metric([str(v) for v in labels.values()], float(value))


def _snapshot_metrics(f: Families, name: str, snapshot) -> None:
    """A backend's snapshot gauges (docs/snapshots.md); none for a backend without one."""
    if not snapshot:
        return
    running = snapshot.get("state") == "running"
    _add(f, "lapidus_snapshot_running", 1 if running else 0, backend=name)
    _add(f, "lapidus_snapshot_number", snapshot.get("n") or 0, backend=name)
    _add(f, "lapidus_snapshot_rows", snapshot.get("rows") or 0, backend=name)
    if running:
        table = snapshot.get("table") or ""
        _add(f, "lapidus_snapshot_table_rows", snapshot.get("table_rows") or 0, backend=name,
             table=table)
        if snapshot.get("table_rows_estimated") is not None:
            _add(f, "lapidus_snapshot_table_rows_estimated", snapshot["table_rows_estimated"],
                 backend=name, table=table)
        _add(f, "lapidus_snapshot_rows_per_second", snapshot.get("rows_per_second") or 0,
             backend=name)


def _websocket_metrics(f: Families, name: str, sink: str, state: dict) -> None:
    """The websocket sink's figures (docs/sinks.md#websocket), from its health()."""
    if "frames_sent" not in state:
        return
    for metric, key in (("lapidus_websocket_clients", "clients"),
                        ("lapidus_websocket_frames_total", "frames_sent"),
                        ("lapidus_websocket_slow_clients_total", "slow_clients_closed"),
                        ("lapidus_websocket_refused_total", "refused"),
                        ("lapidus_websocket_replay_events", "replay_events"),
                        ("lapidus_websocket_snapshot_runs", "snapshot_runs")):
        _add(f, metric, state.get(key) or 0, backend=name, sink=sink)


def _cluster_metrics(f: Families, cluster) -> None:
    """Ownership and lease renewal (docs/cluster.md); none for a Lapidus that runs alone."""
    if not cluster:
        return
    me = cluster.get("node")
    for lease in cluster.get("leases") or ():
        owner = lease.get("owner")
        live = owner is not None and not lease.get("expired")
        _add(f, "lapidus_cluster_owned", 1 if live and owner == me else 0,
             backend=lease["backend"])
        if live:
            _add(f, "lapidus_cluster_owner", 1, backend=lease["backend"], node=owner)
    _add(f, "lapidus_cluster_lease_renewal_seconds", cluster.get("renewal_seconds"), node=me)
    _add(f, "lapidus_cluster_lease_renewal_failures_total",
         cluster.get("renewal_failures") or 0, node=me)
    _add(f, "lapidus_cluster_connected", 1 if cluster.get("connected") else 0, node=me)
    _add(f, "lapidus_cluster_nodes_live",
         sum(1 for n in cluster.get("nodes") or () if n.get("live")), node=me)


def families(status: dict) -> List["Metric"]:
    """Every family of :data:`FAMILIES`, in its order, filled from ``status``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    f: Families = {name: ((CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
        name, text, labels=labels), labels) for name, kind, text, labels in FAMILIES}
    for b in status.get("backends", []):
        name = b["name"]
        for table, kinds in (b.get("event_counts") or {}).items():
            for kind, count in kinds.items():
                _add(f, "lapidus_events_total", count, backend=name, table=table, type=kind)
        for state in STATE_VALUES:
            _add(f, "lapidus_backend_state", 1 if b["state"] == state else 0, backend=name,
                 state=state)
        _add(f, "lapidus_backend_up", 1 if b["state"] == "RUNNING" else 0, backend=name)
        _add(f, "lapidus_restarts_total", b.get("restarts", 0), backend=name)
        _add(f, "lapidus_delivery_lag_seconds", b.get("lag_seconds"), backend=name)
        _add(f, "lapidus_source_lag_bytes", b.get("lag_bytes"), backend=name)
        _add(f, "lapidus_queue_depth_batches", b.get("inflight"), backend=name)
        _add(f, "lapidus_spool_bytes", b.get("spool_bytes"), backend=name)
        if b.get("slot_retained_wal_bytes") is not None:
            _add(f, "lapidus_pg_slot_retained_wal_bytes", b["slot_retained_wal_bytes"],
                 backend=name, slot=b.get("slot", ""))
        _add(f, "lapidus_worker_rss_bytes", b.get("rss_bytes"), backend=name)
        _add(f, "lapidus_backend_waiting_seconds", b.get("waiting_seconds") or 0, backend=name)
        _add(f, "lapidus_dead_letters", b.get("dead_letters") or 0, backend=name)
        _snapshot_metrics(f, name, b.get("snapshot"))
        _add(f, "lapidus_backfills_queued",
             len((b.get("backfills") or {}).get("queued") or []), backend=name)
        for sink in (b.get("undeliverable") or {}):
            _add(f, "lapidus_undeliverable", 1, backend=name, sink=sink)
        for sink, state in (b.get("sinks") or {}).items():
            if "connected" not in state:
                continue
            _add(f, "lapidus_sink_up", 1 if state["connected"] else 0, backend=name, sink=sink)
            _add(f, "lapidus_sink_down_seconds",
                 0 if state["connected"] else (state.get("down_seconds") or 0),
                 backend=name, sink=sink)
            _websocket_metrics(f, name, sink, state)
    _cluster_metrics(f, status.get("cluster"))
    dispatcher = status.get("dispatcher") or {}
    for backend, sinks in (dispatcher.get("sink_failing") or {}).items():
        for sink in sinks:
            _add(f, "lapidus_sink_failing", 1, backend=backend, sink=sink)
    for backend, sinks in (dispatcher.get("sink_errors") or {}).items():
        for sink, count in sinks.items():
            _add(f, "lapidus_sink_errors_total", count, backend=backend, sink=sink)
    return [family for family, _ in f.values()]


class StatusCollector:
    """A prometheus_client collector over one status (:meth:`Arbiter.status`), made per request."""

    def __init__(self, status: dict):
        self.status = status

    def collect(self) -> List["Metric"]:
        return families(self.status)


def render(status: dict) -> str:
    """``status`` is :meth:`Arbiter.status`; returns the whole /metrics body."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)   # not the default: no process metrics
    registry.register(StatusCollector(status))
    return generate_latest(registry).decode()
