"""Where an event stands in its backend's stream: the comparable key behind exactly-once.

Runs in the dispatcher process (pure functions, no I/O).  Events arrive in commit order per
backend; every event of one source transaction carries the same ``position`` (PostgreSQL: the
commit LSN; MySQL/MariaDB: the GTID, or ``file:pos`` of the transaction's start), and the rows
of one snapshot chunk carry the position of the chunk's high watermark.  So the stream is a
sequence of *groups* (a transaction, or a chunk of ``read`` rows) whose keys only grow:

* ``stream``: what keys compare within (``lsn``; a MariaDB GTID domain; a MySQL server uuid;
  ``binlog`` for file:pos).  Keys of different streams are never compared: each has its own
  cursor.
* ``key``: an integer that grows with the stream (LSN as a number, the GTID's sequence number,
  file number * 2**40 + offset).

A MySQL/MariaDB snapshot chunk has no position of its own: its rows carry the stream's
position where they were emitted, which is the GTID of the transaction committed just before
(or, without GTIDs, ``file:pos`` where the next transaction starts).  So MySQL keys are
doubled and a chunk slots in between: a transaction's key is ``2k``, a chunk after GTID ``k``
``2k + 1``, a chunk at ``file:pos`` just before the transaction starting there ``2k - 1``.
A PostgreSQL chunk has its watermark's own LSN and needs none of this.
"""

from __future__ import annotations

import re
from typing import Tuple

from ..base import SinkError

_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_MARIADB = re.compile(r"^(\d+)-(\d+)-(\d+)$")
_MYSQL = re.compile(r"^([0-9a-fA-F-]{36}):(\d+)$")
_FILEPOS = re.compile(r"^(.*?)(\d+):(\d+)$")


class UnorderedPosition(SinkError):
    """A position the sync sink cannot order (a MongoDB resume token, say)."""


def order_of(position: str, kind: str = "insert") -> Tuple[str, int]:
    """``(stream, key)`` of the position of an event of type ``kind``; raises
    :class:`UnorderedPosition`."""
    m = _LSN.match(position)
    if m:
        return "lsn", (int(m.group(1), 16) << 32) | int(m.group(2), 16)
    chunk = kind == "read"
    m = _MARIADB.match(position)
    if m:
        return f"gtid:{m.group(1)}", 2 * int(m.group(3)) + chunk
    m = _MYSQL.match(position)
    if m:
        return f"uuid:{m.group(1).lower()}", 2 * int(m.group(2)) + chunk
    m = _FILEPOS.match(position)
    if m:
        return (f"binlog:{m.group(1)}",
                2 * ((int(m.group(2)) << 40) | int(m.group(3))) - chunk)
    raise UnorderedPosition(
        f"sync: the position {position[:60]!r} cannot be ordered, so exactly-once apply is "
        f"impossible; fix: the sync sink takes PostgreSQL and MySQL/MariaDB backends only (a "
        f"MariaDB GTID position of several domains is not ordered either)")


def completes_itself(kind: str, data: bytes) -> bool:
    """An event that is a group of its own right away, never waiting for its transaction's
    end: snapshot rows (each row stands alone: applying part of a chunk is a correct state),
    non-transactional logical messages (their own LSN, no transaction) and gaps."""
    if kind in ("read", "gap"):
        return True
    return kind == "message" and b'"transactional":false' in data
