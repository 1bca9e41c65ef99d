"""Parse PostgreSQL's array text output (``array_out``) into nested Python lists.

Runs in the PostgreSQL worker process, once per array value, for both decoders: wal2json
and pgoutput both send arrays in their text form (``{1,2,3}``).

Contract of :func:`parse_array`:

* the result is a list of ``str`` and ``None`` (an unquoted ``NULL``), nested once per
  dimension: ``{{1,2},{3,4}}`` -> ``[["1", "2"], ["3", "4"]]``; ``{}`` -> ``[]``;
* a quoted ``"NULL"`` is the four-letter string, ``""`` the empty string, and backslash escapes
  inside quotes are undone (``"x\\"y"`` -> ``x"y``);
* a dimension decoration (``[0:2]={1,2,3}``, written when a lower bound is not 1) is dropped:
  JSON arrays have no lower bounds;
* ``delimiter`` is the element type's ``typdelim``: ``,`` for every built-in type but ``box``,
  which uses ``;``;
* anything ``array_out`` cannot produce raises :class:`ValueError` naming the position.

Elements are not converted here: :mod:`lapidus.workers.postgresql.types` maps them.
"""

from __future__ import annotations

import re
from typing import Dict, List, NamedTuple, Optional, Pattern, Union

ArrayValue = List[Union[Optional[str], "ArrayValue"]]

# ``[1:2][0:1]=`` in front of the braces.  array_out writes it only for non-default bounds.
_DECORATION = re.compile(r"(?:\[[+-]?\d+:[+-]?\d+\])+=")

# array_out quotes an element when it is empty, equals NULL, or contains a quote, a
# backslash, a brace, the delimiter or white space.  Text without any of those characters
# between the outer braces is therefore a flat list of bare elements: a plain split is exact.
_SLOW_CHARS = re.compile(r'["\\{}\s]')

_UNESCAPE = re.compile(r"\\(.)", re.DOTALL)

# The inside of a quoted element, unrolled ("normal* (escape normal*)*") so that long
# strings match without backtracking.
_QUOTED = r'[^"\\]*(?:\\.[^"\\]*)*'


class _Syntax(NamedTuple):
    """The compiled patterns for arrays written with one delimiter."""

    flat: Pattern[str]      # a whole one-dimensional array as array_out writes it
    item: Pattern[str]      # one element of such an array: (quoted, bare)
    token: Pattern[str]     # one token of any array, white space around it included


def parse_array(text: str, delimiter: str = ",") -> ArrayValue:
    """Parse one array in PostgreSQL's text output form; see the module docstring."""
    body = text
    if body[:1] == "[":
        match = _DECORATION.match(body)
        if match is None:
            raise ValueError(f"malformed array {text!r}: bad dimension decoration")
        body = body[match.end():]
    if body[:1] != "{" or body[-1:] != "}":
        raise ValueError(f"malformed array {text!r}: expected {{...}}")
    inner = body[1:-1]
    if not inner:
        return []
    # Fast path: flat arrays of numbers, identifiers, dates: no quotes needed.
    if _SLOW_CHARS.search(inner) is None:
        items: ArrayValue = inner.split(delimiter)
        if "" in items:
            raise ValueError(f"malformed array {text!r}: empty unquoted element")
        if "NULL" in inner.upper():     # array_in reads an unquoted NULL in any case
            return [None if item.upper() == "NULL" else item for item in items]
        return items
    syntax = _SYNTAXES.get(delimiter) or _syntax(delimiter)
    # Flat arrays with quoted elements (text with spaces, timestamps): validated by one
    # regular expression, then split by another, both in C.
    if syntax.flat.fullmatch(body):
        return [_unescape(quoted) if not bare else None if bare.upper() == "NULL" else bare
                for quoted, bare in syntax.item.findall(body, 1, len(body) - 1)]
    return _parse_general(text, body, delimiter, syntax.token)


def _syntax(delimiter: str) -> _Syntax:
    """Compile (once per delimiter) the patterns for arrays written with ``delimiter``."""
    d = re.escape(delimiter)
    element = r'(?:"' + _QUOTED + r'"|[^"\\{}\s' + d + r']+)'
    bare_char = r'(?:[^"\\{}' + d + r']|\\.)'
    syntax = _Syntax(
        flat=re.compile(r"\{" + element + r"(?:" + d + element + r")*\}", re.DOTALL),
        item=re.compile(r'"(' + _QUOTED + r')"|([^"' + d + r"]+)", re.DOTALL),
        token=re.compile(
            r"\s*(?:(?P<open>\{)|(?P<close>\})|(?P<delim>" + d + r")"
            r'|"(?P<quoted>' + _QUOTED + r')"'
            r"|(?P<bare>(?!\s)" + bare_char + r"+))\s*",
            re.DOTALL),
    )
    _SYNTAXES[delimiter] = syntax
    return syntax


_SYNTAXES: Dict[str, _Syntax] = {}
_syntax(",")


# States of the general parser: what the previous token allows next.
_OPENED, _AFTER_ELEMENT, _AFTER_DELIM = range(3)


def _parse_general(text: str, body: str, delimiter: str, token: Pattern[str]) -> ArrayValue:
    """Token-by-token parse of nested arrays, or arrays with white space around elements."""
    skip = len(text) - len(body)        # positions in messages count from the start of text
    root: ArrayValue = []
    stack: List[ArrayValue] = []
    state = _AFTER_DELIM
    pos, end = 0, len(body)
    while pos < end:
        match = token.match(body, pos)
        if match is None:
            raise ValueError(f"malformed array {text!r}: unexpected character at {pos + skip}")
        kind = match.lastgroup
        if kind == "open":
            if state == _AFTER_ELEMENT:
                raise ValueError(f"malformed array {text!r}: unexpected '{{' at {pos + skip}")
            child: ArrayValue = []
            if stack:
                _append(text, stack[-1], child, pos + skip)
            else:
                root = child
            stack.append(child)
            state = _OPENED
        elif kind == "close":
            if not stack or state == _AFTER_DELIM:
                raise ValueError(f"malformed array {text!r}: unexpected '}}' at {pos + skip}")
            stack.pop()
            state = _AFTER_ELEMENT
            if not stack and match.end() != end:
                raise ValueError(f"malformed array {text!r}: text after the closing brace")
        elif kind == "delim":
            if state != _AFTER_ELEMENT or not stack:
                raise ValueError(
                    f"malformed array {text!r}: unexpected {delimiter!r} at {pos + skip}")
            state = _AFTER_DELIM
        else:
            if state == _AFTER_ELEMENT or not stack:
                raise ValueError(f"malformed array {text!r}: unexpected element at {pos + skip}")
            raw = match.group(kind)
            if kind == "bare":
                # array_in drops white space around unquoted elements; the token includes
                # trailing white space, so strip it (array_out never writes any).
                raw = raw.rstrip()
                value: Optional[str] = None if raw.upper() == "NULL" else _unescape(raw)
            else:
                value = _unescape(raw)
            _append(text, stack[-1], value, pos + skip)
            state = _AFTER_ELEMENT
        pos = match.end()
    if stack:
        raise ValueError(f"malformed array {text!r}: unterminated")
    return root


def _append(text: str, target: ArrayValue, item, pos: int) -> None:
    """Append keeping the array rectangular in kind: all sub-arrays or all elements."""
    if target and (type(target[0]) is list) != (type(item) is list):
        raise ValueError(f"malformed array {text!r}: mixed elements and sub-arrays at {pos}")
    target.append(item)


def _unescape(raw: str) -> str:
    return _UNESCAPE.sub(r"\1", raw) if "\\" in raw else raw
