"""``${VAR}`` expansion in every string of the configuration (``$${`` for a literal ``${``):
the validator's first pass (see :mod:`.validate`).

With ``secrets_optional`` (``lapidus -t``, which never connects), an unset variable that is
used only in a secret (a ``password``, a ``uri``, a plugin's token or seed, the password part
of a URL) is a warning, not a problem: the operator's shell rarely holds the secrets that the
service's ``EnvironmentFile`` provides, and everything else can still be checked.
"""

from __future__ import annotations

import re
from typing import Any, List, Mapping, Optional

from .. import settings as S
from .problems import _BAD, _Problems, _join

_VAR_RE = re.compile(r"\$\$\{|\$\{(?P<name>[^}]*)(?P<close>\}?)")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The user-info part of a URL (user:password@), where a variable holds a credential.
_USERINFO_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://(?P<info>[^/@\s]*)@")

# Settings declared secret whose names is_secret_key does not recognise ("uri"): a URL,
# secret as a whole only when one variable gives all of it; otherwise its user-info is.
_SECRET_SETTINGS = frozenset(
    key for s in (*S.BACKEND_COMMON, *S.BACKEND_TYPED) if s.secret for key in (s.name, *s.aliases))


class _Expander(_Problems):
    """The validator's part that expands variables, taking their values from ``env``."""

    env: Mapping[str, str]
    secrets_optional: bool = False
    warnings: List[str]

    def expand(self, value: Any, path: str, key: Optional[str] = None) -> Any:
        """Replace ``${VAR}`` in every string (``$${`` gives a literal ``${``).  An unset
        variable becomes _BAD after reporting it.  Values are never echoed: they may be
        passwords.  ``key`` is the key holding ``value`` (list elements inherit it)."""
        if isinstance(value, Mapping):
            for dup in getattr(value, "duplicates", ()):
                self.problem(_join(path, dup), "given twice in the same object; keep one")
            return {k: self.expand(v, _join(path, k), k) for k, v in value.items()}
        if isinstance(value, list):
            return [self.expand(v, f"{path}[{i}]", key) for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        failed = False
        used: List[str] = []
        userinfo = [m.span("info") for m in _USERINFO_RE.finditer(value)]
        whole = _VAR_RE.fullmatch(value) is not None

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
            elif name in self.env:
                if name not in used:
                    used.append(name)
                return self.env[name]
            elif self.secrets_optional and (S.is_secret_key(key) or (
                    key in _SECRET_SETTINGS and whole)):
                self.unset_secret(path, name)
            elif self.secrets_optional and any(a <= match.start() < b for a, b in userinfo):
                # Only the credential inside the URL is missing: leave it empty, so that the
                # rest of the URL is still checked.
                self.unset_secret(path, name)
                return ""
            else:
                self.problem(path, f"environment variable {name} is not set")
            failed = True
            return ""

        expanded = _VAR_RE.sub(replace, value)
        if failed:
            return _BAD
        if used:
            self.origins[path] = (tuple(used), whole)
        return expanded

    def unset_secret(self, path: str, name: str) -> None:
        self.warnings.append(
            f"{path}: environment variable {name} is not set here; this secret was not "
            f"checked, and lapidus will refuse to start unless {name} is set where it runs "
            f"(the service's EnvironmentFile)")
