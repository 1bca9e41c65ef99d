"""Records -> NATS messages: subject, payload and header block, plus the cache_prefix extras.

Runs in the dispatcher process, inside its asyncio loop, once per batch; no nats-py import,
so it is unit-tested without a server.

Every message carries ``Nats-Msg-Id`` = the event id (JetStream drops a replayed change inside
its duplicate window, and any consumer can), ``Lapidus-Backend``, ``Lapidus-Type`` and
``Lapidus-Position`` (consumers route without parsing the payload).  The cache_prefix messages
get ``<event id>:<verb>`` as their id, so that a stream capturing both never takes one for a
duplicate of the other.

The header block is built here as the bytes NATS expects (``NATS/1.0\\r\\nKey: value\\r\\n...``):
one f-string per message instead of nats-py's per-header validation (see :mod:`.wire`).
Values never hold CR or LF: backend names are ``[A-Za-z0-9_-]``, event types are fixed words,
and ids and positions are made from LSNs, GTIDs, binlog coordinates or hex resume tokens;
:func:`_clean` still replaces any line break so that no value can ever end the block early.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ...events import Record
from ..subjects import SubjectBuilder
from .options import NatsOptions

#: event type -> cache verb.  The original Lapidus sent deletes to "populate": deletes purge.
CACHE_VERBS = {"insert": "populate", "update": "invalidate", "delete": "purge"}


class Message(NamedTuple):
    subject: str
    payload: bytes
    header: bytes          # the complete header block
    msg_id: str
    #: JetStream mode: acknowledged by a stream.  Cache messages are plain core NATS messages.
    stored: bool
    #: the index of its record in the batch given to build() (a cache message: its event's)
    record: int = 0


def _clean(value: str) -> str:
    if "\r" in value or "\n" in value:
        return value.replace("\r", " ").replace("\n", " ")
    return value


def header_tail(backend: str, kind: str, position: str) -> str:
    """The header block after the message id: the same for every event of one type in one
    transaction, so a batch builds it once per (type, position)."""
    return (f"\r\nLapidus-Backend: {backend}\r\nLapidus-Type: {_clean(kind)}\r\n"
            f"Lapidus-Position: {_clean(position)}\r\n\r\n")


def header_block(msg_id: str, backend: str, kind: str, position: str) -> bytes:
    return f"NATS/1.0\r\nNats-Msg-Id: {_clean(msg_id)}{header_tail(backend, kind, position)}"\
        .encode()


class MessageBuilder:
    def __init__(self, backend: str, options: NatsOptions):
        self.backend = _clean(backend)
        self.subjects = SubjectBuilder(backend, options.subject_prefix, options.subject_template)
        self.with_data = options.publish_event_data
        self.cache_prefix: Optional[str] = options.cache_prefix
        self.stored = options.jetstream

    def build(self, records: Sequence[Record]) -> List[Message]:
        """The messages of one batch, in record order (a cache message right after its event)."""
        out: List[Message] = []
        append = out.append
        subject_of = self.subjects.subject
        backend, with_data, stored, cache_prefix = (self.backend, self.with_data, self.stored,
                                                    self.cache_prefix)
        new_message = Message._make         # from a tuple: cheaper than Message(...)
        tails: Dict[Tuple[str, str], str] = {}
        for index, record in enumerate(records):
            subject = subject_of(record)
            payload = record.data if with_data else b""
            msg_id = record.id
            if "\r" in msg_id or "\n" in msg_id:
                msg_id = _clean(msg_id)
            tail = tails.get((record.type, record.position))
            if tail is None:
                tail = tails[(record.type, record.position)] = header_tail(
                    backend, record.type, record.position)
            # One f-string and one encode for the whole header block (the hot path).
            append(new_message((subject, payload,
                                f"NATS/1.0\r\nNats-Msg-Id: {msg_id}{tail}".encode(),
                                record.id, stored, index)))
            if cache_prefix is not None:
                verb = CACHE_VERBS.get(record.type)
                if verb is not None:
                    cache_id = f"{msg_id}:{verb}"
                    append(Message(f"{cache_prefix}{verb}.{subject}", payload,
                                   header_block(cache_id, backend, record.type, record.position),
                                   cache_id, False, index))
        return out
