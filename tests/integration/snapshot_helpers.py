"""What the snapshot tests of every source (PostgreSQL, MySQL, MongoDB) share: the consumer's fold, a concurrent writer,
waiting on the real Lapidus with its log at a failure, and the snapshot's status row.

The folding guarantee (docs/snapshots.md): a consumer that applies the events in arrival
order (read/insert/update -> the row, delete -> gone, truncate -> empty) ends with exactly
the table's content, whatever is written meanwhile and whatever process is killed.
"""

from __future__ import annotations

import random
import threading
from typing import Callable

import pytest

from tests.conftest import wait_until
from tests.integration.conftest import backend_status


def fold(events, table="t", key: Callable[[dict], object] = lambda pk: pk["id"]):
    """The consumer's copy of ``table``: key(pk) -> item (events as dicts, from stdout).
    read/insert/update/replace set the item (an update whose item is null, its document
    deleted before MongoDB's lookup, is skipped: the delete follows it), delete removes,
    truncate empties."""
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


class ConcurrentWriter(threading.Thread):
    """Random inserts, updates and deletes until stopped, on a connection of its own:
    subclasses give :meth:`connect` and :meth:`write` (one statement of the kind drawn)."""

    def __init__(self, top: int, seed: int = 7):
        super().__init__(daemon=True)
        self.top, self.random = top, random.Random(seed)
        self.halt = threading.Event()
        self.done = 0
        self.error = None

    def connect(self):
        raise NotImplementedError

    def write(self, cur, kind: str, i: int) -> None:
        """``kind`` is ``update``, ``delete`` or ``insert`` (of ``i + top``)."""
        raise NotImplementedError

    def run(self):
        try:
            conn = self.connect()
        except Exception as exc:   # reported by stop(), not lost in the thread
            self.error = exc
            return
        try:
            cur = conn.cursor()
            while not self.halt.is_set():
                i = self.random.randint(1, self.top)
                draw = self.random.random()
                kind = "update" if draw < 0.5 else "delete" if draw < 0.75 else "insert"
                self.write(cur, kind, i)
                self.done += 1
        except Exception as exc:
            self.error = exc
        finally:
            conn.close()

    def stop(self) -> None:
        """Halt and join; the writer's own failure, if any, fails the test."""
        self.halt.set()
        self.join(10)
        assert self.error is None, self.error


def until(proc, predicate, timeout, what, backend="pg", interval=0.05):
    """wait_until, failing with the backend's status and the Lapidus log at the failure."""
    try:
        return wait_until(predicate, timeout, interval=interval, message=what)
    except pytest.fail.Exception:
        pytest.fail(f"timed out after {timeout}s waiting for {what}; status: "
                    f"{backend_status(proc.config_path, backend)}\nlog:\n{proc.log()[-4000:]}")


def snapshot_state(proc, backend="pg"):
    row = backend_status(proc.config_path, backend)
    return (row.get("snapshot") or {}) if row else {}
