"""Read everything a JetStream stream holds and compare it with the ledger.

What is checked, per backend (see docs/dev/chaos.md):

* **lost**: every committed change of the ledger has an event (insert/update: the key and the
  version; delete: the key).  The most important number: it must be 0.
* **per-key order**: taking the first occurrence of each event id, the changes of one key
  appear in commit order (versions increasing, the delete last).
* **commit order**: the same across all keys of a backend (Lapidus promises commit order per
  backend, not only per key).
* **duplicates**: the stream itself holds no id twice (``Nats-Msg-Id`` dedup); a repeated id
  would have to carry the same content; one change never appears under two different ids.
* **phantoms**: no event for a change the database did not commit (not in the ledger).
* **content**: ``pk``, ``item`` and ``before`` carry the key and versions of the change, and
  ``Nats-Msg-Id`` equals the payload's ``id``.
* **dead letters** (``on_undeliverable = "dead_letter"``): a change whose event is larger than
  the server's ``max_payload`` (``Change.oversized``) must be in the backend's dead-letter file
  (once, or repeated with the same id) and absent from the stream: it counts as dead-lettered,
  not lost.  A dead letter of any other change, one that is also in the stream, or a malformed
  line is an error.
"""

from __future__ import annotations

import asyncio
import collections
import json
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple

import nats
from nats.js.api import DeliverPolicy

from .deadletters import FIELDS as DEAD_LETTER_FIELDS
from .deadletters import DeadLetters
from .load import FENCE_TABLE, TABLE, Change

EXAMPLES = 10


class StoredMessage(NamedTuple):
    seq: int
    subject: str
    msg_id: Optional[str]
    data: bytes


# -- reading the stream ---------------------------------------------------------------------------

async def _read_stream(url: str, stream: str, subject: str) -> List[StoredMessage]:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=10)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        last = info.state.last_seq
        if info.state.messages == 0:
            return []
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True,
                                 deliver_policy=DeliverPolicy.ALL,
                                 pending_msgs_limit=1 << 22, pending_bytes_limit=1 << 31)
        out: List[StoredMessage] = []
        try:
            while True:
                msg = await sub.next_msg(timeout=30)
                seq = msg.metadata.sequence.stream
                headers = msg.headers or {}
                out.append(StoredMessage(seq, msg.subject, headers.get("Nats-Msg-Id"),
                                         msg.data or b""))
                if seq >= last:
                    return out
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()


def read_stream(url: str, stream: str, subject: str) -> List[StoredMessage]:
    """Every message of ``stream`` in stored order, through an ordered (ephemeral) consumer."""
    return asyncio.run(_read_stream(url, stream, subject))


async def _last_on(url: str, stream: str, subject: str) -> Optional[bytes]:
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        try:
            msg = await nc.jetstream().get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        return msg.data or b""
    finally:
        await nc.close()


def last_on_subject(url: str, stream: str, subject: str) -> Optional[bytes]:
    """The newest stored payload on ``subject`` (None: nothing stored)."""
    return asyncio.run(_last_on(url, stream, subject))


async def _stream_messages(url: str, stream: str) -> int:
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        return (await nc.jetstream().stream_info(stream)).state.messages
    finally:
        await nc.close()


def stream_size(url: str, stream: str) -> int:
    return asyncio.run(_stream_messages(url, stream))


# -- the comparison -------------------------------------------------------------------------------

def keep_example(examples: Dict[str, List[str]], kind: str, text: str) -> None:
    """Keep ``text`` as an example of ``kind`` unless EXAMPLES of it are kept already."""
    shown = examples.setdefault(kind, [])
    if len(shown) < EXAMPLES:
        shown.append(text)


@dataclass
class BackendReport:
    backend: str
    committed: int = 0                 # changes in the ledger
    delivered: int = 0                 # distinct events of the rows table
    by_type: Dict[str, int] = field(default_factory=dict)
    lost: int = 0
    lost_holes: int = 0                # lost before the newest delivered change: silent gaps
    lost_tail: int = 0                 # lost after it: delivery stopped (stuck, or too early)
    phantoms: int = 0
    key_order_violations: int = 0      # keys whose changes appear out of order
    commit_order_violations: int = 0   # places where the backend's stream goes back in time
    same_change_other_id: int = 0
    content_errors: int = 0
    fences: int = 0
    oversized: int = 0                 # committed changes too large for NATS (by design)
    dead_lettered: int = 0             # of them, in the dead letters (and not in the stream)
    oversized_in_stream: int = 0       # too large, yet stored: max_payload was not applied
    dead_letter_unexpected: int = 0    # a dead letter of a change that was not oversized
    dead_letter_in_both: int = 0       # a change in the dead letters and in the stream
    dead_letter_errors: int = 0        # unreadable lines, missing fields, id or table mismatch
    examples: Dict[str, List[str]] = field(default_factory=dict)

    def example(self, kind: str, text: str) -> None:
        keep_example(self.examples, kind, text)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.phantoms or self.key_order_violations
                    or self.commit_order_violations or self.same_change_other_id
                    or self.content_errors or self.oversized_in_stream
                    or self.dead_letter_unexpected or self.dead_letter_in_both
                    or self.dead_letter_errors)


@dataclass
class CheckReport:
    stream_messages: int = 0
    distinct_ids: int = 0
    stored_duplicates: int = 0         # ids stored more than once (dedup failed)
    conflicting_duplicates: int = 0    # one id, different payloads
    header_mismatches: int = 0         # Nats-Msg-Id missing or not the payload's id
    unreadable: int = 0
    backends: Dict[str, BackendReport] = field(default_factory=dict)
    examples: Dict[str, List[str]] = field(default_factory=dict)

    def example(self, kind: str, text: str) -> None:
        keep_example(self.examples, kind, text)

    @property
    def lost(self) -> int:
        return sum(b.lost for b in self.backends.values())

    @property
    def ok(self) -> bool:
        return not (self.stored_duplicates or self.conflicting_duplicates
                    or self.header_mismatches or self.unreadable) \
            and all(b.ok for b in self.backends.values())

    def as_dict(self) -> dict:
        return {
            "ok": self.ok, "lost": self.lost, "stream_messages": self.stream_messages,
            "distinct_ids": self.distinct_ids, "stored_duplicates": self.stored_duplicates,
            "conflicting_duplicates": self.conflicting_duplicates,
            "header_mismatches": self.header_mismatches, "unreadable": self.unreadable,
            "examples": self.examples,
            "backends": {name: {k: v for k, v in vars(b).items()}
                         for name, b in self.backends.items()},
        }


def _key_of(event: dict) -> Optional[int]:
    pk = event.get("pk") or {}
    key = pk.get("id")
    return int(key) if key is not None else None


def check(messages: List[StoredMessage], ledger: Dict[str, List[Change]],
          dead_letters: Optional[Dict[str, DeadLetters]] = None) -> CheckReport:
    """Compare the stream (``messages``, in stored order) and the backends' dead letters with
    the ``ledger`` of committed changes."""
    report = CheckReport(stream_messages=len(messages))
    for name in ledger:
        report.backends[name] = BackendReport(name, committed=len(ledger[name]))

    # 1. the stream as stored: ids, repeats, headers
    first: Dict[str, Tuple[int, bytes]] = {}
    events: List[dict] = []               # first occurrence of each id, in stored order
    counts: Dict[str, int] = collections.Counter()
    for message in messages:
        try:
            event = json.loads(message.data)
            event_id = event["id"]
        except (ValueError, KeyError, TypeError):
            report.unreadable += 1
            report.example("unreadable", f"seq {message.seq}: {message.data[:200]!r}")
            continue
        if message.msg_id != event_id:
            report.header_mismatches += 1
            report.example("header_mismatch", f"seq {message.seq}: Nats-Msg-Id "
                                              f"{message.msg_id!r}, payload id {event_id!r}")
        counts[event_id] += 1
        if event_id in first:
            if first[event_id][1] != message.data:
                report.conflicting_duplicates += 1
                report.example("conflicting_duplicate",
                               f"{event_id}: seq {first[event_id][0]} and seq {message.seq} "
                               f"differ")
            continue
        first[event_id] = (message.seq, message.data)
        event["_seq"] = message.seq
        events.append(event)
    report.distinct_ids = len(first)
    for event_id, count in counts.items():
        if count > 1:
            report.stored_duplicates += count - 1
            report.example("stored_duplicate", f"{event_id} stored {count} times")

    # 2. per backend: match events to committed changes
    index: Dict[Tuple[str, int, str, Optional[int]], int] = {}
    for name, changes in ledger.items():
        for position, change in enumerate(changes):
            version = None if change.type == "delete" else change.version
            index[(name, change.key, change.type, version)] = position
    matched: Dict[str, Dict[int, str]] = {name: {} for name in ledger}   # position -> id
    order: Dict[str, List[Tuple[int, int, dict]]] = {name: [] for name in ledger}
    for event in events:
        name = event.get("backend")
        backend = report.backends.get(name)
        if backend is None:
            report.example("other_backend", f"{event['id']} of backend {name!r}")
            continue
        table = event.get("table")
        if table == FENCE_TABLE:
            backend.fences += 1
            continue
        if table != TABLE:
            backend.phantoms += 1
            backend.example("phantom", f"{event['id']}: unexpected table {table!r}")
            continue
        kind = event.get("type")
        backend.delivered += 1
        backend.by_type[kind] = backend.by_type.get(kind, 0) + 1
        key = _key_of(event)
        if not _content_ok(event, key, backend):
            continue
        version = None if kind == "delete" else event["item"]["version"]
        position = index.get((name, key, kind, version))
        if position is None:
            backend.phantoms += 1
            backend.example("phantom", f"{event['id']}: {kind} key {key} version {version} "
                                       f"(seq {event['_seq']}) was never committed")
            continue
        if position in matched[name]:
            backend.same_change_other_id += 1
            backend.example("same_change_other_id",
                            f"{kind} key {key} version {version}: ids "
                            f"{matched[name][position]} and {event['id']}")
            continue
        if kind == "delete":
            before = event.get("before")
            deleted = ledger[name][position].version
            if isinstance(before, dict) and before.get("version", deleted) != deleted:
                backend.content_errors += 1
                backend.example("content", f"{event['id']}: delete of version "
                                           f"{before['version']}, committed {deleted}")
        matched[name][position] = event["id"]
        order[name].append((position, key, event))

    dead = _match_dead_letters(report, ledger, index, matched, dead_letters or {})

    for name, changes in ledger.items():
        backend = report.backends[name]
        newest_delivered = max(matched[name], default=-1)
        for position, change in enumerate(changes):
            if change.oversized:
                backend.oversized += 1
                if position in matched[name]:
                    backend.oversized_in_stream += 1
                    backend.example("oversized_in_stream",
                                    f"{change.type} key {change.key}: stored although larger "
                                    f"than max_payload")
            if position not in matched[name] and position not in dead[name]:
                backend.lost += 1
                if position < newest_delivered:
                    backend.lost_holes += 1
                else:
                    backend.lost_tail += 1
                backend.example("lost", f"{change.type} key {change.key} version "
                                        f"{change.version} (writer tx {change.tx}, change "
                                        f"{position} of {len(changes)})")
        # 3. order: per key, and across the backend
        newest_by_key: Dict[int, Tuple[int, dict]] = {}
        bad_keys = set()
        newest = -1
        newest_event: Optional[dict] = None
        for position, key, event in order[name]:
            previous = newest_by_key.get(key)
            if previous is not None and position < previous[0]:
                if key not in bad_keys:
                    backend.example("key_order", f"key {key}: {_brief(event)} after "
                                                 f"{_brief(previous[1])}")
                bad_keys.add(key)
            if previous is None or position > previous[0]:
                newest_by_key[key] = (position, event)
            if position < newest:
                backend.commit_order_violations += 1
                backend.example("commit_order", f"{_brief(event)} after "
                                                f"{_brief(newest_event)}")
            else:
                newest, newest_event = position, event
        backend.key_order_violations = len(bad_keys)
    return report


def _match_dead_letters(report: CheckReport, ledger: Dict[str, List[Change]],
                        index: Dict[Tuple[str, int, str, Optional[int]], int],
                        matched: Dict[str, Dict[int, str]],
                        dead_letters: Dict[str, DeadLetters]) -> Dict[str, Dict[int, str]]:
    """Match each backend's dead letters to committed changes; returns position -> id of the
    changes found there (a repeat with the same id is one change)."""
    found: Dict[str, Dict[int, str]] = {name: {} for name in ledger}
    for name, letters in dead_letters.items():
        backend = report.backends.get(name)
        if backend is None:
            continue
        for line in letters.unreadable:
            backend.dead_letter_errors += 1
            backend.example("dead_letter_error", f"unreadable line {line!r}")
        for letter in letters.letters:
            event = letter["event"]
            missing = [f for f in DEAD_LETTER_FIELDS if f not in letter]
            if missing or letter.get("id") != event.get("id") \
                    or letter.get("table") != event.get("table"):
                backend.dead_letter_errors += 1
                backend.example("dead_letter_error",
                                f"{letter.get('id')}: missing {missing}, id/table "
                                f"{letter.get('id')}/{letter.get('table')} for the event's "
                                f"{event.get('id')}/{event.get('table')}")
            key, kind = _key_of(event), event.get("type")
            version = None if kind == "delete" else (event.get("item") or {}).get("version")
            position = index.get((name, key, kind, version))
            if position is None:
                backend.dead_letter_unexpected += 1
                backend.example("dead_letter_unexpected",
                                f"{event.get('id')}: {kind} of {event.get('table')} key {key} "
                                f"version {version} is no committed change")
                continue
            previous = found[name].get(position)
            if previous is not None:
                if previous != event.get("id"):
                    backend.same_change_other_id += 1
                    backend.example("same_change_other_id", f"dead letters {previous} and "
                                                            f"{event.get('id')}")
                continue
            found[name][position] = event.get("id")
            if not ledger[name][position].oversized:
                backend.dead_letter_unexpected += 1
                backend.example("dead_letter_unexpected",
                                f"{event.get('id')}: {kind} key {key} version {version} is "
                                f"small enough to deliver")
            if position in matched[name]:
                backend.dead_letter_in_both += 1
                backend.example("dead_letter_in_both", f"{event.get('id')}: {kind} key {key} "
                                                       f"in the stream too")
        backend.dead_lettered = sum(1 for p in found[name] if ledger[name][p].oversized)
    return found


def _brief(event: Optional[dict]) -> str:
    if event is None:
        return "-"
    version = (event.get("item") or event.get("before") or {}).get("version")
    return (f"{event['type']} key {_key_of(event)} v{version} (id {event['id']}, "
            f"seq {event['_seq']})")


def _content_ok(event: dict, key: Optional[int], backend: BackendReport) -> bool:
    kind = event.get("type")
    item, before = event.get("item"), event.get("before")
    problem = None
    if key is None:
        problem = "no pk"
    elif kind in ("insert", "update"):
        if not isinstance(item, dict) or item.get("id") != key \
                or not isinstance(item.get("version"), int):
            problem = f"item {item!r} does not match the key"
        elif kind == "update" and isinstance(before, dict) and "version" in before \
                and before["version"] != item["version"] - 1:
            problem = f"before.version {before['version']} for item.version {item['version']}"
    elif kind == "delete":
        if item is not None:
            problem = "a delete with an item"
    else:
        problem = f"unexpected type {kind!r}"
    if problem:
        backend.content_errors += 1
        backend.example("content", f"{event.get('id')}: {problem}")
        return False
    return True


def format_report(report: CheckReport) -> str:
    lines = [f"stream: {report.stream_messages} messages, {report.distinct_ids} distinct ids, "
             f"{report.stored_duplicates} stored duplicates, {report.conflicting_duplicates} "
             f"conflicting duplicates, {report.header_mismatches} header mismatches"]
    for name, b in report.backends.items():
        types = ", ".join(f"{k} {v}" for k, v in sorted(b.by_type.items()))
        lines.append(
            f"{name}: committed {b.committed}, delivered {b.delivered} ({types}), "
            f"LOST {b.lost} ({b.lost_holes} holes, {b.lost_tail} after the newest delivered "
            f"change), phantoms {b.phantoms}, key order violations "
            f"{b.key_order_violations}, commit order violations {b.commit_order_violations}, "
            f"same change under another id {b.same_change_other_id}, content errors "
            f"{b.content_errors}, fences {b.fences}")
        if b.oversized or b.dead_lettered or b.dead_letter_unexpected or b.dead_letter_errors:
            lines.append(
                f"{name} dead letters: {b.dead_lettered} of {b.oversized} oversized changes, "
                f"unexpected {b.dead_letter_unexpected}, also in the stream "
                f"{b.dead_letter_in_both}, oversized yet stored {b.oversized_in_stream}, "
                f"malformed {b.dead_letter_errors}")
        for kind, shown in b.examples.items():
            lines.append(f"  {kind}: " + "; ".join(shown))
    for kind, shown in report.examples.items():
        lines.append(f"  {kind}: " + "; ".join(shown))
    lines.append("RESULT: " + ("OK, nothing lost" if report.ok else
                               f"FAILED (lost {report.lost})"))
    return "\n".join(lines)
