"""Cluster mode: several Lapidus nodes share the backends through a NATS JetStream KV bucket.

docs/cluster.md is the user's side (the protocol, the fencing argument, failure modes).  The
code, by process:

* :mod:`.protocol` (every process): key names, what a lease and a checkpoint hold, and the
  fractions of ``lease_ttl`` the fencing rests on.
* :mod:`.balance` (the lease child): which backends this node should take or hand over;
  plain functions of what the bucket shows.
* :mod:`.agent` (the ``lapidus:cluster`` child, asyncio + nats-py): holds and renews this
  node's leases and tells the supervisor which backends it may run, until when.
* :mod:`.checkpoints` (a worker): the backend's checkpoint in the bucket, every write fenced
  by a compare-and-set, so a stale owner cannot overwrite its successor's position.
* :mod:`lapidus.supervisor.cluster_gate` (the supervisor): starts and stops workers on the
  lease child's word and stops them by itself when the word runs out.
"""
