"""Binlog positions: the GTID state of complete transactions and the checkpoint format.

Runs in the mysql worker process; pure (no I/O).

The checkpoint (the JSON value the worker persists once the events before it are delivered)::

    {"v": 1, "flavor": "mariadb",
     "gtid": "0-1-122",                    # every transaction up to here is delivered
     "file": "mariadb-bin.000003", "pos": 4567,   # binlog coordinates of that same point
     "tx": "0-1-123", "index": 56,         # partly delivered transaction, last delivered index
     "scope": "5c1e0f2a9b3d"}              # fingerprint of database/include/exclude

* ``gtid`` is MariaDB's GTID position (one ``domain-server-seq`` per replication domain,
  comma separated) or, on MySQL with gtid_mode=ON, the executed GTID set
  (``uuid:1-122``).  It is ``null`` on a MySQL server without GTIDs: ``file``/``pos`` then
  are the resume point.
* ``tx``/``index`` are present only in the middle of a transaction: the transaction's id (its
  GTID, or ``file:pos`` of its start without GTIDs) and the index of the last delivered change
  inside it.  Resuming streams from ``gtid`` (so the partial transaction comes again, whole:
  many rows share one binlog position, which is why a position alone cannot say where to
  continue) and drops that transaction's changes up to ``index``.
* ``scope``: indexes count only streamed changes, so they mean the same thing only under the
  same database/include/exclude settings; under different settings the partial transaction
  is delivered again whole (duplicates, never a loss).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from pymysqlreplication.gtid import Gtid, GtidSet

MARIADB = "mariadb"
MYSQL = "mysql"

_MARIADB_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")


class CheckpointError(ValueError):
    """A stored checkpoint that cannot be used (wrong shape, other flavor)."""


def parse_mariadb_gtid(text: str) -> Tuple[int, int, int]:
    """``"0-1-122"`` -> ``(0, 1, 122)`` (domain, server id, sequence number)."""
    match = _MARIADB_GTID.match(text.strip())
    if not match:
        raise ValueError(f"not a MariaDB GTID: {text!r} (expected domain-server-sequence)")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


class MariadbGtidState:
    """MariaDB GTID position: the last complete transaction per replication domain."""

    def __init__(self, text: str = ""):
        self._domains: Dict[int, Tuple[int, int]] = {}
        for part in (text or "").split(","):
            if part.strip():
                domain, server, seq = parse_mariadb_gtid(part)
                self._domains[domain] = (server, seq)

    def advance(self, gtid: str) -> None:
        domain, server, seq = parse_mariadb_gtid(gtid)
        self._domains[domain] = (server, seq)

    def seq(self, domain: int) -> Optional[int]:
        entry = self._domains.get(domain)
        return entry[1] if entry else None

    def domains(self) -> Dict[int, Tuple[int, int]]:
        return dict(self._domains)

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(self._domains.items()))


class MysqlGtidState:
    """MySQL executed GTID set (``uuid:1-122,uuid2:1-7``)."""

    def __init__(self, text: str = ""):
        self._set = GtidSet(text.replace("\n", "") if text else None)

    def advance(self, gtid: str) -> None:
        self._set = self._set + Gtid(gtid)

    def __str__(self) -> str:
        return str(self._set)


def new_state(flavor: str, text: Optional[str]):
    """The GTID state class for ``flavor`` (None in file:pos mode)."""
    if text is None:
        return None
    return MariadbGtidState(text) if flavor == MARIADB else MysqlGtidState(text)


@dataclass(frozen=True)
class Checkpoint:
    """One resume point; see the module docstring for the JSON form."""

    flavor: str
    gtid: Optional[str]
    file: Optional[str]
    pos: Optional[int]
    tx: Optional[str] = None
    index: int = -1
    scope: str = ""

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"v": 1, "flavor": self.flavor, "gtid": self.gtid,
                               "file": self.file, "pos": self.pos}
        if self.tx is not None and self.index >= 0:
            out["tx"] = self.tx
            out["index"] = self.index
        out["scope"] = self.scope
        return out

    @classmethod
    def from_json(cls, value: Any) -> "Checkpoint":
        if not isinstance(value, dict) or value.get("v") != 1:
            raise CheckpointError(
                f"not a mysql checkpoint (expected an object with v=1): {value!r}")
        flavor = value.get("flavor")
        if flavor not in (MARIADB, MYSQL):
            raise CheckpointError(f"checkpoint flavor {flavor!r} is neither mariadb nor mysql")
        gtid = value.get("gtid")
        file = value.get("file")
        pos = value.get("pos")
        if gtid is None and (not file or not isinstance(pos, int)):
            raise CheckpointError("checkpoint has neither a GTID nor a binlog file and position")
        if gtid is not None and flavor == MARIADB:
            try:
                MariadbGtidState(gtid)
            except ValueError as exc:
                raise CheckpointError(str(exc)) from None
        tx = value.get("tx")
        index = value.get("index", -1)
        if tx is not None and (not isinstance(index, int) or index < 0):
            raise CheckpointError(f"checkpoint index {index!r} must be a non-negative integer")
        return cls(flavor, gtid, file, pos, tx, index if tx is not None else -1,
                   value.get("scope", ""))


def missing_after(checkpoint_gtid: str, oldest_start: str) -> Optional[str]:
    """The first GTID the server no longer has, or None when nothing after the checkpoint is gone.

    ``oldest_start`` is the GTID position at the start of the oldest binlog the server still
    has (``BINLOG_GTID_POS(oldest_file, 4)``): every transaction up to it was in purged files.
    A domain the checkpoint has not seen at all counts as sequence 0.
    """
    have = MariadbGtidState(checkpoint_gtid)
    start = MariadbGtidState(oldest_start)
    for domain, (server, seq) in sorted(start.domains().items()):
        seen = have.seq(domain)
        seen = 0 if seen is None else seen
        if seen < seq:
            if seen + 1 == seq:
                return f"{domain}-{server}-{seq}"
            return f"{domain}-?-{seen + 1} .. {domain}-{server}-{seq}"
    return None
