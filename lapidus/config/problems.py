"""How the validator collects and names problems: the base of its parts (:class:`_Problems`),
key paths like ``backends[0].slot``, the marker for a value already reported, and the order in
which the problems are listed."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Mapping, Sequence, Tuple


class _Bad:
    """Stands for a value already reported as a problem (an unset ``${VAR}``), so the same
    key does not collect a second, confusing complaint."""

    def __repr__(self) -> str:
        return "<already reported>"


_BAD = _Bad()
_PLAIN_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


def _join(path: str, key: Any) -> str:
    text = key if isinstance(key, str) and _PLAIN_KEY_RE.fullmatch(key) else json.dumps(str(key))
    return f"{path}.{text}" if path else text


def _has_bad(value: Any) -> bool:
    if value is _BAD:
        return True
    if isinstance(value, list):
        return any(_has_bad(v) for v in value)
    if isinstance(value, dict):
        return any(_has_bad(v) for v in value.values())
    return False


def _without_bad(value: Any) -> Any:
    if value is _BAD:
        return None
    if isinstance(value, list):
        return [_without_bad(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_bad(v) for k, v in value.items()}
    return value


class _Problems:
    """Base of the validator's parts (:mod:`.validate`): problems are collected rather than
    raised, so that one run reports every one of them."""

    problems: List[str]
    # key path -> (variables expanded into its value, whether the value was one "${VAR}"
    # alone); filled by the expander (:mod:`.variables`), read by :meth:`origin`.
    origins: Dict[str, Tuple[Tuple[str, ...], bool]]

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}" if path else message)

    def origin(self, path: str) -> str:
        """``from ${PG_PORT}`` when the value at ``path`` came from the environment (the file
        shows only the reference, so a message must name the variable), else ``""``."""
        names, whole = getattr(self, "origins", {}).get(path, ((), False))
        if not names:
            return ""
        refs = ", ".join(f"${{{name}}}" for name in names)
        return f"from {refs}" if whole else f"with {refs} expanded"


def _document_order(problems: Sequence[str], data: Mapping[str, Any]) -> List[str]:
    """Group problems by top-level key (in file order) and backend index, keeping the order
    of discovery inside a group: ``${VAR}`` problems are found in an earlier pass than the
    others but belong next to the rest of their backend's."""
    keys = list(data)

    def group(problem: str) -> Tuple[int, int]:
        match = re.match(r"([A-Za-z0-9_-]+|\"[^\"]*\")(?:\[(\d+)\])?", problem)
        if not match:
            return (-1, 0)
        top = match.group(1).strip('"')
        return (keys.index(top) if top in keys else len(keys), int(match.group(2) or 0))

    return sorted(problems, key=group)
