"""How an error message shows a value (:func:`describe`), and which key or choice a misspelt
one most likely meant (:func:`suggest`)."""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, Iterable, Optional


def suggest(word: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate a misspelt ``word`` most likely meant, or None.

    ``authSource`` finds ``auth_source`` (same letters once case and separators are ignored)
    before difflib's similarity ranking is tried.
    """
    candidates = list(candidates)
    squash = {re.sub(r"[_\-]", "", c).lower(): c for c in candidates}
    hit = squash.get(re.sub(r"[_\-]", "", word).lower())
    if hit is not None:
        return hit
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    lowered = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def describe(value: Any, *, secret: bool = False) -> str:
    """How an error message shows a value: the value itself, or only its type for a secret."""
    if isinstance(value, bool):
        return "a boolean" if secret else str(value).lower()
    if isinstance(value, (int, float)):
        return "a number" if secret else repr(value)
    if isinstance(value, str):
        if secret:
            return "a string"
        return json.dumps(value if len(value) <= 60 else value[:57] + "...")
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"
