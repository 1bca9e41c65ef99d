"""The lease child (``lapidus:cluster``): holds this node's leases and says which backends it
may run.

Runs in its own process, forked by the supervisor in cluster mode, around one asyncio loop
with one NATS connection (the nats plugin's :class:`~lapidus.sinks.nats.connection.Connection`,
so credentials, TLS and reconnection behave as for the sink).  Two tasks share it:

* the renewer renews the leases it holds and its node record every ``lease_ttl / 5``
  (compare-and-set on the revision; a refused one means another node took the lease over),
  on its own clock: a read below that waits out a stream leader election never delays it;
* the tick, about every second,

  1. reads every backend's lease and the node records (an entry unchanged for ``lease_ttl``
     on this node's clock is expired),
  2. takes free leases up to its fair share and flags at most one for hand-over when above it
     (:mod:`.balance`), releasing a flagged lease once the supervisor reports that backend's
     worker gone (drained and checkpointed).

Both report to the supervisor: for each lease held, its epoch and the send time of its newest
confirmed renewal (:class:`~.protocol.Grant`), and a view for ``lapidusctl cluster``.

It never starts or stops a worker itself, and it never needs to: the supervisor stops a
worker once its grant is older than ``STOP_AT * lease_ttl`` whether this process is alive,
wedged or gone (:mod:`lapidus.supervisor.cluster_gate`).

SIGTERM (the supervisor stops, after its workers): go on renewing, without taking anything,
until the supervisor reports every worker gone (or its pipe closes); then release every lease
whose worker is gone, delete the node record, exit 0.  Releasing hands the backends over at
once instead of after ``lease_ttl``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Set, Tuple

import orjson

from .. import exitcodes, logs
from ..procutil import die_with_parent, set_process_name
from . import balance
from .protocol import (RENEW_EVERY, Grant, Lease, lease_key, node_key)

TICK_MAX = 1.0          # seconds between reads of the bucket, at most
RETRY_BUCKET = 2.0      # seconds between attempts to open or create the bucket
RETRY_WRITE = 0.1       # seconds between attempts of one renewal (no stream leader yet ...)
ATTEMPT_MIN = 0.5       # seconds an attempt waits for its reply, at least


@dataclass
class Held:
    """A lease this node holds: its epoch, its revision now, when (monotonic) the newest
    confirmed renewal was sent, and whether it is being handed over (since which report)."""

    epoch: int
    revision: int
    renewed_at: float
    handover_since: Optional[int] = None     # the report that first withdrew it
    # when the first write at ``revision`` not yet confirmed was sent: if one was stored but
    # its reply lost, that stored renewal was sent no earlier than this
    unconfirmed_since: Optional[float] = None


@dataclass
class Seen:
    """An entry of another node as last read, and since when (this node's clock) its
    revision has not changed."""

    revision: int
    since: float
    value: Any = None


class LeaseAgent:
    def __init__(self, cluster, backends: List[str], inbox, status, log):
        self.cluster = cluster
        self.me: str = cluster.node
        self.ttl = float(cluster.lease_ttl)
        self.backends = sorted(backends)
        self.inbox = inbox              # supervisor -> here: which workers run
        self.status = status            # here -> supervisor: grants and the view
        self.log = log
        self.held: Dict[str, Held] = {}
        self.leases: Dict[str, Seen] = {}    # backend -> its lease as last read (others')
        self.nodes: Dict[str, Seen] = {}     # node -> its record as last read
        self.running: Set[str] = set()       # workers alive, as the supervisor last said
        self.acked = 0                       # the newest report the supervisor acted on
        self.report_seq = 0
        self.last_renewal = 0.0              # when the renewals were last sent
        self.renewal_seconds: Optional[float] = None   # how long the last round took
        self.renewal_failures = 0
        self.stopping = False
        self.inbox_closed = False
        self.wake: Optional[asyncio.Event] = None
        self.writes = asyncio.Lock()         # a renewal round, or a release
        self.kv: Any = None
        self.js: Any = None
        self.connection: Any = None

    # -- life ----------------------------------------------------------------------------

    async def run(self) -> int:
        from ..sinks.nats.connection import Connection
        from ..sinks.nats.options import NatsOptions
        loop = asyncio.get_running_loop()
        wake = self.wake = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, self._request_stop)
        loop.add_reader(self.inbox.fileno(), self._read_inbox)
        options = NatsOptions.parse({**self.cluster.connection_options(),
                                     "name": f"lapidus-cluster:{self.me}"})
        self.connection = Connection(options, "cluster", self.log)
        self.connection.start()
        renewer = asyncio.ensure_future(self._renew_forever())
        try:
            while not (self.stopping and (not self.running or self.inbox_closed)):
                wake.clear()
                if renewer.done():
                    renewer.result()        # it failed: this child crashes, and is restarted
                started = time.monotonic()
                if self.kv is None:
                    await self._open_bucket()
                if self.kv is not None:
                    await self._tick()
                self._report()
                pause = max(0.05, self._tick_every() - (time.monotonic() - started))
                try:
                    await asyncio.wait_for(wake.wait(), pause)
                except asyncio.TimeoutError:
                    pass
            await _cancelled(renewer)
            await self._release_all()
        finally:
            await _cancelled(renewer)
            await self.connection.close()
        return exitcodes.CHILD_OK

    def _tick_every(self) -> float:
        return min(TICK_MAX, self.ttl * RENEW_EVERY / 2)

    def _request_stop(self) -> None:
        self.stopping = True
        if self.wake is not None:
            self.wake.set()

    async def _open_bucket(self) -> None:
        """Open the bucket, creating it (with ``replicas``) when missing; on failure log
        and try again next tick (the leases cannot be had without it)."""
        import nats.js.errors
        if not self.connection.ready:
            return
        self.js = self.connection.nc.jetstream(timeout=self._request_timeout())
        try:
            try:
                self.kv = await self.js.key_value(self.cluster.bucket)
            except nats.js.errors.BucketNotFoundError:
                self.kv = await self.js.create_key_value(
                    bucket=self.cluster.bucket, history=1, replicas=self.cluster.replicas,
                    description="Lapidus cluster leases and checkpoints")
                self.log.info("cluster bucket created", bucket=self.cluster.bucket,
                              replicas=self.cluster.replicas)
        except Exception as exc:
            self.kv = None
            self.log.error("cannot open the cluster bucket; trying again",
                           bucket=self.cluster.bucket, error=f"{type(exc).__name__}: {exc}",
                           fix="check [cluster] servers and credentials, that JetStream is "
                               "enabled, and that replicas is at most the number of NATS "
                               "servers")
            await asyncio.sleep(RETRY_BUCKET)

    def _request_timeout(self) -> float:
        # a renewal that takes longer than its interval is as good as failed
        return max(0.5, self.ttl * RENEW_EVERY)

    # -- the tick ------------------------------------------------------------------------

    async def _tick(self) -> None:
        try:
            await self._read_bucket()
        except Exception as exc:
            self.log.warning("cannot read the cluster bucket", error=f"{type(exc).__name__}: "
                                                                     f"{exc}")
            return
        await self._balance()

    async def _renew_forever(self) -> None:
        """Renew every ``lease_ttl * RENEW_EVERY`` once the bucket is open, and report the
        new grants at once.  A round holds ``writes``: a lease is not released (deleted at its
        revision) while a renewal moves that revision."""
        interval = self.ttl * RENEW_EVERY
        while True:
            wait = self.last_renewal + interval - time.monotonic()
            if self.kv is None:
                wait = self._tick_every()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            async with self.writes:
                await self._renew(time.monotonic())
            self._report()

    async def _renew(self, sent: float) -> None:
        """Renew every held lease and this node's record, concurrently."""
        self.last_renewal = sent
        names = list(self.held)
        results = await asyncio.gather(self._put_node(), *(self._renew_one(b, sent)
                                                           for b in names),
                                       return_exceptions=True)
        self.renewal_seconds = time.monotonic() - sent
        failed = [b for b, r in zip(["<node>"] + names, results) if r is not True]
        if failed:
            self.renewal_failures += 1
            self.log.warning("lease renewal failed", backends=failed,
                             seconds=round(self.renewal_seconds, 3),
                             errors=sorted({_describe(r) for r in results if r is not True}))

    async def _put_node(self) -> bool:
        value = orjson.dumps({"node": self.me, "max_backends": self.cluster.max_backends,
                              "pid": os.getpid()})
        await self._retrying(lambda: self.kv.put(node_key(self.me), value))
        return True

    async def _retrying(self, write):
        """``write()`` again while the bucket's stream has no leader to answer (an election
        after a NATS server died: "no responders" comes back at once) or a reply is late,
        until one renewal interval has passed; a compare-and-set refusal is final."""
        import nats.errors
        import nats.js.errors
        round_seconds = self._request_timeout()
        give_up = time.monotonic() + round_seconds
        while True:
            # An attempt gets a third of the round (at least ATTEMPT_MIN): a request that
            # went to a server killed meanwhile never has its reply, and the next attempt
            # goes through the server the connection moved to.
            wait = min(give_up - time.monotonic(), max(ATTEMPT_MIN, round_seconds / 3))
            try:
                return await asyncio.wait_for(write(), max(0.05, wait))
            except nats.js.errors.KeyWrongLastSequenceError:
                raise
            except (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError,
                    nats.errors.TimeoutError, asyncio.TimeoutError,
                    nats.js.errors.ServiceUnavailableError):
                if time.monotonic() + RETRY_WRITE >= give_up:
                    raise
                await asyncio.sleep(RETRY_WRITE)

    async def _renew_one(self, backend: str, sent: float) -> bool:
        """Renew one lease (a round runs under ``writes``); True once it is confirmed."""
        import nats.js.errors
        held = self.held[backend]
        lease = Lease(backend, self.me, held.epoch, held.revision,
                      held.handover_since is not None)
        if held.unconfirmed_since is None:
            held.unconfirmed_since = sent
        try:
            held.revision = await self._retrying(lambda: self.kv.update(
                lease_key(backend), lease.value(), last=held.revision))
            held.renewed_at, held.unconfirmed_since = sent, None
            return True
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        # Refused: either a renewal of ours was stored but its reply lost (a retry of this
        # round, or a write of an earlier one that failed), or another node took the lease
        # over after it expired.  Ours: adopt that revision, renewed when the first write
        # at the old revision was sent (the stored one was sent no earlier).
        current = await self._get_lease(backend)
        if current is not None and current.revision <= held.revision:
            return False        # a read from a replica behind the refusal proves nothing
        if current is not None and current.node == self.me and current.epoch == held.epoch:
            held.revision = current.revision
            held.renewed_at = max(held.renewed_at, held.unconfirmed_since)
            held.unconfirmed_since = None
            return True
        self.held.pop(backend, None)
        self.log.error("lease lost: another node holds this backend now; its worker here is "
                       "stopped", backend=backend, holder=current.node if current else None)
        return False

    async def _get_lease(self, backend: str) -> Optional[Lease]:
        import nats.js.errors
        try:
            entry = await self.kv.get(lease_key(backend))
        except nats.js.errors.KeyNotFoundError:
            return None
        return Lease.parse(backend, entry.value, entry.revision)

    async def _read_bucket(self) -> None:
        now = time.monotonic()
        leases = await asyncio.gather(*(self._get_lease(b) for b in self.backends))
        for backend, lease in zip(self.backends, leases):
            if lease is None:
                self.leases.pop(backend, None)
                continue
            self.leases[backend] = _seen(self.leases.get(backend), lease.revision, now, lease)
        info = await self.js.stream_info(f"KV_{self.cluster.bucket}",
                                         subjects_filter=f"$KV.{self.cluster.bucket}.node.*")
        names = [subject.rsplit(".", 1)[1] for subject in (info.state.subjects or {})]
        records = await asyncio.gather(*(self._get_node(n) for n in names))
        present = set()
        for name, record in zip(names, records):
            if record is None:
                continue
            revision, value = record
            present.add(name)
            self.nodes[name] = _seen(self.nodes.get(name), revision, now, value)
        for name in set(self.nodes) - present:
            del self.nodes[name]

    async def _get_node(self, name: str) -> Optional[Tuple[int, dict]]:
        import nats.js.errors
        try:
            entry = await self.kv.get(node_key(name))
        except nats.js.errors.KeyNotFoundError:
            return None
        try:
            value = orjson.loads(entry.value or b"{}")
        except ValueError:
            value = {}
        return entry.revision, value if isinstance(value, dict) else {}

    # -- balance -------------------------------------------------------------------------

    def _expired(self, seen: Seen, now: float) -> bool:
        return now - seen.since >= self.ttl

    def view(self, now: float) -> balance.View:
        live = {name: (seen.value or {}).get("max_backends") for name, seen in self.nodes.items()
                if name == self.me or not self._expired(seen, now)}
        live[self.me] = self.cluster.max_backends
        holders = {}
        handing_over = set()
        for backend, seen in self.leases.items():
            lease: Lease = seen.value
            if backend in self.held:
                holders[backend] = self.me
            elif not self._expired(seen, now):
                holders[backend] = lease.node
            if backend in self.held and self.held[backend].handover_since is not None:
                handing_over.add(backend)
            elif lease.handover and backend not in self.held:
                handing_over.add(backend)
        for backend in self.held:
            holders[backend] = self.me
        return balance.View(self.me, self.backends, live, holders, handing_over)

    async def _balance(self) -> None:
        if self.stopping:
            return          # renew what is held until the workers are gone; take nothing
        now = time.monotonic()
        view = self.view(now)
        for backend in balance.to_take(view):
            await self._acquire(backend, now)
        give = balance.to_hand_over(self.view(time.monotonic()))
        if give is not None:
            self.held[give].handover_since = self.report_seq + 1
            self.log.info("handing a backend over: its worker drains and checkpoints, then "
                          "the lease is released", backend=give)
        for backend, held in list(self.held.items()):
            if held.handover_since is not None and self.acked >= held.handover_since \
                    and backend not in self.running:
                await self._release(backend, "handed over")

    async def _acquire(self, backend: str, now: float) -> None:
        """Create the lease (none, or deleted), or take an expired one over by a
        compare-and-set on the revision seen expiring."""
        import nats.js.errors
        seen = self.leases.get(backend)
        value = Lease(backend, self.me, 0, 0).value()
        sent = time.monotonic()
        try:
            if seen is None:
                revision = await self.kv.create(lease_key(backend), value)
            else:
                revision = await self.kv.update(lease_key(backend), value, last=seen.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return      # another node was quicker, or the holder renewed after all
        except Exception as exc:
            self.log.warning("cannot acquire a lease", backend=backend, error=_describe(exc))
            return
        previous = seen.value.node if seen is not None else None
        self.held[backend] = Held(epoch=revision, revision=revision, renewed_at=sent)
        self.leases.pop(backend, None)
        self.log.info("lease acquired", backend=backend, epoch=revision,
                      taken_over_from=previous if seen is not None else None,
                      expired_after=round(now - seen.since, 2) if seen is not None else None)

    async def _release(self, backend: str, why: str) -> None:
        async with self.writes:
            held = self.held[backend]
            try:
                await self.kv.delete(lease_key(backend), last=held.revision)
            except Exception as exc:
                # the lease then expires by itself; the worker is gone already
                self.log.warning("cannot release a lease; it expires by itself",
                                 backend=backend, error=_describe(exc))
            self.held.pop(backend, None)
        self.log.info("lease released", backend=backend, reason=why)

    async def _release_all(self) -> None:
        """At stop: release what no worker runs (the supervisor stopped them first), and
        the node record."""
        if self.kv is None:
            return
        self._read_inbox()          # the supervisor's last word: every worker gone
        for backend in list(self.held):
            if backend not in self.running:
                await self._release(backend, "node stopping")
        try:
            await self.kv.delete(node_key(self.me))
        except Exception as exc:
            self.log.warning("cannot delete the node record", error=_describe(exc))

    # -- talking to the supervisor -------------------------------------------------------

    def _read_inbox(self) -> None:
        try:
            while self.inbox.poll():
                kind, fields = self.inbox.recv()
                if kind == "workers":
                    self.running = set(fields["running"])
                    self.acked = max(self.acked, int(fields["ack"]))
                    if self.stopping and not self.running and self.wake is not None:
                        self.wake.set()
        except (EOFError, OSError):
            if not self.inbox_closed:
                asyncio.get_running_loop().remove_reader(self.inbox.fileno())
            self.inbox_closed = True
            self._request_stop()      # the supervisor is gone

    def _report(self) -> None:
        self.report_seq += 1
        grants = {backend: Grant(held.epoch, held.renewed_at, held.handover_since is None)
                  for backend, held in self.held.items()}
        try:
            self.status.send(("leases", {"seq": self.report_seq, "grants": grants,
                                         "view": self.describe()}))
        except (OSError, ValueError):
            self.stopping = True

    def describe(self) -> Dict[str, Any]:
        """What ``lapidusctl cluster`` shows (JSON-able)."""
        now = time.monotonic()
        view = self.view(now)
        leases = []
        for backend in self.backends:
            if backend in self.held:
                held = self.held[backend]
                leases.append({"backend": backend, "owner": self.me, "epoch": held.epoch,
                               "revision": held.revision,
                               "age": round(now - held.renewed_at, 1),
                               "handover": held.handover_since is not None})
            elif backend in self.leases:
                seen = self.leases[backend]
                lease: Lease = seen.value
                leases.append({"backend": backend, "owner": lease.node, "epoch": lease.epoch,
                               "revision": lease.revision, "age": round(now - seen.since, 1),
                               "handover": lease.handover,
                               "expired": self._expired(seen, now)})
            else:
                leases.append({"backend": backend, "owner": None})
        nodes = [{"node": name, "live": name in view.live_nodes,
                  "backends": view.owned(name), "share": balance.share(view, name)
                  if name in view.live_nodes else 0,
                  "max_backends": (self.nodes[name].value or {}).get("max_backends")
                  if name in self.nodes else self.cluster.max_backends,
                  "age": round(now - self.nodes[name].since, 1) if name in self.nodes else 0.0}
                 for name in sorted(set(self.nodes) | {self.me})]
        return {"node": self.me, "bucket": self.cluster.bucket, "lease_ttl": self.ttl,
                "connected": bool(self.connection is not None and self.connection.ready
                                  and self.kv is not None),
                "renewal_seconds": None if self.renewal_seconds is None
                else round(self.renewal_seconds, 4),
                "renewal_failures": self.renewal_failures,
                "nodes": nodes, "leases": leases}


async def _cancelled(task: "asyncio.Future") -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _seen(previous: Optional[Seen], revision: int, now: float, value: Any) -> Seen:
    if previous is not None and previous.revision == revision:
        return replace(previous, value=value)
    return Seen(revision, now, value)


def _describe(result: Any) -> str:
    if isinstance(result, BaseException):
        return f"{type(result).__name__}: {result}" if str(result) else type(result).__name__
    return "refused"


def cluster_main(cluster, backends: List[str], log_format: str, log_level: str,
                 parent_pid: int, inbox, status) -> None:
    """Entry point of the lease child (target of multiprocessing.Process).  ``inbox`` is the
    read end of the supervisor's pipe to it, ``status`` the write end of its own."""
    die_with_parent(signal.SIGKILL, parent_pid)
    set_process_name("lapidus:cluster")
    logs.configure(log_format, log_level, process="cluster")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = logs.get_logger(node=cluster.node)
    agent = LeaseAgent(cluster, backends, inbox, status, log)
    try:
        code = asyncio.run(agent.run())
    except Exception:
        log.exception("the lease child crashed")
        code = exitcodes.CHILD_ERROR
    sys.stdout.flush()
    os._exit(code)
