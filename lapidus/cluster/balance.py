"""Which backends this node should take, and which it should hand over: the fair share.

Runs in the lease child (:mod:`.agent`), once per tick, on what the bucket showed.  Plain
functions, no I/O.  Every node runs the same backends section and the same rules, so the
nodes agree without talking to each other; when two try for one lease, the compare-and-set
lets exactly one win.

* A node's share is ``ceil(backends / live nodes)``, capped by its ``max_backends``.
* A node below its share takes free leases (none, deleted, or expired), those for which it
  ranks first (rendezvous hashing over the live nodes) before the others, so nodes that
  start together seldom contend.
* Free backends that no node below its share can take (the others are capped) go to a node
  with room under its own cap: no backend is left unstreamed while some node could stream it.
* A node above its share hands over one backend at a time, and only while another live node
  is below its share (someone will take it): the owner drains, checkpoints, releases.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Set


@dataclass(frozen=True)
class View:
    me: str
    backends: Sequence[str]                   # every enabled backend (the same on each node)
    live_nodes: Mapping[str, Optional[int]]   # node -> its max_backends; includes me
    holders: Mapping[str, str]                # backend -> node of its live (unexpired) lease
    handing_over: Set[str] = field(default_factory=set)   # leases flagged for hand-over

    def owned(self, node: str) -> int:
        return sum(1 for holder in self.holders.values() if holder == node)

    def free(self) -> List[str]:
        return [b for b in self.backends if b not in self.holders]


def share(view: View, node: str) -> int:
    """How many backends ``node`` should stream."""
    fair = math.ceil(len(view.backends) / max(1, len(view.live_nodes)))
    cap = view.live_nodes.get(node)
    return fair if cap is None else min(fair, cap)


def rank(backend: str, node: str) -> int:
    """Rendezvous score: the live node with the highest one is the backend's first choice."""
    digest = hashlib.blake2b(f"{backend}/{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def first_choice(view: View, backend: str) -> str:
    return max(view.live_nodes, key=lambda node: (rank(backend, node), node))


def to_take(view: View) -> List[str]:
    """The free backends this node should try to acquire now, best first."""
    free = view.free()
    if not free:
        return []
    room = share(view, view.me) - view.owned(view.me)
    if room <= 0:
        others = sum(max(0, share(view, n) - view.owned(n)) for n in view.live_nodes
                     if n != view.me)
        cap = view.live_nodes.get(view.me)
        cap_room = len(view.backends) if cap is None else cap - view.owned(view.me)
        room = min(cap_room, len(free) - others)
    if room <= 0:
        return []
    free.sort(key=lambda b: (first_choice(view, b) != view.me, b))
    return free[:room]


def to_hand_over(view: View) -> Optional[str]:
    """One backend this node should hand over now, or None."""
    mine = sorted(b for b, node in view.holders.items() if node == view.me)
    if any(b in view.handing_over for b in mine):
        return None          # one hand-over at a time
    if len(mine) <= share(view, view.me):
        return None
    takers = [n for n in view.live_nodes
              if n != view.me and view.owned(n) < share(view, n)]
    if not takers:
        return None
    # the backend whose first choice is a taker, else any: the last, so the choice is stable
    preferred = [b for b in mine if first_choice(view, b) in takers]
    return (preferred or mine)[-1]


def counts(view: View) -> Dict[str, int]:
    return {node: view.owned(node) for node in view.live_nodes}
