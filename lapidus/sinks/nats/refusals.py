"""Messages the NATS server refuses for good, and the UndeliverableError for their record.

Runs in the dispatcher process, inside its asyncio loop.  Two refusals cannot be cured by
sending the batch again, only by changing the server's settings or the sink's options:

* a message larger than the server's ``max_payload`` (from its INFO; nats-py exposes it as
  ``Client.max_payload``): checked for the whole batch before any of it is published
  (:func:`check_sizes`), and again as each message is handed over (a reconnect may reach a
  server of the cluster with a smaller limit);
* a subject the user may not publish to: the server answers the publish with
  ``-ERR 'Permissions Violation for Publish to "<subject>"'`` (core and JetStream alike; no
  ack follows), which :class:`.connection.Connection` collects.

The publishers raise :class:`Refusal` naming the message; :meth:`lapidus.sinks.nats.NatsSink.send`
turns it into :class:`lapidus.sinks.base.UndeliverableError` naming the record (its index in the
batch, event id, table and size), which the dispatcher's ``on_undeliverable`` policy handles.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence

from ...events import Record
from ..base import SinkError, UndeliverableError
from .messages import Message

_PUBLISH_REFUSED = re.compile(r'permissions violation for publish to "([^"]*)"', re.IGNORECASE)

TOO_LARGE_FIX = ("raise max_payload in the nats-server configuration (max_payload: 8MB; the "
                 "server caps it at 64MB), or set publish_event_data = false, or leave the "
                 "large column out of the event")
REFUSED_FIX = ("allow it in the server's permissions for that user, or change subject_prefix "
               "/ subject_template")


class Refusal(SinkError):
    """The server refuses ``message`` for good (``problem``); ``fix`` says what to change."""

    def __init__(self, message: Message, problem: str, fix: str):
        super().__init__(f"{problem}; fix: {fix}")
        self.message = message
        self.problem = problem
        self.fix = fix


def size_of(message: Message) -> int:
    """What the server compares with max_payload: header block plus payload."""
    return len(message.header) + len(message.payload)


def too_large(message: Message, max_payload: int) -> Refusal:
    return Refusal(message, f"{size_of(message)} bytes on subject \"{message.subject}\", more "
                            f"than the NATS server's max_payload ({max_payload} bytes)",
                   TOO_LARGE_FIX)


def check_sizes(messages: Sequence[Message], max_payload: int) -> None:
    """Raise :class:`Refusal` for the first message larger than ``max_payload``."""
    for message in messages:
        if len(message.header) + len(message.payload) > max_payload:
            raise too_large(message, max_payload)


def refused_subjects(errors: Iterable[str]) -> list:
    """The subjects named by the server's publish refusals, in the order they came."""
    out = []
    for error in errors:
        match = _PUBLISH_REFUSED.search(error)
        if match:
            out.append(match.group(1))
    return out


def refusal_for(messages: Sequence[Message], errors: Sequence[str]) -> Optional[Refusal]:
    """The :class:`Refusal` of the first message of the batch whose subject the server
    refused (``errors``: its -ERR texts since the batch began), or None when no refused
    subject is in the batch."""
    subjects = set(refused_subjects(errors))
    for message in messages:
        if message.subject in subjects:
            error = next(e for e in errors if f'"{message.subject}"' in e)
            return Refusal(message, f"NATS refused to publish event {message.msg_id} "
                                    f"({error}); the user of the nats plugin may not publish "
                                    f"to that subject", REFUSED_FIX)
    return None


def undeliverable(refusal: Refusal, records: Sequence[Record]) -> UndeliverableError:
    """``refusal`` as the record's UndeliverableError: its index, event id, table and size."""
    index = refusal.message.record
    record = records[index]
    if record.table:
        where = "of table " + ".".join(p for p in (record.schema, record.table) if p)
    else:
        where = f"({record.type}, no table)"
    reason = f"event {record.id} {where} ({len(record.data)} bytes of JSON): {refusal.problem}"
    return UndeliverableError(index, reason, refusal.fix)
