"""The error of configuration loading, :class:`ConfigError`: every problem found, each on its
own line naming its key path."""

from __future__ import annotations

from typing import List, Sequence


class ConfigError(Exception):
    """The configuration cannot be used.  ``problems`` holds one line per problem, each
    naming its key path; ``str()`` is those lines joined.  ``source`` names the file."""

    def __init__(self, problems: Sequence[str], source: str = ""):
        self.problems: List[str] = list(problems)
        self.source = source
        super().__init__("\n".join(self.problems))
