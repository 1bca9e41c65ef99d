"""``${VAR}`` expansion in every string of the configuration (``$${`` for a literal ``${``):
the validator's first pass (see :mod:`.validate`)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from .problems import _BAD, _Problems, _join

_VAR_RE = re.compile(r"\$\$\{|\$\{(?P<name>[^}]*)(?P<close>\}?)")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Expander(_Problems):
    """The validator's part that expands variables, taking their values from ``env``."""

    env: Mapping[str, str]

    def expand(self, value: Any, path: str) -> Any:
        """Replace ``${VAR}`` in every string (``$${`` gives a literal ``${``).  An unset
        variable becomes _BAD after reporting it.  Values are never echoed: they may be
        passwords."""
        if isinstance(value, Mapping):
            for key in getattr(value, "duplicates", ()):
                self.problem(_join(path, key), "given twice in the same object; keep one")
            return {k: self.expand(v, _join(path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.expand(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        failed = False
        used = []

        def replace(match: "re.Match[str]") -> str:
            nonlocal failed
            if match.group(0) == "$${":
                return "${"
            name = match.group("name")
            if not match.group("close"):
                self.problem(path, 'unterminated "${" (write "$${" for a literal "${")')
            elif not _VAR_NAME_RE.fullmatch(name):
                self.problem(path, 'invalid variable reference in "${...}": use letters, '
                                   'digits and "_" (write "$${" for a literal "${")')
            elif name not in self.env:
                self.problem(path, f"environment variable {name} is not set")
            else:
                if name not in used:
                    used.append(name)
                return self.env[name]
            failed = True
            return ""

        expanded = _VAR_RE.sub(replace, value)
        if failed:
            return _BAD
        if used:
            self.origins[path] = (tuple(used), _VAR_RE.fullmatch(value) is not None)
        return expanded
