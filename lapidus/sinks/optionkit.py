"""Typed option tables for sink plugins, and the checks their validators share.

Runs wherever options are validated: the supervisor, ``lapidus -t`` and the dispatcher.  Stdlib
only (no client library), so a configuration can be checked on a host without the sink's extra.

Problems are ``(key, message)`` pairs, as :meth:`lapidus.sinks.base.Sink.validate` returns them;
the configuration check prefixes the key path.  Messages never echo a value that may be secret
(URLs carry ``user:password@``): they name the key and say what is wrong.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ..settings import suggest

Problems = List[Tuple[str, str]]


@dataclass(frozen=True)
class Option:
    """One declared option.  ``kind``: str | file (a path, checked by :func:`file_problem`)
    | bool | number (seconds, > 0) | count (int >= 1) | choice (one of ``choices``) |
    headers (a table of header names to strings) | strings (a list of strings) | custom
    (any value: the plugin's validator checks it)."""

    kind: str
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
    if kind in ("str", "file"):
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
    if kind == "strings":
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return None
        return f"expected a list of strings, got {describe(value)}"
    if kind == "custom":
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


def parsed_values(options: Mapping[str, Any], declared: Mapping[str, Option], validate: Any,
                  plugin: str, seconds: Sequence[str] = ()) -> Dict[str, Any]:
    """Options as written -> every declared option's value, defaults applied (``seconds`` as
    floats), for a plugin's typed options; ValueError listing the problems.  ``validate`` is
    the plugin's, called with ``need_client=False``: a missing extra is reported by the sink
    itself when it starts."""
    problems = validate(options, need_client=False)
    if problems:
        raise ValueError(f"invalid {plugin} plugin options: " + "; ".join(
            f"{key}: {message}" if key else message for key, message in problems))
    values, _ = check(options, declared, plugin)
    values = with_defaults(values, declared)
    for key in seconds:
        values[key] = float(values[key])
    return values


def url_problem(url: str, schemes: Sequence[str], example: str) -> Optional[str]:
    """What is wrong with a server URL, without echoing it (it may hold a password)."""
    if "://" not in url:
        return (f"is not a URL: expected scheme://host:port, as {example} (is \":\" or \"//\" "
                f"missing after the scheme?)")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return f"is not a valid URL (expected {example}; is the port a number?)"
    if parts.scheme.lower() not in schemes:
        return (f'has the scheme "{parts.scheme}"; expected '
                + " or ".join(f"{s}://" for s in schemes) + f" (as {example})")
    if not parts.hostname:
        return f"has no host (expected {example})"
    return None


def redact_url(url: str) -> str:
    """``scheme://user:pw@host:port/x`` -> ``scheme://host:port``: safe for logs and messages."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable URL>"
    return f"{parts.scheme}://{host}{port}"


def file_problem(path: str) -> Optional[str]:
    if not os.path.isfile(path):
        return "no such file (give the path of an existing file)"
    if not os.access(path, os.R_OK):
        return "the file is not readable by this user"
    return None


def parse_into(cls: Any, options: Mapping[str, Any], validate: Any, plugin: str,
               seconds: Sequence[str] = ()) -> Any:
    """Options as written -> ``cls(**values)`` (JSON null meaning "the default"; ``seconds``
    as floats); ValueError listing the problems.  A missing extra is left out: the sink
    reports it itself when it starts."""
    problems = [p for p in validate(options) if p[0]]
    if problems:
        raise ValueError(f"invalid {plugin} plugin options: " + "; ".join(
            f"{key}: {message}" for key, message in problems))
    values = {k: v for k, v in options.items() if v is not None}
    for key in seconds:
        if key in values:
            values[key] = float(values[key])
    return cls(**values)


def start_without_extra(sink: str, exc: ImportError) -> str:
    """Why sink ``sink`` cannot start when its client library fails to import: the import
    error, and the ``pip install`` line of its extra (named as the sink)."""
    return (f"{sink} sink cannot start: {exc}. Fix: pip install 'lapidus[{sink}]' into "
            f"Lapidus's environment")


def missing_extra(module: str, package: str, extra: str) -> Problems:
    """The problem of a client library that is not installed, naming the extra."""
    if importlib.util.find_spec(module) is None:
        return [("", f"needs the {package} package, which is not installed "
                     f"(pip install 'lapidus[{extra}]')")]
    return []
