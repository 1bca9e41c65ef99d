"""A backend's checkpoint in the cluster bucket, fenced by the lease's epoch.

Runs in a worker process in cluster mode, in place of :class:`lapidus.checkpoint.CheckpointStore`
(same ``load`` / ``save``).  The worker loop is synchronous, nats-py is asyncio: the store runs
its own event loop in a thread with one NATS connection and waits for each call, bounded.

Fencing: the worker is started with its lease's epoch.  :meth:`load` reads
``checkpoint.<backend>`` and rewrites it with that epoch (compare-and-set on the revision it
read): from then on a write of any earlier owner, which still expects the older revision, is
refused by the server.  An entry that already carries a *newer* epoch means another node holds
the lease since: :class:`LeaseLost`.  Every :meth:`save` is a compare-and-set on the revision of
this worker's own previous write; a refusal is :class:`LeaseLost` too, unless the entry shows
exactly this worker's own write (the server stored it, the reply was lost).

A save that cannot reach NATS raises :class:`CheckpointUnavailable` (at once while the
connection is down; only the first connection is waited for, at most ``CALL_TIMEOUT``): the
worker keeps streaming and saves again later (its lease, renewed over another connection,
decides whether it may go on; the supervisor stops it when not).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Optional

import orjson

from .protocol import (CheckpointUnavailable, LeaseLost, WorkerLease, checkpoint_key,
                       checkpoint_value, parse_checkpoint)

CALL_TIMEOUT = 5.0          # seconds a single load or save may take
LOAD_RETRY = 0.5

__all__ = ["CheckpointUnavailable", "FencedCheckpointStore", "LeaseLost", "SharedMarker",
           "WorkerLease"]


class FencedCheckpointStore:
    def __init__(self, lease: WorkerLease, backend: str, log, stopping=lambda: False):
        self.lease = lease
        self.backend = backend
        self.key = checkpoint_key(backend)
        self.log = log
        self.stopping = stopping          # the worker was told to stop: give up waiting
        self.revision: Optional[int] = None
        self._last_value: Optional[bytes] = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="cluster-checkpoints")
        self._thread.start()
        self._kv: Any = None
        self._connection: Any = None

    # -- the worker's calls ----------------------------------------------------------------

    def load(self) -> Optional[Any]:
        """The checkpoint, after claiming it for this epoch; waits (in steps, checking for a
        stop) while NATS cannot be reached."""
        while True:
            try:
                return self._call(self._claim())
            except CheckpointUnavailable as exc:
                if self.stopping():
                    raise
                self.log.warning("cannot read the checkpoint from the cluster bucket yet; "
                                 "waiting", error=str(exc))
                time.sleep(LOAD_RETRY)

    def save(self, position: Any) -> None:
        self._call(self._write(position))

    def marker(self, name: str) -> "SharedMarker":
        """Another value of this backend in the bucket (``<name>.<backend>``), over the same
        connection, for what a source keeps beside its checkpoint (MongoDB's first-start
        position)."""
        return SharedMarker(self, f"{name}.{self.backend}")

    def close(self) -> None:
        if self._connection is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._connection.close(),
                                                 self._loop).result(CALL_TIMEOUT)
            except Exception:
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT)

    def _call(self, coro) -> Any:
        """Run ``coro`` in the store's loop; anything but a refusal (LeaseLost) that goes
        wrong on the way (no answer, no stream leader during an election, a dropped
        connection) is CheckpointUnavailable: nothing was saved, or nothing certain."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(CALL_TIMEOUT)
        except LeaseLost:
            raise
        except (TimeoutError, asyncio.TimeoutError):
            future.cancel()
            raise CheckpointUnavailable(f"no answer from NATS within {CALL_TIMEOUT:g}s") from None
        except Exception as exc:
            raise CheckpointUnavailable(f"{type(exc).__name__}: {exc}") from None

    # -- in the store's own loop -----------------------------------------------------------

    async def _bucket(self):
        from ..sinks.nats.connection import Connection
        from ..sinks.nats.options import NatsOptions
        if self._kv is not None:
            if not self._connection.ready:
                # fail at once while reconnecting: a save must not hold the worker's loop up
                # (the lease, renewed elsewhere, decides whether it may go on)
                raise CheckpointUnavailable("not connected to NATS (reconnecting)")
            return self._kv
        if self._connection is None:
            cluster = self.lease.cluster
            options = NatsOptions.parse({**cluster.connection_options(),
                                         "name": f"lapidus-checkpoints:{cluster.node}:"
                                                 f"{self.backend}"})
            self._connection = Connection(options, self.backend, self.log)
            self._connection.start()
        await asyncio.wait_for(self._connection.wait_ready(), CALL_TIMEOUT)
        js = self._connection.nc.jetstream(timeout=CALL_TIMEOUT)
        self._kv = await js.key_value(self.lease.cluster.bucket)
        return self._kv

    async def _get(self, key: str) -> Optional[Any]:
        import nats.js.errors
        kv = await self._bucket()
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return orjson.loads(entry.value)["position"] if entry.value else None

    async def _put(self, key: str, position: Any) -> None:
        kv = await self._bucket()
        await kv.put(key, orjson.dumps({"position": position}))

    async def _delete(self, key: str) -> None:
        kv = await self._bucket()
        await kv.delete(key)

    async def _claim(self) -> Optional[Any]:
        import nats.js.errors
        kv = await self._bucket()
        epoch, node = self.lease.epoch, self.lease.cluster.node
        try:
            entry = await kv.get(self.key)
        except nats.js.errors.KeyNotFoundError:
            entry = None
        stored = parse_checkpoint(entry.value) if entry is not None else None
        if stored is not None and stored["epoch"] > epoch:
            raise LeaseLost(f"the checkpoint was claimed by node {stored.get('node')} with "
                            f"a newer lease (epoch {stored['epoch']} > {epoch})")
        position = stored.get("position") if stored is not None else None
        value = checkpoint_value(epoch, node, position)
        try:
            if entry is None:
                self.revision = await kv.create(self.key, value)
            else:
                self.revision = await kv.update(self.key, value, last=entry.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise LeaseLost("the checkpoint changed while this node claimed it (another node "
                            "holds the lease)") from None
        self._last_value = value
        if stored is not None and stored.get("node") != node:
            self.log.info("resuming from the checkpoint of another node",
                          previous_node=stored.get("node"), previous_epoch=stored["epoch"],
                          epoch=epoch)
        return position

    async def _write(self, position: Any) -> None:
        import nats.js.errors
        kv = await self._bucket()
        value = checkpoint_value(self.lease.epoch, self.lease.cluster.node, position)
        try:
            self.revision = await kv.update(self.key, value, last=self.revision)
            self._last_value = value
            return
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        entry = await kv.get(self.key)
        if entry.value == self._last_value or entry.value == value:
            # our own earlier write, stored although its reply was lost: adopt and retry
            self.revision = entry.revision
            self.revision = await kv.update(self.key, value, last=self.revision)
            self._last_value = value
            return
        stored = parse_checkpoint(entry.value) or {}
        raise LeaseLost(f"the checkpoint was written by node {stored.get('node')} (epoch "
                        f"{stored.get('epoch')}); this node's lease (epoch {self.lease.epoch}) "
                        f"is gone")


class SharedMarker:
    """A value beside the checkpoint, in the bucket: ``load`` / ``save`` / ``clear`` like a
    :class:`lapidus.checkpoint.CheckpointStore` (``path`` names the key, for log lines).  Not
    fenced by itself: a source reads it only while the fenced checkpoint is still empty, and
    only after its worker claimed that checkpoint for its epoch."""

    def __init__(self, store: FencedCheckpointStore, key: str):
        self.store = store
        self.key = key
        self.path = f"{store.lease.cluster.bucket}/{key}"

    def load(self) -> Optional[Any]:
        return self._call(self.store._get(self.key))

    def save(self, position: Any) -> None:
        self._call(self.store._put(self.key, position))

    def clear(self) -> None:
        self._call(self.store._delete(self.key))

    def _call(self, coro) -> Any:
        """A source calls this inside ``open`` and ``commit``: no answer from NATS is a
        transient backend error there (the worker waits and opens the source again)."""
        from ..workers.base import BackendError
        try:
            return self.store._call(coro)
        except CheckpointUnavailable as exc:
            raise BackendError(f"the cluster bucket did not answer ({exc}); trying again",
                               fatal=False) from None
