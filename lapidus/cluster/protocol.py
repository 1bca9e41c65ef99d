"""What the nodes write into the bucket, and the timing the fencing rests on.

Runs in every process of a cluster node (stdlib and orjson only).

Keys (one bucket, ``[cluster] bucket``):

* ``lease.<backend>``: ``{"node", "epoch", "handover"}``.  Held by the node that streams the
  backend; renewed (compare-and-set on the revision) every ``lease_ttl * RENEW_EVERY``.
  ``epoch`` is the revision at which the node acquired it: it only ever grows, across nodes.
* ``checkpoint.<backend>``: ``{"epoch", "node", "position"}``: the backend's checkpoint.
  A new owner first rewrites it with its own epoch (compare-and-set), so any write of the
  previous owner, which still expects the old revision, is refused.
* ``node.<name>``: ``{"node", "max_backends"}``, rewritten every renewal: the live nodes, for
  the fair share.

Time (each node judges only by its own monotonic clock; no clocks are compared):

* an owner sends a renewal at ``t``; once it has no confirmed renewal sent after ``t`` it
  begins stopping the worker at ``t + STOP_AT * lease_ttl`` and kills it (SIGKILL, process
  tree) at ``t + KILL_AT * lease_ttl``;
* another node takes a lease over only after it saw the same revision unchanged for a whole
  ``lease_ttl`` on its clock.  It saw that revision after the server stored it, which was
  after ``t``: it takes over later than ``t + lease_ttl``, ``(1 - KILL_AT) * lease_ttl`` after
  the old worker was killed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import orjson

# A renewal five times per lease: an outage of the bucket (a NATS server dies, its streams elect
# a new leader) stops no worker while it is shorter than (STOP_AT - RENEW_EVERY) * lease_ttl,
# 6 s at the default 15 s, instead of 4 s with a renewal three times per lease.
RENEW_EVERY = 1 / 5
STOP_AT = 0.6
KILL_AT = 0.8


class LeaseLost(Exception):
    """Another node holds this backend's lease now; the worker must stop at once."""


class CheckpointUnavailable(Exception):
    """NATS did not answer in time; nothing was saved (try again later)."""


def lease_key(backend: str) -> str:
    return f"lease.{backend}"


def checkpoint_key(backend: str) -> str:
    return f"checkpoint.{backend}"


def node_key(node: str) -> str:
    return f"node.{node}"


@dataclass(frozen=True)
class Lease:
    """A lease as the bucket shows it: who holds it, since which revision (``epoch``), at
    which revision now, and whether the holder is handing it over."""

    backend: str
    node: str
    epoch: int
    revision: int
    handover: bool = False

    def value(self) -> bytes:
        return orjson.dumps({"node": self.node, "epoch": self.epoch,
                             "handover": self.handover})

    @classmethod
    def parse(cls, backend: str, data: Optional[bytes], revision: int) -> Optional["Lease"]:
        """The lease in a stored value; None for anything else (a value written by hand)."""
        try:
            value = orjson.loads(data or b"")
            return cls(backend, str(value["node"]), int(value["epoch"]), revision,
                       bool(value.get("handover")))
        except (ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class Grant:
    """What the supervisor is told for one backend this node holds: the fencing epoch (the
    worker writes its checkpoints with it), when (monotonic clock, shared by the node's
    processes) the newest confirmed renewal was sent, and whether the worker may run
    (false while the lease is being handed over)."""

    epoch: int
    renewed_at: float
    run: bool = True

    def stop_at(self, lease_ttl: float) -> float:
        return self.renewed_at + STOP_AT * lease_ttl

    def kill_at(self, lease_ttl: float) -> float:
        return self.renewed_at + KILL_AT * lease_ttl


@dataclass(frozen=True)
class WorkerLease:
    """What a worker in cluster mode is started with: the cluster settings, the epoch of the
    lease the node holds for its backend, and ``stop_at``: shared memory (a
    ``multiprocessing`` RawValue of a double) where the supervisor keeps the monotonic time
    by which the worker must have stopped; the worker sends no batch past it, so even a
    worker whose supervisor froze goes quiet before another node may start."""

    cluster: Any          # lapidus.config.ClusterConfig
    epoch: int
    stop_at: Any = None


def checkpoint_value(epoch: int, node: str, position: Any) -> bytes:
    return orjson.dumps({"epoch": epoch, "node": node, "position": position})


def parse_checkpoint(data: Optional[bytes]) -> Optional[dict]:
    try:
        value = orjson.loads(data or b"")
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("epoch"), int) else None
