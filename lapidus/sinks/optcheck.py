"""Typed option tables for sink plugins: declarations, type checks, unknown keys, defaults.

Runs wherever a plugin validates or parses its options: the supervisor and ``lapidus -t``
(``Sink.validate``) and the dispatcher (the sink's constructor).  Stdlib only, so a
configuration can be checked on a host without the plugin's client library (the plugin
reports that itself, naming the extra to install).

Problems are ``(key, message)`` pairs, ``key`` relative to the plugin's table, as
:mod:`lapidus.config.plugins` expects; messages never echo a value (it may be a secret or a
URL with a password in it).  Used by the webhook and mqtt sinks; the nats sink predates it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..settings import suggest

Problems = List[Tuple[str, str]]


@dataclass(frozen=True)
class Option:
    kind: str            # str | bool | number | count | headers | choice
    default: Any
    help: str
    secret: bool = False
    choices: Tuple[Any, ...] = ()


def describe(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "a table", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def type_problem(option: Option, value: Any) -> Optional[str]:
    kind = option.kind
    if kind == "str":
        return None if isinstance(value, str) else f"expected a string, got {describe(value)}"
    if kind == "bool":
        return None if isinstance(value, bool) else \
            f"expected true or false, got {describe(value)}"
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number of seconds, got {describe(value)}"
        return None if value > 0 else f"must be greater than 0, got {value}"
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected a whole number, got {describe(value)}"
        return None if value >= 1 else f"must be at least 1, got {value}"
    if kind == "choice":
        if value in option.choices and type(value) in {type(c) for c in option.choices}:
            return None
        return "expected one of " + ", ".join(repr(c) for c in option.choices)
    if kind == "headers":
        # a None value is a secret whose variable is unset (lapidus -t): not checked
        if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and (v is None or isinstance(v, str))
                for k, v in value.items()):
            return f"expected a table of header names to string values, got {describe(value)}"
        for name, text in value.items():
            text = text or ""
            if not name or any(ch in name for ch in " :\t\r\n") or "\r" in text or "\n" in text:
                return (f'header "{name}" is not valid: a name without spaces or ":", a value '
                        f"without line breaks")
        return None
    raise AssertionError(kind)


def check(options: Mapping[str, Any], declared: Mapping[str, Option],
          plugin: str) -> Tuple[Dict[str, Any], Problems]:
    """``(values, problems)``: the options of the right type (JSON null meaning "the
    default", hence left out) and a problem for each unknown key or wrong type."""
    values: Dict[str, Any] = {}
    problems: Problems = []
    for key, value in options.items():
        if key not in declared:
            near = suggest(key, list(declared)) if isinstance(key, str) else None
            hint = f' (did you mean "{near}"?)' if near else ""
            problems.append((str(key), f"unknown option for the {plugin} plugin{hint}"))
            continue
        if value is None:
            continue
        problem = type_problem(declared[key], value)
        if problem:
            problems.append((key, problem))
            continue
        values[key] = value
    return values, problems


def with_defaults(values: Mapping[str, Any], declared: Mapping[str, Option]) -> Dict[str, Any]:
    out = {key: option.default for key, option in declared.items()}
    out.update(values)
    return out


def missing_extra(module: str, package: str, extra: str) -> Problems:
    """The problem of a client library that is not installed, naming the extra."""
    if importlib.util.find_spec(module) is None:
        return [("", f"needs the {package} package, which is not installed "
                     f"(pip install 'lapidus[{extra}]')")]
    return []
