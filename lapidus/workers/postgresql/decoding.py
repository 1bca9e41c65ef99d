"""What a PostgreSQL output-plugin decoder produces, and the interface every decoder offers.

Runs in the PostgreSQL worker process.  A decoder turns the raw bytes that ``pg_recvlogical``
spooled into a sequence of :class:`Begin`, :class:`Change` and :class:`Commit` messages; the
:class:`~lapidus.workers.postgresql.transactions.TransactionAssembler` turns those into events with
deterministic ids.  wal2json and pgoutput differ only in framing and in how values arrive, so
everything after this interface is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Protocol, Sequence, Tuple


def parse_lsn(text: str) -> int:
    """``"0/1928C90"`` -> 26381456."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(value: int) -> str:
    """26381456 -> ``"0/1928C90"`` (PostgreSQL's own spelling)."""
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@dataclass(slots=True)
class Begin:
    """Start of a transaction.  ``commit_lsn`` identifies it (both plugins send it up front)."""

    commit_lsn: int
    xid: Optional[str]
    ts: Optional[str]


@dataclass(slots=True)
class Commit:
    """End of a transaction."""

    commit_lsn: int


@dataclass(slots=True)
class Change:
    """One row change, truncate or logical message, values already mapped to JSON form.

    A message outside a transaction (``transactional=False``) carries its own ``lsn``.
    """

    type: str
    schema: Optional[str] = None
    table: Optional[str] = None
    pk: Optional[dict] = None
    item: Optional[dict] = None
    before: Optional[dict] = None
    unchanged: Optional[List[str]] = None
    prefix: Optional[str] = None
    content: Optional[str] = None
    transactional: Optional[bool] = None
    lsn: Optional[int] = None


@dataclass(slots=True)
class Watermark:
    """A snapshot watermark: a logical message with prefix ``lapidus-snapshot``.

    Never an event: the transaction assembler ignores it, a running snapshot acts on it
    (:mod:`.snapshot`).  The decoder sets it apart even while no snapshot runs, so a
    watermark left in the WAL by an earlier run is dropped, not streamed as a message."""

    content: str


@dataclass(slots=True)
class RelationChanged:
    """A table described with other columns (or another name) than before: DDL seen through
    pgoutput's relation messages (:mod:`.ddl`).  Becomes a ``schema`` event that does not
    count in its transaction's change index: a resent relation message is not a change."""

    relid: int
    schema: str
    table: str
    item: dict


Message = Any  # Begin | Change | Commit | Watermark | RelationChanged | None


class Decoder(Protocol):
    """Framing and decoding for one output plugin."""

    #: the output plugin name a slot is created with
    plugin: str

    def plugin_options(self) -> List[str]:
        """``-o name=value`` arguments for ``pg_recvlogical --start``."""

    def split(self, data: bytes) -> Tuple[Sequence[bytes], int]:
        """Cut ``data`` into complete frames.  Returns the frames and the number of bytes they
        used (including the newline ``pg_recvlogical`` writes after each message); the rest of
        ``data`` is an incomplete frame to be completed by the next read."""

    def decode_run(self, data: bytes, pos: int, limit: int,
                   origin: Tuple[int, int]) -> Tuple[List[Tuple[Message, int]], int]:
        """Frame and decode up to ``limit`` complete messages of ``data`` from ``pos``: each
        with the bytes it used (newline included), and the position after the last one.
        ``origin`` is the spool position (segment, offset) of ``data[0]``.  What the spool
        reader calls; ``split`` frames without decoding (cutting a half-written tail)."""

    def decode(self, frame: bytes) -> Message:
        """One frame to a message, a list of them (pgoutput's TRUNCATE of several tables is
        one frame and one event per table), or ``None`` for frames that produce no event."""
