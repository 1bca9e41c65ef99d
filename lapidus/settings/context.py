"""What a kind or a derived default may look at besides the value itself (:class:`Context`),
and how a configured path is resolved against it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional


@dataclass(frozen=True)
class Context:
    """What a kind or a derived default may look at besides the value itself."""

    env: Mapping[str, str]
    is_root: bool
    base_dir: Path                  # relative paths are resolved against the file's directory
    state_dir: Optional[Path] = None
    backend_type: Optional[str] = None   # while a backend's table is checked


def resolve_path(text: str, ctx: Context) -> Path:
    if text == "~" or text.startswith("~/"):
        path = _home(ctx) / text[2:]
    else:
        path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else ctx.base_dir / path


def _home(ctx: Context) -> Path:
    home = ctx.env.get("HOME")
    return Path(home) if home else Path.home()
