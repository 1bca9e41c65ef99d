"""Snapshot runs made for one sink: how their events are told apart, and who gets them.

A backfill request may name a sink (the websocket sink asks for one per table when a client
connects with ``snapshot=1``; :class:`lapidus.workers.snapshot.requests.BackfillRequest`).
The run is then that sink's alone:

* its ``read`` events carry ``<n>@<sink>`` where other runs carry ``<n>``
  (``shop:read:7@websocket:public.items:[42]``), so their ids differ from every other run's;
* its end is one more event, of type ``snapshot`` (:func:`end_event`), which no other run has;
* the worker flags each batch sent while such a run is its current one (the ``routed`` field
  of the batch frame, :mod:`lapidus.transport`), and the dispatcher gives the events of a
  flagged batch to the sinks by :func:`split`: those of a sink's run to that sink only, the
  rest to every sink.  An unflagged batch costs nothing more.

Used by the worker (building the ids and the end event), the dispatcher (:func:`split`) and
the websocket sink (:func:`run_of`).  The event forms are in docs/events.md.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from .events import Event, Record

#: the type of the event that ends a sink's run
END = "snapshot"

# Event(...) without the keyword handling of a named tuple's constructor: every field given
_new_event = tuple.__new__


def run_label(n: int, sink: Optional[str]) -> str:
    """What stands for the run in its events' ids: ``7``, or ``7@websocket``."""
    return str(n) if sink is None else f"{n}@{sink}"


def end_event(backend: str, n: int, sink: str, schema: str, table: str, rows: int,
              position: str, ts: Optional[str]) -> Event:
    """The last event of run ``n`` made for ``sink``: its table was read to the end.  It
    travels after the run's last ``read`` event, in the same batch (worker process)."""
    return _new_event(Event, (f"{backend}:{END}:{run_label(n, sink)}", END, backend, schema,
                              table, None, {"rows": rows}, None, position, None, ts, None, None,
                              None, None, None))


def run_of(record: Record, backend: str) -> Optional[str]:
    """``"7@websocket"`` for an event of a run made for a sink, None for any other event."""
    kind = record.type
    if kind == "read":
        label = record.id[len(backend) + 6:]            # after "<backend>:read:"
        label = label[:label.find(":")]
    elif kind == END:
        label = record.id[len(backend) + len(END) + 2:]
    else:
        return None
    return label if "@" in label else None


def sink_of(label: str) -> str:
    return label.partition("@")[2]


def split(records: Sequence[Record], backend: str, names: Sequence[str]) -> List[List[Any]]:
    """Per sink (in ``names`` order) the records it gets: every record that belongs to no
    sink's run, and those of its own runs; a run of a sink not in ``names`` goes nowhere.
    Order is kept."""
    owners = []
    for record in records:
        label = run_of(record, backend)
        owners.append(None if label is None else sink_of(label))
    return [[record for record, owner in zip(records, owners) if owner is None or owner == name]
            for name in names]
