"""Atomic, durable storage of one backend's position.

Runs in the worker process.  A checkpoint is written with the classic sequence
temp file -> fsync -> rename -> fsync(directory), so after ``kill -9`` or a power cut the file
holds either the old or the new position, never a torn one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import orjson


class CheckpointStore:
    """Reads and writes ``<state_dir>/checkpoint.json`` for one backend."""

    def __init__(self, directory: Path, name: str = "checkpoint.json"):
        self.directory = Path(directory)
        self.path = self.directory / name

    def load(self) -> Optional[Any]:
        """The last saved value, or ``None`` when nothing was saved yet."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return orjson.loads(data)["position"]

    def save(self, position: Any) -> None:
        """Persist ``position`` atomically and durably."""
        self.directory.mkdir(parents=True, exist_ok=True)
        write_durably(self.path, orjson.dumps({"position": position}))

    def clear(self) -> None:
        """Forget the position (the next start begins from the source's current end)."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.directory)


def write_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: the old or the new content after any crash."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
