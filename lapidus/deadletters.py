"""The dead-letter file of a backend: events a sink refused for good, kept to be looked at and
sent again.

Written by the dispatcher (``on_undeliverable = "dead_letter"``), read by ``lapidusctl
dead-letters`` and by the dispatcher when it sends them again.  One JSON object per line in
``<state_dir>/<backend>/dead-letters.jsonl`` (mode 0600), appended and fsynced before the
stream goes on, so a dead-lettered event is never lost:

``{"at": ..., "backend": ..., "sink": ..., "id": ..., "type": ..., "schema": ..., "table": ...,
"size": bytes, "error": ..., "fix": ..., "key": [...], "position": ..., "event": {...}}``

``event`` is the event exactly as it was encoded (its bytes, embedded), and always the last
field, so sending it again sends the same bytes.  A resend first renames the file to
``dead-letters.resend.jsonl``; that file is deleted once every event in it was delivered (or
moved to the dead letters again), and a dispatcher that starts finds an unfinished one and goes
on with it.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Iterator, List, Tuple

from .events import Record

FILE = "dead-letters.jsonl"
RESEND_FILE = "dead-letters.resend.jsonl"
_EVENT_KEY = b',"event":'


def path_for(state_dir, backend: str) -> Path:
    return Path(state_dir) / backend / FILE


def resend_path_for(state_dir, backend: str) -> Path:
    return Path(state_dir) / backend / RESEND_FILE


def append(path: Path, record: Record, *, backend: str, sink: str, error: str,
           fix: str) -> None:
    """Add ``record`` to the file and fsync it (the dispatcher confirms nothing before)."""
    head = {
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z"),
        "backend": backend, "sink": sink, "id": record.id, "type": record.type,
        "schema": record.schema, "table": record.table, "size": len(record.data),
        "error": error, "fix": fix,
        "key": list(record.key) if record.key is not None else None,
        "position": record.position,
    }
    line = json.dumps(head, ensure_ascii=False).encode()[:-1] + _EVENT_KEY + record.data + b"}\n"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def table_of(record: Record) -> str:
    return f"{record.schema}.{record.table}" if record.schema else (record.table or "")


def read(path: Path) -> Iterator[Tuple[dict, Record]]:
    """Every entry of the file: its fields (without ``event``) and the record to send again.
    A last line cut off by a crash while it was written is skipped (it was never fsynced, so
    its event was not confirmed either, and comes again from the source)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    for line in data.splitlines():
        if not line.endswith(b"}"):
            continue
        cut = line.find(_EVENT_KEY)
        if cut < 0:
            continue
        try:
            head = json.loads(line[:cut] + b"}")
        except ValueError:
            continue
        key = tuple(head["key"]) if head.get("key") is not None else None
        record = Record(head["id"], head["type"], head.get("schema"), head.get("table"), key,
                        head["position"], line[cut + len(_EVENT_KEY):-1])
        yield head, record


def count(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


def entries(path: Path) -> List[dict]:
    """The fields of every entry, for ``lapidusctl dead-letters``."""
    return [head for head, _ in read(path)]
