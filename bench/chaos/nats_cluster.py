"""A private three-server NATS cluster on loopback (cluster-mode tests, bench/failover.py).

Each server gets free client and route ports, routes to the other two and its own JetStream
store under the given folder.  :meth:`NatsCluster.kill` takes one server down (SIGKILL: a
crash), :meth:`NatsCluster.start` brings it, or all, up (:meth:`NatsCluster.ensure`: those that
are down); :meth:`NatsCluster.replicas_current` tells when every replica of some streams caught
up again; :meth:`NatsCluster.stop` stops every one by its pid.  Nothing here touches the shared
nats-server on 4222.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence

import nats

from .servers import NATS_SERVER, free_ports, jetstream_ready, port_open
from .waiting import wait_for


class NatsCluster:
    def __init__(self, folder: Path, size: int = 3):
        self.folder = folder
        # one call for all: a server whose client and route ports were the same port could
        # not start ("address already in use")
        ports = free_ports(2 * size)
        self.client_ports, self.route_ports = ports[:size], ports[size:]
        self.procs: List[Optional[subprocess.Popen]] = [None] * size

    @property
    def urls(self) -> List[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.client_ports]

    def _config(self, index: int) -> Path:
        routes = ", ".join(f'"nats://127.0.0.1:{port}"' for i, port in
                           enumerate(self.route_ports) if i != index)
        path = self.folder / f"n{index}.conf"
        store = self.folder / f"js{index}"
        path.write_text(f"""
server_name: n{index}
listen: 127.0.0.1:{self.client_ports[index]}
jetstream {{ store_dir: "{store}" }}
cluster {{
  name: lapidus-test
  # clients keep to the servers they were given (a test's proxy is not bypassed)
  no_advertise: true
  listen: 127.0.0.1:{self.route_ports[index]}
  routes: [{routes}]
}}
""")
        return path

    def start(self, index: Optional[int] = None) -> None:
        """Start every server (or one), and wait until JetStream answers through each."""
        self.folder.mkdir(parents=True, exist_ok=True)
        indexes = range(len(self.procs)) if index is None else [index]
        for i in indexes:
            log = open(self.folder / f"n{i}.log", "ab")
            self.procs[i] = subprocess.Popen([NATS_SERVER, "-c", str(self._config(i))],
                                             stdout=log, stderr=log)
            log.close()
        for i in indexes:
            wait_for(lambda i=i: port_open(self.client_ports[i]), 30, f"nats-server n{i} listening")
        wait_for(self.jetstream_ready, 60, "the NATS cluster's JetStream ready")

    def jetstream_ready(self) -> bool:
        return jetstream_ready(self.live_urls())

    def live_urls(self) -> List[str]:
        return [url for url, proc in zip(self.urls, self.procs)
                if proc is not None and proc.poll() is None]

    def ensure(self) -> None:
        """Start every server that is not running."""
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is not None:
                self.start(i)

    def replicas_current(self, streams: Sequence[str]) -> bool:
        """Each of ``streams`` (a KV bucket is the stream ``KV_<bucket>``) has a leader and
        every other server as a replica that is current and online."""
        async def check() -> bool:
            nc = await nats.connect(self.live_urls(), connect_timeout=1,
                                    allow_reconnect=False)
            try:
                js = nc.jetstream(timeout=2)
                for name in streams:
                    cluster = (await js.stream_info(name)).cluster
                    if cluster is None or not cluster.leader:
                        return False
                    replicas = cluster.replicas or []
                    if len(replicas) != len(self.procs) - 1 \
                            or not all(r.current and not r.offline for r in replicas):
                        return False
                return True
            finally:
                await nc.close()
        return asyncio.run(check())

    def leader_of(self, stream: str) -> int:
        """The index of the server that leads ``stream`` now (a KV bucket is the stream
        ``KV_<bucket>``)."""
        async def ask() -> str:
            nc = await nats.connect(self.live_urls(), connect_timeout=1,
                                    allow_reconnect=False)
            try:
                cluster = (await nc.jetstream(timeout=2).stream_info(stream)).cluster
                return cluster.leader if cluster is not None else ""
            finally:
                await nc.close()
        leader = asyncio.run(ask())
        names = [f"n{index}" for index in range(len(self.procs))]
        assert leader in names, f"{stream} has no leader ({leader!r})"
        return names.index(leader)

    def kill(self, index: int) -> None:
        """SIGKILL one server (a crash: nothing flushed, no lame-duck mode)."""
        proc = self.procs[index]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self.procs[index] = None

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            self.procs[i] = None
