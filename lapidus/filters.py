"""Include/exclude globs on table names.

A pattern without a dot matches the bare table name (``sessions``, ``audit_*``); a pattern with
a dot matches ``schema.table`` (``public.audit_*``, ``crm.*``).  A table is streamed when it
matches no exclude pattern and, if any include patterns are given, at least one of them.
Runs in the worker process; results are cached per table, so the glob cost is paid once.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Dict, Iterable, Sequence, Tuple


def _compile(patterns: Iterable[str]) -> Tuple[Tuple[bool, "re.Pattern[str]"], ...]:
    return tuple(("." in p, re.compile(fnmatch.translate(p))) for p in patterns)


class TableFilter:
    """Decides whether changes to ``schema.table`` are streamed."""

    def __init__(self, include: Iterable[str] = (), exclude: Iterable[str] = ()):
        self._include = _compile(include)
        self._exclude = _compile(exclude)
        self._cache: Dict[Tuple[str, str], bool] = {}

    @property
    def is_trivial(self) -> bool:
        """True when every table passes (no patterns at all)."""
        return not self._include and not self._exclude

    def allows(self, schema: str, table: str) -> bool:
        key = (schema, table)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._decide(schema, table)
            self._cache[key] = hit
        return hit

    def _decide(self, schema: str, table: str) -> bool:
        return self.allows_any(((schema, table),))

    def allows_any(self, names: Sequence[Tuple[str, str]]) -> bool:
        """The decision for one table known by several ``(schema, table)`` names (a
        partition and its partitioned parents): excluded when any name matches an exclude
        pattern; with include patterns, streamed when any name matches one.  Not cached."""
        if any(_matches(self._exclude, schema, table) for schema, table in names):
            return False
        return not self._include or any(_matches(self._include, schema, table)
                                        for schema, table in names)


def _matches(rules, schema: str, table: str) -> bool:
    qualified = f"{schema}.{table}"
    return any(rx.match(qualified if dotted else table) for dotted, rx in rules)
