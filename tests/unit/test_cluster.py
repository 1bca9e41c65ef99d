"""Cluster mode without NATS: the ``[cluster]`` settings, the fair share and hand-over rules,
the supervisor's gate (when a worker may run, when it is stopped and killed), the lease
records, and what ``/healthz``, ``/metrics`` and ``lapidusctl cluster`` make of a view.

The protocol against real NATS servers and real nodes: tests/integration/test_cluster.py.
"""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lapidus import config as config_module
from lapidus.cluster import balance
from lapidus.cluster.protocol import KILL_AT, STOP_AT, Grant, Lease
from lapidus.config import ConfigError, parse_config
from lapidus.ctl_cluster import format_cluster
from lapidus.supervisor import metrics
from lapidus.supervisor.cluster_gate import ClusterGate
from lapidus.supervisor.http import healthz


@pytest.fixture(autouse=True)
def not_root(monkeypatch):
    monkeypatch.setattr(config_module, "_running_as_root", lambda: False)


def mysql(name="crm", **extra):
    return {"name": name, "type": "mysql", "database": "crm", "server_id": 10, **extra}


def parse(cluster, *backends):
    return parse_config({"cluster": cluster, "backends": list(backends or [mysql()])},
                        source="/etc/lapidus/lapidus.toml", env={})


def problems(cluster, *backends):
    with pytest.raises(ConfigError) as info:
        parse(cluster, *backends)
    return info.value.problems


# -- settings ----------------------------------------------------------------------------------

def test_cluster_settings_take_their_defaults():
    cluster = parse({"servers": ["nats://10.0.0.1:4222"]}).cluster
    assert cluster.servers == ("nats://10.0.0.1:4222",)
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", cluster.node)      # the short host name
    assert (cluster.bucket, cluster.replicas, cluster.lease_ttl, cluster.max_backends) == (
        "lapidus", 1, 15.0, None)


def test_without_a_cluster_table_the_node_runs_alone():
    config = parse_config({"backends": [mysql()]}, source="/etc/lapidus/lapidus.toml", env={})
    assert config.cluster is None


def test_cluster_connection_problems_are_judged_like_the_nats_sinks_and_listed_together():
    assert problems({"servers": ["nats://a:4222", "nats//b"], "password": "pw",
                     "lease_ttl": 1, "node": "a.b", "replicas": 7}) == [
        "cluster.node: expected a node name of letters, digits, _ and -, got \"a.b\"",
        "cluster.replicas: expected an integer from 1 to 5, got 7",
        'cluster.servers[1]: is not a URL: expected scheme://host:port, as nats://host:4222 '
        '(is ":" or "//" missing after the scheme?)',
        'cluster.password: given without "user"; add user',
        "cluster.lease_ttl: must be at least 3 seconds (it is renewed every fifth of it), got 1",
    ]


def test_servers_are_required_and_an_unknown_key_is_named():
    assert problems({"sever": ["nats://a:4222"]}) == [
        'cluster.sever: unknown key (did you mean "servers"?)',
        "cluster.servers: missing (required: NATS servers of the cluster that holds the "
        "bucket)"]


def test_postgresql_backends_run_in_cluster_mode():
    config = parse({"servers": ["nats://a:4222"]}, mysql(),
                   {"name": "pg", "type": "postgresql", "database": "shop"},
                   {"name": "docs", "type": "mongo", "uri": "mongodb://db/docs"})
    assert [b.type for b in config.backends] == ["mysql", "postgresql", "mongo"]


def test_a_temporary_slot_is_refused_in_cluster_mode_with_the_reason():
    found = problems({"servers": ["nats://a:4222"]}, mysql(),
                     {"name": "pg", "type": "postgresql", "database": "shop",
                      "temporary_slot": True})
    assert len(found) == 1
    assert found[0].startswith("backends[1].temporary_slot: a temporary slot cannot run in "
                               "cluster mode: it is dropped with the connection")


def test_a_disabled_postgresql_backend_with_a_temporary_slot_is_fine_in_cluster_mode():
    config = parse({"servers": ["nats://a:4222"]}, mysql(),
                   {"name": "pg", "type": "postgresql", "database": "shop", "enabled": False,
                    "temporary_slot": True})
    assert config.cluster is not None


def test_cluster_secrets_never_show():
    config = parse({"servers": ["nats://u:hunter2@a:4222"], "token": "s3cret"})
    shown = repr(config.cluster) + repr(config.redacted())
    assert "hunter2" not in shown and "s3cret" not in shown
    assert config.cluster.connection_options()["token"] == "s3cret"


# -- the fair share --------------------------------------------------------------------------

def view(me, nodes, holders=None, backends=("a", "b", "c", "d"), handing_over=()):
    return balance.View(me, list(backends), nodes, holders or {}, set(handing_over))


def test_a_lone_node_takes_everything():
    assert balance.to_take(view("n1", {"n1": None})) == ["a", "b", "c", "d"]


def test_a_node_takes_up_to_its_share_and_its_first_choices_first():
    v = view("n1", {"n1": None, "n2": None})
    taken = balance.to_take(v)
    assert len(taken) == 2
    firsts = [b for b in v.backends if balance.first_choice(v, b) == "n1"]
    assert taken[:len(firsts[:2])] == firsts[:2]


def test_max_backends_caps_the_share_but_no_backend_is_left_when_a_node_has_room():
    nodes = {"n1": None, "n2": 1}
    holders = {"a": "n1", "b": "n1", "c": "n2"}
    assert balance.share(view("n1", nodes), "n2") == 1
    # d is free, n2 is at its cap: n1 takes it beyond its fair share
    assert balance.to_take(view("n1", nodes, holders)) == ["d"]
    assert balance.to_take(view("n2", nodes, holders)) == []


def test_a_node_above_its_share_hands_one_over_while_another_is_below():
    holders = {b: "n1" for b in "abcd"}
    give = balance.to_hand_over(view("n1", {"n1": None, "n2": None}, holders))
    assert give in "abcd"
    # one at a time
    assert balance.to_hand_over(view("n1", {"n1": None, "n2": None}, holders,
                                     handing_over={give})) is None
    # nobody below its share: keep them
    assert balance.to_hand_over(view("n1", {"n1": None, "n2": 0}, holders)) is None
    assert balance.to_hand_over(view("n1", {"n1": None}, holders)) is None


def test_every_node_computes_the_same_first_choice():
    nodes = {"n1": None, "n2": None, "n3": None}
    for backend in "abcdefgh":
        assert len({balance.first_choice(view(me, nodes, backends="abcdefgh"), backend)
                    for me in nodes}) == 1


# -- the supervisor's gate --------------------------------------------------------------------

class Cluster:
    lease_ttl = 10.0


def test_the_gate_lets_a_worker_run_only_while_its_lease_is_fresh():
    gate = ClusterGate(Cluster(), log=None)
    gate.on_message("leases", {"seq": 1, "grants": {"crm": Grant(5, 100.0)}})
    assert gate.may_run("crm", 100.0 + STOP_AT * 10 - 0.01)
    assert not gate.may_run("crm", 100.0 + STOP_AT * 10)
    assert gate.kill_at("crm") == 100.0 + KILL_AT * 10
    assert gate.epoch("crm") == 5
    assert not gate.may_run("shop", 100.0)


def test_a_lease_withdrawn_for_hand_over_stops_the_worker_and_a_lost_one_keeps_its_deadline():
    gate = ClusterGate(Cluster(), log=None)
    gate.on_message("leases", {"seq": 1, "grants": {"crm": Grant(5, 100.0)}})
    gate.on_message("leases", {"seq": 2, "grants": {"crm": Grant(5, 103.0, run=False)}})
    assert not gate.may_run("crm", 103.5)
    gate.on_message("leases", {"seq": 3, "grants": {}})
    assert not gate.may_run("crm", 103.5)
    assert gate.kill_at("crm") == 103.0 + KILL_AT * 10    # the last grant's deadline stays
    assert gate.deadlines(103.5, ["crm"]) == [103.0 + STOP_AT * 10, 103.0 + KILL_AT * 10]


def test_the_gate_tells_the_lease_child_only_what_changed():
    sent = []

    class Pipe:
        def send(self, message):
            sent.append(message)

    gate = ClusterGate(Cluster(), log=None)
    gate.outbox = Pipe()
    gate.on_message("leases", {"seq": 4, "grants": {}})
    gate.tell(["crm"])
    gate.tell(["crm"])
    gate.tell([])
    assert sent == [("workers", {"ack": 4, "running": ["crm"]}),
                    ("workers", {"ack": 4, "running": []})]


def test_a_lease_record_survives_its_round_trip_and_anything_else_is_none():
    lease = Lease("crm", "n1", 12, 15, handover=True)
    assert Lease.parse("crm", lease.value(), 15) == lease
    assert Lease.parse("crm", b"hello", 3) is None
    assert Lease.parse("crm", None, 3) is None


# -- what the supervisor shows ---------------------------------------------------------------

VIEW = {"node": "n1", "bucket": "lapidus", "lease_ttl": 15.0, "connected": True,
        "renewal_seconds": 0.0021, "renewal_failures": 1, "running_here": ["crm"],
        "nodes": [{"node": "n1", "live": True, "backends": 1, "share": 1, "max_backends": None},
                  {"node": "n2", "live": True, "backends": 1, "share": 1, "max_backends": 4}],
        "leases": [{"backend": "crm", "owner": "n1", "epoch": 7, "revision": 30, "age": 0.4,
                    "handover": False},
                   {"backend": "shop", "owner": "n2", "epoch": 9, "revision": 31, "age": 1.0,
                    "handover": True, "expired": False}]}


def status(states):
    return {"backends": [{"name": "crm", "state": states[0], "owner": "n1"},
                         {"name": "shop", "state": states[1], "owner": "n2"}],
            "cluster": VIEW, "dispatcher": {}}


def test_healthz_counts_only_the_backends_no_other_node_holds():
    assert healthz(status(["RUNNING", "STOPPED"]))["ok"] is True
    assert healthz(status(["STOPPED", "STOPPED"]))["not_streaming"] == ["crm"]
    disconnected = status(["RUNNING", "STOPPED"])
    disconnected["cluster"] = {**VIEW, "connected": False}
    assert healthz(disconnected)["ok"] is False


def test_metrics_export_ownership_and_renewal():
    text = metrics.render(status(["RUNNING", "STOPPED"]))
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for family in text_string_to_metric_families(text) for s in family.samples}
    assert found[("lapidus_cluster_owned", (("backend", "crm"),))] == 1
    assert found[("lapidus_cluster_owned", (("backend", "shop"),))] == 0
    assert found[("lapidus_cluster_owner", (("backend", "shop"), ("node", "n2")))] == 1
    assert found[("lapidus_cluster_lease_renewal_seconds", (("node", "n1"),))] == 0.0021
    assert found[("lapidus_cluster_nodes_live", (("node", "n1"),))] == 2


def test_lapidusctl_cluster_shows_nodes_leases_owners_and_hand_overs():
    lines = format_cluster(VIEW).splitlines()
    assert lines[0] == ("node n1, bucket lapidus, lease_ttl 15.0s, connected, last renewal "
                        "2.1ms, 1 failed renewal round(s)")
    assert lines[3].split() == ["n1", "(this", "node)", "live", "1", "1", "-"]
    assert lines[4].split() == ["n2", "live", "1", "1", "4"]
    assert lines[7].split() == ["crm", "n1", "held", "7", "0.4s", "yes"]
    assert lines[8].split() == ["shop", "n2", "handing", "over", "9", "1.0s", "no"]


def test_lapidusctl_status_names_the_backends_other_nodes_stream():
    from lapidus.ctl import format_status
    rows = status(["RUNNING", "STOPPED"])
    text = format_status(rows)
    assert "streamed by other nodes: shop (n2) (lapidusctl cluster)" in text.splitlines()
