"""Records -> webhook requests: the body, its signature and the per-request headers.

Runs in the dispatcher process, inside its asyncio loop, once per POST; stdlib only, so it is
unit-tested without a server and consumers can import :func:`signature` to check theirs.

* Body: ``{"events":[<event>,<event>,...]}``, each event exactly its EVENTS.md JSON (the bytes
  the worker encoded, copied, never parsed again), in commit order.
* ``Lapidus-Signature: sha256=<hex>``: HMAC-SHA256 of the body bytes keyed with ``secret``
  (only when one is set).  The receiver computes it over the raw body it read and compares in
  constant time (``hmac.compare_digest``).
* ``Idempotency-Key: <first event id>..<last event id>``: the same events resent (a retry, a
  replay after a crash) carry the same key, as long as they are cut into the same requests;
  the event ids inside are the exact test of a repeat.
* ``Lapidus-Backend`` and ``Lapidus-Events`` (the count): routing without parsing.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Dict, Iterator, NamedTuple, Optional, Sequence

from ...events import Record

SIGNATURE_HEADER = "Lapidus-Signature"


class Request(NamedTuple):
    first: int             # index of its first record in the records given to send()
    count: int
    body: bytes
    headers: Dict[str, str]


def body_of(records: Sequence[Record]) -> bytes:
    return b'{"events":[' + b",".join([r.data for r in records]) + b"]}"


def signature(secret: str, body: bytes) -> str:
    """The Lapidus-Signature value for ``body``: ``sha256=<hex HMAC-SHA256>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: Optional[str]) -> bool:
    """For receivers: whether ``header`` is the right signature of ``body``."""
    return header is not None and hmac.compare_digest(signature(secret, body), header)


def idempotency_key(records: Sequence[Record]) -> str:
    return f"{records[0].id}..{records[-1].id}"


class RequestBuilder:
    def __init__(self, backend: str, secret: Optional[str]):
        self.backend = backend
        self.secret = secret

    def one(self, records: Sequence[Record], first: int = 0) -> Request:
        body = body_of(records)
        headers = {"Idempotency-Key": idempotency_key(records),
                   "Lapidus-Backend": self.backend, "Lapidus-Events": str(len(records))}
        if self.secret:
            headers[SIGNATURE_HEADER] = signature(self.secret, body)
        return Request(first, len(records), body, headers)

    def build(self, records: Sequence[Record], batch_size: int) -> Iterator[Request]:
        """The requests of one delivery, ``batch_size`` events each (the last one fewer),
        each built only when it is taken."""
        for i in range(0, len(records), batch_size):
            yield self.one(records[i:i + batch_size], i)
