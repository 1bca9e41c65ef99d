"""The ``read`` event of a snapshot and its deterministic id (docs/events.md).

Runs in the worker process.  The id is ``<backend>:read:<n>:<schema>.<table>:<pk text>``: ``n``
numbers the snapshot (0 for the initial one, so that a later backfill's events are not taken
for duplicates by JetStream's dedup window), ``pk text`` the key values as compact JSON in key
order.  A chunk read again after a crash yields the same ids.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ...events import Event


def pk_text(values: Sequence[Any]) -> str:
    """The key values as compact JSON (``[2]``, ``[1,"x"]``): unique per key, and the same
    text for the same key whatever process computes it."""
    return json.dumps(list(values), separators=(",", ":"), ensure_ascii=False, default=str)


def read_event(backend: str, n: int, schema: str, table: str, pk: Mapping[str, Any],
               item: Mapping[str, Any], position: str, ts: str) -> Event:
    """One snapshot row: full ``item``, ``pk``, ``before = null``, no transaction."""
    return Event(id=f"{backend}:read:{n}:{schema}.{table}:{pk_text(list(pk.values()))}",
                 type="read", backend=backend, schema=schema, table=table, pk=dict(pk),
                 item=item, before=None, position=position, txid=None, ts=ts)
