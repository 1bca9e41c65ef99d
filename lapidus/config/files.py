"""Reading a configuration file: TOML or JSON into a dict, syntax errors as
:class:`ConfigError` naming file, line and column, JSON keys given twice remembered for the
validator to report.  A UTF-8 byte order mark is accepted; UTF-16 text is named as such."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .. import settings as S
from .errors import ConfigError

# Windows editors (Notepad, PowerShell's Out-File) start UTF-8 files with a byte order mark.
# Neither TOML nor JSON parsers accept it ("Invalid statement" at 1:1), while every editor
# hides it, so the user cannot see what is wrong: drop it.
_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def read_file(path: Path) -> Dict[str, Any]:
    """Parse a TOML or JSON file into a dict; ConfigError naming file, line and column."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the configuration file: "
                           f"{exc.strerror or exc}"], str(path)) from None
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM):]
    elif raw.startswith(_UTF16_BOMS):
        raise ConfigError([f"{path}: the file is UTF-16 text (it starts with a UTF-16 byte "
                           f"order mark); save it as UTF-8"], str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError([f"{path}:{line}: not UTF-8 text"], str(path)) from None
    suffix = path.suffix.lower()
    is_json = suffix == ".json" or (suffix != ".toml" and text.lstrip().startswith("{"))
    try:
        data = _parse_json(text) if is_json else tomllib.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError([f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"],
                          str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([_toml_error(path, exc)], str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected an object at the top level, "
                           f"got {S.describe(data)}"], str(path))
    return data


def _toml_error(path: Path, exc: Exception) -> str:
    # tomllib (3.11) puts the position only into the message: "... (at line 3, column 8)".
    message = str(exc)
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match:
        return f"{path}:{match.group(1)}:{match.group(2)}: invalid TOML: {message[:match.start()]}"
    return f"{path}: invalid TOML: {message}"


class _JsonObject(dict):
    """A JSON object that remembers keys given twice (json keeps the last one silently)."""

    duplicates: Tuple[str, ...] = ()


def _parse_json(text: str) -> Any:
    def pairs(items: List[Tuple[str, Any]]) -> _JsonObject:
        obj = _JsonObject()
        seen: List[str] = []
        for key, value in items:
            if key in obj:
                seen.append(key)
            obj[key] = value
        obj.duplicates = tuple(seen)
        return obj

    return json.loads(text, object_pairs_hook=pairs)
