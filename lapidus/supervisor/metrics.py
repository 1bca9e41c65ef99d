"""Prometheus text exposition of the supervisor's view of every backend.

Runs in the supervisor process.  Workers and the dispatcher report counters to the supervisor
once a second over their status pipes; the supervisor renders them on request, so there are no
per-process metric files and nothing to clean up after a crash.  Counters from a restarted
worker process restart at zero; the supervisor carries the previous process's totals forward so
the exported counters only ever grow.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[Tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


class Family:
    def __init__(self, name: str, kind: str, help_text: str):
        self.name, self.kind, self.help = name, kind, help_text
        self.samples: List[Tuple[str, float]] = []

    def add(self, value, **labels) -> None:
        if value is None:
            return
        self.samples.append((_labels(labels.items()), float(value)))

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        lines += [f"{self.name}{labels} {value:g}" if value != int(value) or abs(value) > 1e15
                  else f"{self.name}{labels} {int(value)}" for labels, value in self.samples]
        return "\n".join(lines)


STATE_VALUES = ("STOPPED", "STARTING", "RUNNING", "WAITING", "BACKOFF", "STOPPING", "FATAL")


def _snapshot_metrics(f: Dict[str, "Family"], name: str, snapshot) -> None:
    """A backend's snapshot gauges (docs/snapshots.md); none for a backend without one."""
    if not snapshot:
        return
    running = snapshot.get("state") == "running"
    f["lapidus_snapshot_running"].add(1 if running else 0, backend=name)
    f["lapidus_snapshot_number"].add(snapshot.get("n") or 0, backend=name)
    f["lapidus_snapshot_rows"].add(snapshot.get("rows") or 0, backend=name)
    if running:
        table = snapshot.get("table") or ""
        f["lapidus_snapshot_table_rows"].add(snapshot.get("table_rows") or 0, backend=name,
                                             table=table)
        if snapshot.get("table_rows_estimated") is not None:
            f["lapidus_snapshot_table_rows_estimated"].add(
                snapshot["table_rows_estimated"], backend=name, table=table)
        f["lapidus_snapshot_rows_per_second"].add(snapshot.get("rows_per_second") or 0,
                                                  backend=name)


def _websocket_metrics(f: Dict[str, "Family"], name: str, sink: str, state: dict) -> None:
    """The websocket sink's figures (docs/sinks.md#websocket), from its health()."""
    if "frames_sent" not in state:
        return
    for metric, key in (("lapidus_websocket_clients", "clients"),
                        ("lapidus_websocket_frames_total", "frames_sent"),
                        ("lapidus_websocket_slow_clients_total", "slow_clients_closed"),
                        ("lapidus_websocket_refused_total", "refused"),
                        ("lapidus_websocket_replay_events", "replay_events")):
        f[metric].add(state.get(key) or 0, backend=name, sink=sink)


def _cluster_metrics(f: Dict[str, "Family"], cluster) -> None:
    """Ownership and lease renewal (docs/cluster.md); none for a Lapidus that runs alone."""
    if not cluster:
        return
    me = cluster.get("node")
    for lease in cluster.get("leases") or ():
        owner = lease.get("owner")
        live = owner is not None and not lease.get("expired")
        f["lapidus_cluster_owned"].add(1 if live and owner == me else 0,
                                       backend=lease["backend"])
        if live:
            f["lapidus_cluster_owner"].add(1, backend=lease["backend"], node=owner)
    f["lapidus_cluster_lease_renewal_seconds"].add(cluster.get("renewal_seconds"), node=me)
    f["lapidus_cluster_lease_renewal_failures_total"].add(cluster.get("renewal_failures") or 0,
                                                          node=me)
    f["lapidus_cluster_connected"].add(1 if cluster.get("connected") else 0, node=me)
    f["lapidus_cluster_nodes_live"].add(sum(1 for n in cluster.get("nodes") or ()
                                            if n.get("live")), node=me)


def render(status: dict) -> str:
    """``status`` is :meth:`Arbiter.status`; returns the whole /metrics body."""
    f: Dict[str, Family] = {name: Family(name, kind, text) for name, kind, text in (
        ("lapidus_events_total", "counter", "Events read from the source and sent to the sinks."),
        ("lapidus_backend_state", "gauge", "1 for the backend's current state."),
        ("lapidus_backend_up", "gauge", "1 when the backend is streaming."),
        ("lapidus_restarts_total", "counter", "Worker restarts after a crash."),
        ("lapidus_delivery_lag_seconds", "gauge",
         "Age (commit time) of the oldest event not yet confirmed by every sink; 0 when idle."),
        ("lapidus_source_lag_bytes", "gauge",
         "Bytes read from the source but not yet processed (PostgreSQL: unread spool)."),
        ("lapidus_queue_depth_batches", "gauge", "Batches sent to the sinks, not yet confirmed."),
        ("lapidus_spool_bytes", "gauge", "Size of the PostgreSQL spool on local disk."),
        ("lapidus_pg_slot_retained_wal_bytes", "gauge",
         "WAL the server keeps for the replication slot (pg_current_wal_lsn - restart_lsn)."),
        ("lapidus_sink_errors_total", "counter", "Failed deliveries (each one retried)."),
        ("lapidus_sink_up", "gauge",
         "1 while the sink is connected (sinks with a connection: nats)."),
        ("lapidus_sink_down_seconds", "gauge",
         "How long the sink has been without a connection; 0 while connected."),
        ("lapidus_worker_rss_bytes", "gauge", "Resident memory of the worker process."),
        ("lapidus_backend_waiting_seconds", "gauge",
         "How long the backend has been waiting for its unreachable database; 0 otherwise."),
        ("lapidus_sink_failing", "gauge",
         "1 while the sink's last delivery failed (it is being retried)."),
        ("lapidus_undeliverable", "gauge",
         "1 while the backend is held at an event the sink refuses for good."),
        ("lapidus_dead_letters", "gauge",
         "Events in the backend's dead-letter file (refused for good, not sent again yet)."),
        ("lapidus_snapshot_running", "gauge",
         "1 while the backend's snapshot or backfill runs."),
        ("lapidus_snapshot_number", "gauge",
         "Number of the current or last run: 0 the initial snapshot, 1, 2, ... backfills."),
        ("lapidus_backfills_queued", "gauge", "Backfills waiting for the current run to end."),
        ("lapidus_snapshot_rows", "gauge", "Rows the snapshot emitted as read events so far."),
        ("lapidus_snapshot_table_rows", "gauge",
         "Rows the snapshot emitted of the table it reads now."),
        ("lapidus_snapshot_table_rows_estimated", "gauge",
         "The server's row estimate of the table the snapshot reads (PostgreSQL: "
         "pg_class.reltuples)."),
        ("lapidus_snapshot_rows_per_second", "gauge", "The snapshot's rate since it (re)started."),
        ("lapidus_websocket_clients", "gauge",
         "Clients connected to the websocket sink's listener."),
        ("lapidus_websocket_frames_total", "counter",
         "Event frames the websocket sink wrote to its clients."),
        ("lapidus_websocket_slow_clients_total", "counter",
         "Websocket clients closed (1008) for falling behind."),
        ("lapidus_websocket_refused_total", "counter",
         "Websocket connections refused at the handshake (token, origin, query, max_clients)."),
        ("lapidus_websocket_replay_events", "gauge",
         "Events in the backend's websocket replay window."),
        ("lapidus_cluster_owned", "gauge",
         "Cluster mode: 1 while this node holds the backend's lease, else 0."),
        ("lapidus_cluster_owner", "gauge",
         "Cluster mode: 1 for the node that holds the backend's lease, as this node sees it."),
        ("lapidus_cluster_lease_renewal_seconds", "gauge",
         "Cluster mode: how long this node's last round of lease renewals took."),
        ("lapidus_cluster_lease_renewal_failures_total", "counter",
         "Cluster mode: rounds of lease renewals in which one failed."),
        ("lapidus_cluster_connected", "gauge",
         "Cluster mode: 1 while the lease child is connected to NATS with the bucket open."),
        ("lapidus_cluster_nodes_live", "gauge",
         "Cluster mode: nodes whose record this node saw renewed within lease_ttl."),
    )}
    for b in status.get("backends", []):
        name = b["name"]
        for table, kinds in (b.get("event_counts") or {}).items():
            for kind, count in kinds.items():
                f["lapidus_events_total"].add(count, backend=name, table=table, type=kind)
        for state in STATE_VALUES:
            f["lapidus_backend_state"].add(1 if b["state"] == state else 0, backend=name,
                                           state=state)
        f["lapidus_backend_up"].add(1 if b["state"] == "RUNNING" else 0, backend=name)
        f["lapidus_restarts_total"].add(b.get("restarts", 0), backend=name)
        f["lapidus_delivery_lag_seconds"].add(b.get("lag_seconds"), backend=name)
        f["lapidus_source_lag_bytes"].add(b.get("lag_bytes"), backend=name)
        f["lapidus_queue_depth_batches"].add(b.get("inflight"), backend=name)
        f["lapidus_spool_bytes"].add(b.get("spool_bytes"), backend=name)
        if b.get("slot_retained_wal_bytes") is not None:
            f["lapidus_pg_slot_retained_wal_bytes"].add(
                b["slot_retained_wal_bytes"], backend=name, slot=b.get("slot", ""))
        f["lapidus_worker_rss_bytes"].add(b.get("rss_bytes"), backend=name)
        f["lapidus_backend_waiting_seconds"].add(b.get("waiting_seconds") or 0, backend=name)
        f["lapidus_dead_letters"].add(b.get("dead_letters") or 0, backend=name)
        _snapshot_metrics(f, name, b.get("snapshot"))
        f["lapidus_backfills_queued"].add(len((b.get("backfills") or {}).get("queued") or []),
                                          backend=name)
        for sink in (b.get("undeliverable") or {}):
            f["lapidus_undeliverable"].add(1, backend=name, sink=sink)
        for sink, state in (b.get("sinks") or {}).items():
            if "connected" not in state:
                continue
            f["lapidus_sink_up"].add(1 if state["connected"] else 0, backend=name, sink=sink)
            f["lapidus_sink_down_seconds"].add(
                0 if state["connected"] else (state.get("down_seconds") or 0),
                backend=name, sink=sink)
            _websocket_metrics(f, name, sink, state)
    _cluster_metrics(f, status.get("cluster"))
    dispatcher = status.get("dispatcher") or {}
    for backend, sinks in (dispatcher.get("sink_failing") or {}).items():
        for sink in sinks:
            f["lapidus_sink_failing"].add(1, backend=backend, sink=sink)
    for backend, sinks in (dispatcher.get("sink_errors") or {}).items():
        for sink, count in sinks.items():
            f["lapidus_sink_errors_total"].add(count, backend=backend, sink=sink)
    return "\n".join(family.render() for family in f.values()) + "\n"
