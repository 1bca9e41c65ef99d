"""The sink (plugin) interface.

Sinks run in the dispatcher process, inside its asyncio loop.  They know only
:class:`lapidus.events.Record` and this interface.  Built-in and third-party sinks are found the
same way: through the ``lapidus.plugins`` entry-point group (see :mod:`lapidus.sinks.registry`).
"""

from __future__ import annotations

import abc
import json
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

from ..events import Record


class Delivery(list):
    """The records one :meth:`Sink.send` is given: a list, and where it ends.

    ``at_boundary`` is True when every record of it belongs to a source transaction whose end
    the worker has read (its checkpoint then stands between transactions): no record that
    comes later belongs to a transaction of this delivery.  False says nothing either way
    (the last transaction may go on in the next delivery).  One flag per batch, set by the
    source (:class:`lapidus.workers.base.Batch`) and carried by the worker's frame; a merged
    delivery has its last batch's.  Sinks that apply whole transactions read it
    (:attr:`Sink.wants_transaction_ends`); the others need not know it exists.
    """

    __slots__ = ("at_boundary", "routed")

    def __init__(self, records: Iterable[Record] = (), at_boundary: bool = False,
                 routed: bool = False):
        super().__init__(records)
        self.at_boundary = at_boundary
        # it may hold events of a run made for one sink (lapidus.sink_runs): the dispatcher
        # gives those to that sink only; the sink that asked for the run tells them apart
        self.routed = routed


class SinkError(Exception):
    """A sink could not deliver; the dispatcher retries the same batch with backoff."""


class UndeliverableError(SinkError):
    """One record that the destination refuses for good (too large, not permitted): retrying
    the batch cannot help.

    ``index`` is the record's place in the batch given to :meth:`Sink.send`; the records before
    it may or may not have been delivered (a resend repeats them with their ids).  ``reason``
    says why, ``fix`` what the operator can change.  The dispatcher applies the backend's
    ``on_undeliverable`` policy: hold the backend (retrying slowly, the record shown in
    ``lapidusctl status``) or move the record to the dead letters and go on.
    """

    def __init__(self, index: int, reason: str, fix: str = ""):
        super().__init__(reason + (f"; fix: {fix}" if fix else ""))
        self.index = index
        self.reason = reason
        self.fix = fix


class OutputClosed(Exception):
    """The sink's consumer went away for good (stdout closed by ``head``): stop cleanly."""


class Sink(abc.ABC):
    """Delivers batches of records for one backend (or for all, when ``shared`` is true).

    Contract: :meth:`send` is given a :class:`Delivery` of records and returns only once every
    record of it is confirmed by the destination (written and flushed, acknowledged by
    JetStream ...).  Returning is the confirmation that lets the worker advance its
    checkpoint; raising means nothing in the batch counts as delivered and the same batch will
    be sent again.
    """

    #: one instance serves every backend (stdout) instead of one per backend (nats); with
    #: different options (a backend's own) one instance per :meth:`share_key`
    shared: bool = False

    #: the dispatcher may hand this sink several queued batches as one delivery when they
    #: wait behind it (worth it where each delivery ends with a wait, as for NATS acks).
    #: Off by default: a delivery confirms all of its records or none, and a sink that can
    #: stall partway (a pipe to a slow reader) confirms more, earlier, batch by batch.
    merge_batches: bool = False

    #: the sink reads :attr:`Delivery.at_boundary` (it applies whole source transactions):
    #: when a transaction's end comes after its last record (the batch ended right before
    #: the COMMIT, or the transaction's last rows were filtered out), the dispatcher gives
    #: it the last record it confirmed again (a replay, same id) in a delivery at the boundary.
    #: Other sinks never get that replay.
    wants_transaction_ends: bool = False

    #: the sink asks the worker for snapshot runs of its own (the websocket sink's
    #: ``snapshot=1``, :mod:`lapidus.sink_runs`): the dispatcher sets
    #: :attr:`snapshot_requests` before :meth:`start`, an object with ``request(table) ->
    #: n``, ``cancel(numbers)``, ``settled(numbers) -> {n: reason or None}``,
    #: ``not_started(numbers) -> [n, ...]`` and ``unavailable``
    #: (None, or why runs cannot be asked for); see
    #: :class:`lapidus.supervisor.sink_snapshots.SnapshotRequests`.
    asks_for_snapshots: bool = False
    snapshot_requests: Any = None

    @classmethod
    def share_key(cls, options: Mapping[str, Any]) -> str:
        """For a ``shared`` sink: backends whose options give the same key share one
        instance.  By default the options themselves; a sink whose instances must not
        overlap (two writers on one file descriptor) keys by that resource instead."""
        return json.dumps(options, sort_keys=True, default=str)

    def __init__(self, options: Mapping[str, Any], backend: str):
        self.options = dict(options)
        self.backend = backend

    @classmethod
    def validate(cls, options: Mapping[str, Any]) -> list:
        """Problems with ``options`` as ``(key, message)`` pairs; empty when valid."""
        return []

    async def start(self) -> None:
        """Connect.  Called once before the first batch."""

    @abc.abstractmethod
    async def send(self, records: Sequence[Record]) -> None:
        """Deliver ``records`` in order and return once they are confirmed."""

    async def close(self) -> None:
        """Flush and disconnect."""

    def health(self) -> Optional[Dict[str, Any]]:
        """The state of the sink's connection, for ``lapidusctl status`` and ``/metrics``:
        ``{"connected": bool, "down_seconds": float or None, ...}``, or None for a sink
        without one (stdout).  Called by the dispatcher once a second; must be cheap."""
        return None
