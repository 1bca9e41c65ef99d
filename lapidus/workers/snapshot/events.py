"""The ``read`` event of a snapshot and its deterministic id (docs/events.md).

Runs in the worker process.  The id is ``<backend>:read:<n>:<schema>.<table>:<pk text>``: ``n``
numbers the snapshot (0 for the initial one, so that a later backfill's events are not taken
for duplicates by JetStream's dedup window), ``pk text`` the key values as compact JSON in key
order.  A chunk read again after a crash yields the same ids.

The key text is computed once per row (the window keys the held rows by it, and the id reuses
it: :meth:`..window.ChunkWindow.remaining_keyed`, :func:`read_events`), so :func:`pk_text` and
:func:`read_events` are on the per-row path of a snapshot.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import orjson

from ...events import Event

# Event(...) without the keyword handling of a named tuple's constructor: every field given
_new_event = tuple.__new__


def _stdlib_text(values: Sequence[Any]) -> str:
    return json.dumps(list(values), separators=(",", ":"), ensure_ascii=False, default=str)


def pk_text(values: Sequence[Any]) -> str:
    """The key values as compact JSON (``[2]``, ``[1,"x"]``): unique per key, and the same
    text for the same key whatever process computes it.

    The definition is the stdlib's ``json.dumps(values, separators=(",", ":"),
    ensure_ascii=False, default=str)``; the ids of events already delivered depend on it.
    Keys made of ints and strings only (nearly all) take orjson, whose output is the same
    text for those (every code point; ints of the 64-bit range, others fall back);
    anything else (bool, float, arrays, jsonb) goes through the stdlib.
    """
    if len(values) == 1:
        value = values[0]
        kind = value.__class__
        if kind is int:
            return f"[{value}]"         # int.__repr__, exactly what json writes
        if kind is str:
            return orjson.dumps([value]).decode()
    for value in values:
        kind = value.__class__
        if kind is not int and kind is not str:
            return _stdlib_text(values)
    try:
        return orjson.dumps(list(values)).decode()
    except TypeError:                   # an int beyond 64 bits: orjson refuses it
        return _stdlib_text(values)


def id_head(backend: str, n: Union[int, str], schema: str, table: str) -> str:
    """What the ids of run ``n``'s read events of ``schema.table`` start with; the key text
    follows (``shop:read:0:public.items:`` + ``[2]``)."""
    return f"{backend}:read:{n}:{schema}.{table}:"


def read_event(backend: str, n: int, schema: str, table: str, pk: Mapping[str, Any],
               item: Mapping[str, Any], position: str, ts: str) -> Event:
    """One snapshot row: full ``item``, ``pk``, ``before = null``, no transaction."""
    return Event(id=id_head(backend, n, schema, table) + pk_text(list(pk.values())),
                 type="read", backend=backend, schema=schema, table=table, pk=dict(pk),
                 item=item, before=None, position=position, txid=None, ts=ts)


def read_events(backend: str, n: Union[int, str], schema: str, table: str,
                rows: Iterable[Tuple[str, Tuple[dict, dict]]], position: str,
                ts: Optional[str]) -> List[Event]:
    """:func:`read_event` for a chunk's rows ``(key text, (pk, item))``, in their order.
    ``n`` is the run's number, or its label for a run made for one sink (``"7@websocket"``,
    :func:`lapidus.sink_runs.run_label`).

    The same events, built from plain tuples: the per-row cost of a chunk's emission.  The
    ``pk`` and ``item`` dicts are the held ones, not copies (nothing changes them after the
    window emits them).
    """
    head = id_head(backend, n, schema, table)
    return [_new_event(Event, (head + text, "read", backend, schema, table, pk, item, None,
                               position, None, ts, None, None, None, None, None))
            for text, (pk, item) in rows]
