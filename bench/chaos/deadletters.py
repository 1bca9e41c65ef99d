"""The dead letters a backend wrote: ``<state_dir>/<backend>/dead-letters.jsonl``.

With ``on_undeliverable = "dead_letter"`` a record that the sink refuses for good (larger than
the NATS server's ``max_payload``) is appended there as one JSON line with the fields ``id``,
``table``, ``size``, ``error``, ``fix``, ``at`` and ``event`` (the event's JSON object), and the
backend's stream goes on.  The checker counts such a change as delivered to the dead letters,
not lost; the ``dead_letter`` fault waits for its line.

Lines that do not parse are returned apart (``unreadable``): a torn or malformed line is a
finding of its own, not something to skip silently.  A last line without its newline is still
being written and is left for the next read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List

FILE_NAME = "dead-letters.jsonl"
FIELDS = ("id", "table", "size", "error", "fix", "at", "event")


@dataclass
class DeadLetters:
    backend: str
    letters: List[dict] = field(default_factory=list)
    unreadable: List[str] = field(default_factory=list)


def path_of(state_dir: Path, backend: str) -> Path:
    return Path(state_dir) / backend / FILE_NAME


def read(state_dir: Path, backend: str) -> DeadLetters:
    """Every complete line of the backend's dead-letter file (none when it does not exist)."""
    out = DeadLetters(backend)
    try:
        data = path_of(state_dir, backend).read_bytes()
    except FileNotFoundError:
        return out
    complete = data[:data.rfind(b"\n") + 1]
    for line in complete.splitlines():
        if not line.strip():
            continue
        try:
            letter = json.loads(line)
        except ValueError:
            out.unreadable.append(line[:200].decode("utf-8", "replace"))
            continue
        if not isinstance(letter, dict) or not isinstance(letter.get("event"), dict):
            out.unreadable.append(line[:200].decode("utf-8", "replace"))
            continue
        out.letters.append(letter)
    return out


def read_all(state_dir: Path, backends: Iterable[str]) -> Dict[str, DeadLetters]:
    return {name: read(state_dir, name) for name in backends}


def holds(state_dir: Path, backend: str, key: int, table: str) -> bool:
    """The backend's dead letters hold an event of ``table`` for primary key ``key``."""
    for letter in read(state_dir, backend).letters:
        event = letter["event"]
        if event.get("table") == table and (event.get("pk") or {}).get("id") == key:
            return True
    return False
