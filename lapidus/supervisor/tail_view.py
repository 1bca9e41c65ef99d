"""The supervisor's side of the status page's tail: which backends to watch, their last events,
and the masking of their values.

Runs in the supervisor process, in the arbiter loop.  The dispatcher keeps and sends the events
(:mod:`.tail_ring`); :class:`TailView` asks it for the backends that pages watch, keeps the
last ``KEEP`` of each (so a page that opens a watched backend sees them at once), and forgets a
backend as soon as no page watches it.

Masked (the default): every value inside ``pk``, ``item``, ``before``, ``update`` and ``truncated``,
and a message's ``content``, is replaced by ``MASK``; column names, the table, the id, the type,
the position and the commit time stay, so a page shows what changes without what it holds.
"""

from __future__ import annotations

import collections
from typing import Callable, Deque, Dict, Iterable, List, Optional, Tuple

import orjson

KEEP = 20
RENEW_EVERY = 2.0    # seconds between watch requests while the set is unchanged (tail_ring)
MASK = "•••"
_VALUE_MAPS = ("pk", "item", "before", "truncated")


def masked(event: dict) -> dict:
    """``event`` with its values replaced by ``MASK`` (keys and names kept)."""
    out = dict(event)
    for field in _VALUE_MAPS:
        if isinstance(out.get(field), dict):
            out[field] = {key: MASK for key in out[field]}
    update = out.get("update")
    if isinstance(update, dict):
        out["update"] = {part: ({key: MASK for key in value} if isinstance(value, dict)
                                else value) for part, value in update.items()}
    if out.get("content") is not None:
        out["content"] = MASK
    return out


class TailEvent:
    """One event of a tail, decoded once, in both forms a page may ask for."""

    __slots__ = ("serial", "plain", "hidden")

    def __init__(self, serial: int, data: bytes):
        self.serial = serial
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            event = {"undecodable": len(data)}
        self.plain = event
        self.hidden = masked(event) if isinstance(event, dict) else event

    def shown(self, values: bool) -> dict:
        return self.plain if values else self.hidden


class TailView:
    def __init__(self, ask: Callable[[tuple], bool]):
        self.ask = ask        # sends a request to the dispatcher; False when not sent
        self.recent: Dict[str, Deque[TailEvent]] = {}
        self.watched: Tuple[str, ...] = ()
        self.asked_at: Optional[float] = None

    def want(self, backends: Iterable[str], now: float) -> None:
        """The backends pages show now: tell the dispatcher when that changes, and renew it
        every ``RENEW_EVERY`` seconds while any is watched."""
        wanted = tuple(sorted(set(backends)))
        for name in [n for n in self.recent if n not in wanted]:
            del self.recent[name]
        changed = wanted != self.watched
        due = self.asked_at is None or now - self.asked_at >= RENEW_EVERY
        if changed or (wanted and due):
            if self.ask(("watch", list(wanted))):
                self.watched, self.asked_at = wanted, now

    def dispatcher_started(self) -> None:
        """A new dispatcher knows no watch: tell it the current one at once, before its
        workers reconnect and deliver (else at the next turn of the loop)."""
        if not (self.watched and self.ask(("watch", list(self.watched)))):
            self.asked_at = None

    def arrived(self, backend: str, events: List[Tuple[int, bytes]]) -> List[TailEvent]:
        """Events the dispatcher sent for ``backend``: kept (while watched) and returned."""
        if backend not in self.watched:
            return []
        kept = self.recent.setdefault(backend, collections.deque(maxlen=KEEP))
        last = kept[-1].serial if kept else 0
        if events and events[0][0] <= last:
            kept.clear()     # numbered anew (a new dispatcher or pipeline)
        new = [TailEvent(serial, data) for serial, data in events]
        kept.extend(new)
        return new

    def last(self, backend: str) -> List[TailEvent]:
        return list(self.recent.get(backend, ()))
