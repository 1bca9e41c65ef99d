"""Telling the operator when an ``include_tables`` pattern that matched nothing at start
finally matches a table.

Runs in the PostgreSQL and MySQL worker processes.  The warning at start ("matches no
table") is made by each source, which knows how to list its tables; this object remembers the
patterns and, while any is left, looks at the tables of the events read (one set look-up per
event, nothing once every pattern matched).
"""

from __future__ import annotations

from typing import Iterable, List, Set, Tuple

from ..filters import TableFilter


class ScopeWatch:
    def __init__(self, log):
        self.log = log
        self.patterns: List[Tuple[str, TableFilter]] = []
        self._seen: Set[Tuple[str, str]] = set()

    def expect(self, patterns: Iterable[str]) -> None:
        """Patterns that match no table now (already warned about by the caller)."""
        known = {p for p, _ in self.patterns}
        self.patterns += [(p, TableFilter(include=(p,))) for p in patterns if p not in known]

    def seen(self, events) -> None:
        if not self.patterns:
            return
        for event in events:
            key = (event.schema, event.table)
            if event.table is None or key in self._seen:
                continue
            self._seen.add(key)
            matched = [p for p, rule in self.patterns if rule.allows(*key)]
            for pattern in matched:
                self.log.info(f'include_tables pattern "{pattern}" now matches table '
                              f'{key[0]}.{key[1]}, which is streamed', pattern=pattern)
            if matched:
                self.patterns = [(p, r) for p, r in self.patterns if p not in matched]
