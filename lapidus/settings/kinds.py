"""Kinds: each checks one value and returns it normalised, or raises :class:`Invalid`.

A kind's ``doc`` is the type column of the generated documentation.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Any, Optional, Tuple

from .context import Context, resolve_path
from .messages import describe, suggest
from .names import BACKEND_TYPES


class Invalid(ValueError):
    """A value that does not fit its setting.

    ``expected`` completes "expected ..., got <value>"; the caller adds the value (or only its
    type, for secrets).  ``message`` replaces the whole sentence when the value is not the
    point (a cross-check).  ``hint`` is appended, e.g. a did-you-mean.
    """

    def __init__(self, expected: str = "", *, message: str = "", hint: str = "",
                 items: Tuple[Tuple[int, "Invalid"], ...] = ()):
        super().__init__(message or expected or "; ".join(str(e) for _, e in items))
        self.expected = expected
        self.message = message
        self.hint = hint
        # A list whose shape is right but some elements are not: ``(index, Invalid)`` for
        # each, so that each is reported under its own key path (``include_tables[2]``).
        self.items = items

    def render(self, value: Any, *, secret: bool = False, origin: str = "") -> str:
        """The sentence; ``origin`` (e.g. ``"from ${PG_PORT}"``) says where the value came
        from when the file does not show it."""
        text = self.message or f"expected {self.expected}, got {describe(value, secret=secret)}"
        if origin:
            text += f" ({origin})"
        return f"{text} ({self.hint})" if self.hint else text


class Kind:
    """Base kind: accepts anything.  ``doc`` is the type column of the documentation."""

    doc = "value"

    def check(self, value: Any, ctx: Context) -> Any:
        return value


class Str(Kind):
    doc = "string"

    def __init__(self, *, empty: bool = False):
        self.empty = empty

    def check(self, value: Any, ctx: Context) -> str:
        if not isinstance(value, str):
            raise Invalid("a string")
        if not value and not self.empty:
            raise Invalid(message="must not be empty")
        return value


class Int(Kind):
    """An integer; a string of digits is accepted too, so ``"${PORT}"`` works."""

    def __init__(self, lo: int, hi: Optional[int] = None):
        self.lo, self.hi = lo, hi
        self.doc = f"integer {lo}-{hi}" if hi is not None else f"integer >= {lo}"

    def check(self, value: Any, ctx: Context) -> int:
        number = _as_int(value)
        if number is None or number < self.lo or (self.hi is not None and number > self.hi):
            raise Invalid(self.expected)
        return number

    @property
    def expected(self) -> str:
        if self.hi is None:
            return f"an integer >= {self.lo}"
        return f"an integer from {self.lo} to {self.hi}"


class Seconds(Kind):
    """A duration in seconds (integer or decimal), returned as float."""

    def __init__(self, *, zero: bool = False):
        self.zero = zero
        self.doc = "seconds >= 0" if zero else "seconds > 0"

    def check(self, value: Any, ctx: Context) -> float:
        number = _as_float(value)
        if number is None or number < 0 or (number == 0 and not self.zero):
            bound = "at least 0" if self.zero else "greater than 0"
            raise Invalid(f"a number of seconds {bound}")
        return number


class Bool(Kind):
    doc = "true/false"

    def check(self, value: Any, ctx: Context) -> bool:
        if isinstance(value, bool):
            return value
        # Strings are accepted so a boolean can come from the environment ("${TLS}").
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise Invalid("true or false")


class Choice(Kind):
    def __init__(self, *choices: str):
        self.choices = choices
        self.doc = " / ".join(f'"{c}"' for c in choices)

    def check(self, value: Any, ctx: Context) -> str:
        if isinstance(value, str) and value in self.choices:
            return value
        near = suggest(value, self.choices) if isinstance(value, str) else None
        raise Invalid(f"one of {', '.join(self.choices)}",
                      hint=f'did you mean "{near}"?' if near else "")


class BackendType(Choice):
    _HINTS = {"postgres": "postgresql", "pg": "postgresql", "pgsql": "postgresql",
              "mariadb": "mysql", "mongodb": "mongo"}

    def __init__(self):
        super().__init__(*BACKEND_TYPES)

    def check(self, value: Any, ctx: Context) -> str:
        if isinstance(value, str) and value in self.choices:
            return value
        if not isinstance(value, str):
            raise Invalid(f"a backend type ({', '.join(self.choices)})")
        near = self._HINTS.get(value.lower()) or suggest(value, self.choices)
        raise Invalid(message=f"unknown backend type {describe(value)} "
                              f"(expected {', '.join(self.choices)})",
                      hint=f'did you mean "{near}"?' if near else "")


class PathKind(Kind):
    """A file-system path.  ``~`` is expanded and a relative path is taken relative to the
    configuration file's directory.  With ``search_path``, a bare command name (no ``/``) is
    kept as is and looked up on ``$PATH`` when used."""

    doc = "path"

    def __init__(self, *, search_path: bool = False):
        self.search_path = search_path

    def check(self, value: Any, ctx: Context) -> str:
        if not isinstance(value, str) or not value:
            raise Invalid("a path (a non-empty string)")
        if self.search_path and "/" not in value:
            return value
        return str(resolve_path(value, ctx))


class Globs(Kind):
    """A list of ``fnmatch`` table patterns.  Each element is judged on its own, so that a
    problem names the element and its index; :func:`glob_problem` says what is wrong with
    one."""

    doc = "list of globs"

    def check(self, value: Any, ctx: Context) -> Tuple[str, ...]:
        if not isinstance(value, list):
            raise Invalid('a list of table patterns such as ["sessions", "audit_*"]')
        # PostgreSQL and MySQL patterns are "table" or "schema.table"; MongoDB collection
        # names may contain dots ("db.system.profile"), so more dots are fine there.
        one_dot = ctx is not None and ctx.backend_type in ("postgresql", "mysql")
        bad = tuple((i, problem) for i, problem in
                    ((i, glob_problem(p, one_dot=one_dot)) for i, p in enumerate(value))
                    if problem)
        if bad:
            raise Invalid(items=bad)
        return tuple(value)


def glob_problem(pattern: Any, *, one_dot: bool = False) -> Optional[Invalid]:
    """What is wrong with one table pattern, or None.  fnmatch itself accepts anything (an
    unclosed ``[`` is a literal), so a typo would silently match no table.  ``one_dot``: a
    second dot is one too (``a.b.c`` for PostgreSQL or MySQL)."""
    if not isinstance(pattern, str):
        return Invalid('a table pattern (a string such as "audit_*")')
    if not pattern:
        return Invalid(message="an empty pattern matches no table; remove it")
    if _unclosed_class(pattern):
        return Invalid(message=f'{describe(pattern)}: "[" starts a character class that is '
                               f'never closed by "]"; write "[[]" for a literal "["')
    dots = pattern.count(".")
    if one_dot and dots > 1:
        return Invalid(message=f'{describe(pattern)} has {dots} dots; a pattern is "table" or '
                               f'"schema.table" (for a table whose name contains a dot, write '
                               f'"?" in place of that dot)')
    return None


def _unclosed_class(pattern: str) -> bool:
    # Follows fnmatch.translate's scan: "[!" and a "]" right after the opening bracket belong
    # to the class, so "[]]" and "[!]]" are closed classes.
    i, n = 0, len(pattern)
    while i < n:
        char, i = pattern[i], i + 1
        if char == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                return True
            i = j + 1
    return False


_SIZE_RE = re.compile(r"\s*(\d+)\s*(|b|kb|mb|gb|tb|kib|mib|gib|tib)\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class ByteSize(Kind):
    """A number of bytes: an integer, or a string with a unit ("64MiB", "1 GB")."""

    doc = 'bytes (or "64MiB")'

    def check(self, value: Any, ctx: Context) -> int:
        number: Optional[int] = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str):
            match = _SIZE_RE.fullmatch(value)
            if match:
                number = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
        if number is None or number < 1:
            raise Invalid('a positive number of bytes (an integer, or a string like "64MiB")')
        return number


class Listen(Kind):
    """``host:port`` to listen on, an IPv6 address in brackets (``[::1]:9187``).  Whether it
    can be bound is :mod:`lapidus.config.preflight`'s question."""

    doc = '"host:port"'

    def check(self, value: Any, ctx: Context) -> str:
        if isinstance(value, str):
            parts = split_listen(value)
            if parts is not None:
                return value
        raise Invalid('"host:port" such as "127.0.0.1:9187" (port 0 picks a free port)',
                      hint=_listen_hint(value))


def _listen_hint(value: Any) -> str:
    """What exactly is wrong with a refused listen address, when it can be told."""
    if not isinstance(value, str) or ":" not in value:
        return ""
    host, port = value.strip().rsplit(":", 1)
    if port.isdigit() and int(port) > 65535:
        return "a port is 0 to 65535"
    if not host:
        return "give a host: 127.0.0.1 for this machine only, 0.0.0.0 for every interface"
    if host.startswith("["):
        inner = host.strip("[]")
        if not _is_ipv6(inner):
            return f"{describe(inner)} is not an IPv6 address"
    elif ":" in host and _is_ipv6(host):
        return f"an IPv6 address goes in brackets: \"[{host}]:{port}\""
    return ""


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


class Pattern(Kind):
    """A string matching ``regex``; ``expected`` explains the rule to the user."""

    def __init__(self, regex: "re.Pattern[str]", expected: str, doc: str):
        self.regex, self.expected, self.doc = regex, expected, doc

    def check(self, value: Any, ctx: Context) -> str:
        if not isinstance(value, str) or not self.regex.fullmatch(value):
            raise Invalid(self.expected)
        return value


class MongoUri(Kind):
    doc = "connection string"

    def check(self, value: Any, ctx: Context) -> str:
        if not isinstance(value, str) or not value.startswith(("mongodb://", "mongodb+srv://")):
            raise Invalid("a connection string starting with mongodb:// or mongodb+srv://")
        return value


class Table(Kind):
    """A nested table (``[log]``); its own settings are declared in their section."""

    doc = "table"

    def check(self, value: Any, ctx: Context) -> dict:
        if not isinstance(value, dict):
            raise Invalid("a table")
        return value


class Plugins(Kind):
    """``plugin name -> options table``; the entries are checked by :mod:`lapidus.config`."""

    doc = "table of tables"

    def check(self, value: Any, ctx: Context) -> dict:
        if not isinstance(value, dict):
            raise Invalid('a table of plugins, name -> options (e.g. {"stdout": {}})')
        return value


class BackendList(Kind):
    doc = "list of tables"

    def check(self, value: Any, ctx: Context) -> list:
        if not isinstance(value, list):
            raise Invalid("a list of backend tables ([[backends]] in TOML)")
        return value


def split_listen(text: str) -> Optional[Tuple[str, int]]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port); None when malformed."""
    match = re.fullmatch(r"\s*(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})\s*", text)
    if not match or int(match.group(2)) > 65535:
        return None
    host = match.group(1)
    if host.startswith("[") and not _is_ipv6(host[1:-1]):
        return None
    return host.strip("[]"), int(match.group(2))


def _as_int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    return None


def _as_float(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None
