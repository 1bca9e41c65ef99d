"""The ``nats_cluster`` fixture: a private three-server NATS cluster on loopback
(:class:`bench.chaos.nats_cluster.NatsCluster`), stopped after the test."""

from __future__ import annotations

import pytest

from bench.chaos.nats_cluster import NatsCluster


@pytest.fixture
def nats_cluster(tmp_path):
    cluster = NatsCluster(tmp_path / "nats-cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
