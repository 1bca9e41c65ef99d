"""The event contract: one immutable :class:`Event` per change, and its JSON encoding.

This module is a leaf (stdlib and orjson only); every process imports it.
The contract itself is documented in ``docs/events.md``.

Values inside ``item``, ``before`` and ``pk`` are already mapped to their JSON form by the
decoder that built the event (NUMERIC as an exact string, bytea as base64, ...).  The one
exception is numbers inside json/jsonb/JSON columns: they are kept as :class:`decimal.Decimal`
so that ``12345678901234567890.000000001`` survives, and the encoder writes them as bare JSON
numbers with exactly the stored digits.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence

import orjson

EVENT_TYPES = ("insert", "update", "replace", "delete", "truncate", "message", "schema", "gap",
               "read")



class Event(NamedTuple):
    """One change.  Immutable: assigning to a field raises ``AttributeError``.

    ``id`` is deterministic (backend, source position, index inside the transaction), so a
    replayed change carries the same id.

    A named tuple rather than a frozen dataclass: it is just as immutable and has no
    ``__dict__``, and it is built about four times faster (a frozen dataclass sets each of its
    16 fields through ``object.__setattr__``), which is measurable at 100k events a second.
    ``event._replace(...)`` makes a changed copy.
    """

    id: str
    type: str
    backend: str
    schema: Optional[str]
    table: Optional[str]
    pk: Optional[Mapping[str, Any]]
    item: Optional[Mapping[str, Any]]
    before: Optional[Mapping[str, Any]]
    position: str
    txid: Optional[str]
    ts: Optional[str]
    unchanged: Optional[Sequence[str]] = None
    update: Optional[Mapping[str, Any]] = None
    prefix: Optional[str] = None
    content: Optional[str] = None
    transactional: Optional[bool] = None

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object of this event, in documented field order, optional fields omitted."""
        return event_object(self)


def _default(value: Any) -> Any:
    """orjson hook for the few Python types that can still appear inside event values."""
    if isinstance(value, decimal.Decimal):
        # Numbers from json/jsonb keep their exact digits (never through float).
        if value.is_finite():
            return orjson.Fragment(str(value))
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, _dt.timedelta):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} in an event")


def event_object(event: Event) -> Dict[str, Any]:
    """The JSON object of ``event``, in documented field order, optional fields omitted.

    Unpacks the tuple once rather than reading sixteen attributes: this runs once per event
    (0.43 against 0.56 us here, ``to_dict`` before and after)."""
    (id_, type_, backend, schema, table, pk, item, before, position, txid, ts,
     unchanged, update, prefix, content, transactional) = event
    out: Dict[str, Any] = {
        "id": id_, "type": type_, "backend": backend, "schema": schema, "table": table,
        "pk": pk, "item": item, "before": before, "position": position, "txid": txid, "ts": ts}
    if unchanged is not None:
        out["unchanged"] = unchanged
    if update is not None:
        out["update"] = update
    if prefix is not None or content is not None:
        out["prefix"] = prefix
        out["content"] = content
    if transactional is not None:
        out["transactional"] = transactional
    return out


def encode(event: Event) -> bytes:
    """The event as one line of UTF-8 JSON, without the trailing newline."""
    return orjson.dumps(event_object(event), default=_default)


def encode_value(value: Any) -> bytes:
    """Encode any mapped value (used by tests and sinks that need a single field)."""
    return orjson.dumps(value, default=_default)


def decode(data: bytes | str) -> dict:
    """Parse an encoded event back into a dict (numbers as Python int/float)."""
    return orjson.loads(data)


class Record(NamedTuple):
    """An event as it travels from a worker to the sinks: encoded once, plus routing fields.

    Sinks know only this and the sink interface.  ``key`` holds the primary-key values in key
    order, already rendered as text (``None`` when the table has no key); a NATS sink turns
    them into subject tokens.
    """

    id: str
    type: str
    schema: Optional[str]
    table: Optional[str]
    key: Optional[tuple]
    position: str
    data: bytes


def key_values(pk: Optional[Mapping[str, Any]]) -> Optional[tuple]:
    """Primary-key values in key order, each as the text a subject token is made from."""
    if not pk:
        return None
    out = []
    for value in pk.values():
        kind = type(value)
        if kind is str:
            out.append(value)
        elif kind is int:
            out.append(str(value))
        elif value is None:
            out.append("")
        else:
            out.append(encode_value(value).decode("utf-8"))
    return tuple(out)


def to_record(event: Event) -> Record:
    """Encode an event once for transport to the sinks."""
    return Record(*record_fields(event))


def record_fields(event: Event) -> tuple:
    """The fields of :func:`to_record` as a plain tuple: what workers send over the wire
    (plain tuples pickle about 6x faster than named tuples); ``Record._make`` rebuilds it."""
    return batch_fields((event,))[0]


class ReadChunk(NamedTuple):
    """A snapshot chunk's ``read`` events, already encoded by their source: ``records`` are
    their :class:`Record` fields in key order (what :func:`batch_fields` gives for each), all of
    ``schema.table`` with commit time ``ts``.

    A snapshot run that builds a chunk's JSON lines straight from the rows it selected
    (:mod:`lapidus.workers.snapshot.lines`: PostgreSQL and MariaDB) puts one of these in a
    batch instead of one :class:`Event` per row; only the worker loop takes them
    (``Source.encoded_reads``).  Laid out so that what the loop reads of an event means the
    same here: ``[1]`` is the type, ``.ts`` the commit time.  Runs in the worker process;
    never pickled.
    """

    records: list
    type: str
    backend: str
    schema: str
    table: str
    ts: Optional[str]


def read_pieces(event: Event) -> tuple:
    """``(head, middle, tail)``: the constant pieces of the JSON of ``read`` events like
    ``event`` (same type, backend, table, position, ts), in bytes.  Such an event encodes as
    ``b'{"id":' + <id JSON> + head + <pk JSON> + middle + <item JSON> + tail``, byte for byte
    what :func:`encode` gives: orjson writes an object as ``{`` members joined by ``,`` ``}``,
    each ``"key":value`` without spaces (tests/unit/test_events.py compares them)."""
    obj = event_object(event)
    keys = list(obj)
    if keys[:1] != ["id"] or keys[5:7] != ["pk", "item"]:
        raise ValueError(f"unexpected event object keys {keys}")

    def members(names):
        return b"".join(b"," + orjson.dumps(name) + b":"
                        + orjson.dumps(obj[name], default=_default) for name in names)

    return members(keys[1:5]) + b',"pk":', b',"item":', members(keys[7:]) + b"}"


def batch_fields(events: Sequence[Event]) -> list:
    """``[record_fields(e) for e in events]``: what the worker loop sends for a batch.

    One loop for the batch, so that a snapshot chunk's ``read`` events (thousands in a row)
    take a path of their own without a function call per event: they are encoded from the
    constant pieces of their run (:class:`_ReadPieces`), byte for byte what :func:`encode`
    gives, and a one-column key becomes its text without :func:`key_values`' loop.  A
    :class:`ReadChunk` gives its records as they are.  Other events are :func:`encode`'s
    bytes, copied.  Runs in the worker process.
    """
    out = []
    append = out.append
    dumps, join, pieces = orjson.dumps, b"".join, _read_pieces
    for event in events:
        if event.__class__ is ReadChunk:
            out += event.records
            continue
        if event[1] != "read":
            # a copy of orjson's result, which then is dropped at once: a batch of kept
            # orjson results makes the heap grow and shrink with every batch (see
            # _ReadPieces), the copies do not
            append((event[0], event[1], event[3], event[4], key_values(event[5]), event[8],
                    bytes(memoryview(encode(event)))))
            continue
        shared = event[1:5] + event[7:]        # all fields but id, pk, item
        if shared != pieces.shared:
            pieces.cut(shared, event)
        pk = event[5]
        key = None
        if pk.__class__ is dict and len(pk) == 1:
            values = tuple(pk.values())     # key_values' result for a text key, in C
            kind = values[0].__class__
            if kind is str:
                key = values
            elif kind is int:
                key = (str(values[0]),)
        if key is None:
            key = key_values(pk)
        append((event[0], "read", event[3], event[4], key, event[8],
                join((b'{"id":', dumps(event[0]), pieces.head, dumps(pk, default=_default),
                      pieces.middle, dumps(event[6], default=_default), pieces.tail))))
    return out


class _ReadPieces:
    """The constant pieces of the JSON of a run of snapshot ``read`` events (:func:`batch_fields`).

    The events of one chunk differ only in ``id``, ``pk`` and ``item``; every other field
    (type, backend, table, position, ts, the absent optional fields) is the same.  The
    first event of a run gives the constant pieces (:func:`read_pieces`); each next event whose
    other fields equal the run's is those pieces joined with orjson's encoding of its three
    own values; a field that differs starts a new run.

    Also faster for a reason of the allocator: orjson's results come from glibc with room to
    spare (shrunk at the end, as it seems); a batch of them kept alive until it is pickled
    grows the heap, and freeing the batch trims it back, so every batch faults its pages in
    again (measured in docs/dev/benchmarks.md, Snapshot).  Here orjson's results are short-lived
    and the kept bytes are the join's, small and from Python's own allocator.

    One per process (the worker's); the worker loop is single-threaded.
    """

    __slots__ = ("shared", "head", "middle", "tail")

    def __init__(self):
        self.shared: Optional[tuple] = None
        self.head = self.middle = self.tail = b""

    def cut(self, shared: tuple, event: Event) -> None:
        self.head, self.middle, self.tail = read_pieces(event)
        self.shared = shared


_read_pieces = _ReadPieces()
