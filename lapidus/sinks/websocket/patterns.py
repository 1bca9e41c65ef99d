"""NATS-style subject patterns for websocket subscriptions: ``public.items.>``, ``*.orders.*``.

Runs in the dispatcher process (matching, once per event and subscription group) and wherever
options are validated (:func:`pattern_problem`); stdlib only.  The subjects matched are those of
docs/events.md, built by :class:`lapidus.sinks.subjects.SubjectBuilder` with the default
template (``schema.table.key``, ``_message.<prefix>``, ``_<type>.<schema>``).

Rules, as in NATS: tokens are separated by ``.``; ``*`` is exactly one token; ``>`` is one or
more tokens and only as the last one; a literal token is compared as it is written in the
subject (percent-encoded, see docs/sinks.md "Subjects").
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Optional, Sequence


def pattern_problem(pattern: str) -> Optional[str]:
    """Why ``pattern`` is not a usable subject pattern, or None."""
    if not isinstance(pattern, str):
        return "expected a string"
    if not pattern:
        return "is empty (give a subject pattern such as public.items.>)"
    if any(ch.isspace() or not ch.isprintable() for ch in pattern):
        return f'"{pattern}" contains whitespace or a control character'
    tokens = pattern.split(".")
    if any(not token for token in tokens):
        return f'"{pattern}" has an empty token (a leading or trailing ".", or "..")'
    for index, token in enumerate(tokens):
        if token == ">" and index != len(tokens) - 1:
            return f'"{pattern}": ">" may only be the last token'
        if token not in ("*", ">") and ("*" in token or ">" in token):
            return (f'"{pattern}": a wildcard is a whole token ("public.*", not '
                    f'"public.it*")')
    return None


def _regex(pattern: str) -> str:
    parts = []
    for token in pattern.split("."):
        if token == "*":
            parts.append(r"[^.]+")
        elif token == ">":
            parts.append(r".+")
        else:
            parts.append(re.escape(token))
    return r"\.".join(parts)


def matcher(patterns: Iterable[str]) -> Callable[[str], bool]:
    """A function ``subject -> bool``: whether the subject matches any of ``patterns`` (each
    already checked by :func:`pattern_problem`).  One compiled regex for the whole list."""
    compiled = re.compile("|".join(f"(?:{_regex(p)})" for p in patterns))
    fullmatch = compiled.fullmatch
    return lambda subject: fullmatch(subject) is not None


def both(first: Optional[Sequence[str]], second: Optional[Sequence[str]]
         ) -> Callable[[str], bool]:
    """A subject matches when it matches ``first`` and ``second`` (None: anything)."""
    checks = [matcher(p) for p in (first, second) if p is not None]
    if not checks:
        return lambda subject: True
    if len(checks) == 1:
        return checks[0]
    a, b = checks
    return lambda subject: a(subject) and b(subject)
