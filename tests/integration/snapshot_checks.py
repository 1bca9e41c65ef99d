"""What the snapshot tests of every source share (test_pg_snapshot.py, test_mongo_snapshot.py).

The folding guarantee (docs/snapshots.md): a consumer that applies the events in arrival
order ends with exactly the table's content.  :func:`fold` is that consumer; :func:`until`
and :func:`snapshot_state` watch a Lapidus started by ``lapidus_factory``.
"""

from __future__ import annotations

from typing import Callable

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import backend_status


def fold(events, table: str, key: Callable[[dict], object]):
    """The consumer's copy of ``table``: key(pk) -> item.  read/insert/update/replace set
    the item (an update whose item is null, its document deleted before the lookup, is
    skipped: the delete follows it), delete removes, truncate empties."""
    copy = {}
    for e in events:
        if e["table"] != table:
            continue
        if e["type"] in ("read", "insert", "update", "replace"):
            if e["item"] is not None:
                copy[key(e["pk"])] = e["item"]
        elif e["type"] == "delete":
            copy.pop(key(e["pk"]), None)
        elif e["type"] == "truncate":
            copy.clear()
    return copy


def until(proc, predicate, timeout, what, backend, interval=0.05):
    """wait_until, failing with the backend's status and the Lapidus log at the failure."""
    try:
        return wait_until(predicate, timeout, interval=interval, message=what)
    except pytest.fail.Exception:
        pytest.fail(f"timed out after {timeout}s waiting for {what}; status: "
                    f"{backend_status(proc.config_path, backend)}\nlog:\n{proc.log()[-4000:]}")


def snapshot_state(proc, backend) -> dict:
    """The ``snapshot`` field of the backend's ``lapidusctl status --json`` row ({} if none)."""
    row = backend_status(proc.config_path, backend)
    return (row.get("snapshot") or {}) if row else {}
